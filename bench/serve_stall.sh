#!/usr/bin/env bash
# Stall test: 8 decoding streams, then a long prompt arrives. Runs the server
# twice on the default model: decode-first chunked prefill (T=256, prefill
# budget max(32, T - D)) and one-shot prefill (T = 8192: the whole prompt in
# one step), and prints bench/serve_load.py stall's JSON for each.
# Usage: bench/serve_stall.sh [PROMPT_TOKENS] [extra quire serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-6000}"; shift || true
bin=./target/release/quire
[ -x "$bin" ] || cargo build --release --bins
py="${QUIRE_PYTHON:-python3}"
run() {
  local label="$1"; shift
  local log; log=$(mktemp)
  "$bin" serve --port 0 "$@" 2>"$log" &
  local pid=$!
  local url=""
  for _ in $(seq 1 600); do
    url=$(grep -o 'http://[0-9.:]*' "$log" | head -n 1 || true)
    [ -n "$url" ] && break
    sleep 0.2
  done
  [ -n "$url" ] || { echo "server did not start: $(cat "$log")" >&2; kill "$pid"; exit 1; }
  echo -n "$label: "
  "$py" bench/serve_load.py stall --url "$url" --prompt-tokens "$n"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -f "$log"
}
run "decode-first T=256" --max-batch-tokens 256 --min-prefill-tokens 32 "$@"
run "one-shot T=8192" --max-batch-tokens 8192 --min-prefill-tokens 8192 "$@"
