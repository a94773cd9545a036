#!/usr/bin/env bash
# Creates the Python environment the test suite uses for reference checks:
# the `gguf` package (dequantization reference), torch + transformers
# (Hugging Face logits reference) and numpy, and nvidia-cuda-nvrtc (libnvrtc:
# tests/cuda_nvrtc.rs compiles every CUDA kernel without a GPU). Idempotent;
# prints the interpreter path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${QUIRE_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
has_nvrtc() { compgen -G "$venv/lib/python*/site-packages/nvidia/cu13/lib/libnvrtc.so.13" >/dev/null; }
if ! "$venv/bin/python" -c "import gguf, numpy, torch, transformers, openai" >/dev/null 2>&1 || ! has_nvrtc; then
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q "gguf>=0.17" numpy torch "transformers>=4.51" openai "nvidia-cuda-nvrtc==13.0.88" >&2
fi
"$venv/bin/python" -c "import gguf, numpy, torch, transformers" >&2
echo "$venv/bin/python"
