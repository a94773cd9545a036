#!/usr/bin/env bash
# Stall test: 8 decoding streams, then a long prompt arrives. Runs the server
# twice on the default model: decode-first chunked prefill (T=256, prefill
# budget max(32, T - D)) and one-shot prefill (T = 8192: the whole prompt in
# one step), and prints bench/serve_load.py stall's JSON for each.
# Usage: bench/serve_stall.sh [PROMPT_TOKENS] [extra quire serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-6000}"; shift || true
. bench/serve_common.sh
with_server "decode-first T=256" "$py" bench/serve_load.py stall --prompt-tokens "$n" \
  -- --max-batch-tokens 256 --min-prefill-tokens 32 "$@"
with_server "one-shot T=8192" "$py" bench/serve_load.py stall --prompt-tokens "$n" \
  -- --max-batch-tokens 8192 --min-prefill-tokens 8192 "$@"
