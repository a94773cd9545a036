#!/usr/bin/env bash
# Creates the Python environment the test suite uses for reference checks:
# the `gguf` package (dequantization reference), torch + transformers
# (Hugging Face logits reference) and numpy, openai and jsonschema (the
# end-to-end API suites), and nvidia-cuda-nvrtc (libnvrtc:
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
if ! "$venv/bin/python" -c "import gguf, numpy, torch, transformers, openai, jsonschema" >/dev/null 2>&1 || ! has_nvrtc; then
  # pip unpacks each wheel (torch's is about 500 MB) under $TMPDIR and has
  # been seen to leave those folders behind; repeated runs filled the disk.
  # A private TMPDIR removed on exit keeps every run's scratch out of /tmp.
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/quire-pip.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  TMPDIR="$scratch" "$venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip >&2
  TMPDIR="$scratch" "$venv/bin/python" -m pip install -q --no-cache-dir "gguf>=0.17" numpy torch "transformers>=4.51" openai jsonschema "nvidia-cuda-nvrtc==13.0.88" >&2
fi
"$venv/bin/python" -c "import gguf, numpy, torch, transformers" >&2
echo "$venv/bin/python"
