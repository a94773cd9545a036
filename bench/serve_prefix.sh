#!/usr/bin/env bash
# Prefix caching benchmark: R requests sharing a long prompt prefix, against
# the server on the default model with and without prefix caching; prints
# bench/serve_load.py prefix's JSON for each.
# Usage: bench/serve_prefix.sh [REQUESTS] [SHARED_TOKENS] [extra quire serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
reqs="${1:-32}"; shift || true
shared="${1:-1000}"; shift || true
bin=./target/release/quire
[ -x "$bin" ] || cargo build --release --bins
py="${QUIRE_PYTHON:-python3}"
run() {
  local label="$1"; shift
  local log; log=$(mktemp)
  "$bin" serve --port 0 --kv-tokens 16384 "$@" 2>"$log" &
  local pid=$!
  local url=""
  for _ in $(seq 1 600); do
    url=$(grep -o 'http://[0-9.:]*' "$log" | head -n 1 || true)
    [ -n "$url" ] && break
    sleep 0.2
  done
  [ -n "$url" ] || { echo "server did not start: $(cat "$log")" >&2; kill "$pid"; exit 1; }
  echo -n "$label: "
  "$py" bench/serve_load.py prefix --url "$url" --requests "$reqs" --shared-tokens "$shared"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -f "$log"
}
run "prefix caching" "$@"
run "no prefix caching" --no-prefix-cache "$@"
