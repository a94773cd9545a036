#!/usr/bin/env bash
# Prefix caching benchmark: R requests sharing a long prompt prefix, against
# the server on the default model with and without prefix caching; prints
# bench/serve_load.py prefix's JSON for each.
# Usage: bench/serve_prefix.sh [REQUESTS] [SHARED_TOKENS] [extra quire serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
reqs="${1:-32}"; shift || true
shared="${1:-1000}"; shift || true
. bench/serve_common.sh
client=("$py" bench/serve_load.py prefix --requests "$reqs" --shared-tokens "$shared")
with_server "prefix caching" "${client[@]}" -- --kv-tokens 16384 "$@"
with_server "no prefix caching" "${client[@]}" -- --kv-tokens 16384 --no-prefix-cache "$@"
