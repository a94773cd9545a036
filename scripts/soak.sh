#!/usr/bin/env bash
# Soak test (not in CI): `scripts/soak.sh [minutes] [soak.py options]` runs
# mixed load with disconnects against `quire serve` on the default model for
# that long (default 30), then checks that KV blocks are back to 0 and that
# resident memory grew by less than 5%. Builds the release binary first.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-30}
shift || true
cargo build --release --bin quire
exec python3 scripts/soak.py --quire target/release/quire --minutes "$minutes" "$@"
