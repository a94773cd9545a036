#!/usr/bin/env bash
# Serving side by side: `quire serve` and (given its binary) llama-server on
# the same GGUF file, one after the other on the same machine, each measured
# by `bench/serve_load.py sweep` (concurrency levels of streaming clients,
# prompts of exact token counts, TTFT / ITL p50 and p99, generated tok/s).
#
#   bench/serve_vs.sh MODEL.gguf [options] [-- extra quire serve flags]
#     --quire PATH          quire binary (default ./target/release/quire)
#     --llama-server PATH   also measure this llama-server (built elsewhere)
#     --levels 1,16,64      concurrency levels
#     --prompt-tokens 512   --max-tokens 128   --requests 1 (per client)
#     --mode fast           quire's --mode
#     --gpu required        quire's --gpu (off: the CPU, to try the script)
#     --out DIR             server logs and the JSON rows (default: a temp dir)
#
# Quire runs with --gpu required (unless --gpu says otherwise); llama-server with every layer on the GPU,
# flash attention, one slot per client of the largest level and a context
# that holds them all. Prints one JSON row per (server, level).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,18p' "$0"; exit 2; }
model="$1"; shift
quire=./target/release/quire llama="" levels=1,16,64 prompt=512 gen=128 requests=1 mode=fast gpu=required out=""
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quire) quire="$2"; shift 2 ;;
    --llama-server) llama="$2"; shift 2 ;;
    --levels) levels="$2"; shift 2 ;;
    --prompt-tokens) prompt="$2"; shift 2 ;;
    --max-tokens) gen="$2"; shift 2 ;;
    --requests) requests="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --gpu) gpu="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -f "$model" ] || { echo "no model file $model" >&2; exit 2; }
out="${out:-$(mktemp -d)}"
mkdir -p "$out"
py="${QUIRE_PYTHON:-python3}"
maxc=$(echo "$levels" | tr ',' '\n' | sort -n | tail -n 1)
sweep() {
  "$py" bench/serve_load.py sweep --url "$1" --label "$2" --concurrency "$levels" \
    --prompt-tokens "$prompt" --max-tokens "$gen" --requests "$requests" | tee -a "$out/rows.jsonl"
}
# wait_for URL PID: until URL/health answers 200 (false if PID exits).
wait_for() {
  local url="$1" pid="$2"
  for _ in $(seq 1 1200); do
    if curl -sf "$url/health" >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.25
  done
  return 1
}

# Quire: port 0, the bound address read from its log.
t0=$(date +%s%N)
"$quire" serve --model "$model" --gpu "$gpu" --mode "$mode" --port 0 \
  --max-running "$maxc" "${extra[@]}" 2>"$out/quire.log" &
qpid=$!
url=""
for _ in $(seq 1 2400); do
  url=$(grep -o 'http://[0-9.:]*' "$out/quire.log" | head -n 1 || true)
  [ -n "$url" ] && break
  kill -0 "$qpid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$url" ] || { echo "quire did not start:" >&2; cat "$out/quire.log" >&2; exit 1; }
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "{\"label\": \"quire\", \"start_to_listening_ms\": $ms}" | tee -a "$out/rows.jsonl"
sweep "$url" quire
curl -s "$url/metrics" | grep -E '^quire_(steps_by_path|graph_capture)' > "$out/quire-metrics.txt" || true
cat "$out/quire-metrics.txt"
kill "$qpid"; wait "$qpid" 2>/dev/null || true

if [ -n "$llama" ]; then
  port=$((20000 + RANDOM % 20000))
  ctx=$((maxc * (prompt + gen + 64)))
  "$llama" -m "$model" --host 127.0.0.1 --port "$port" -ngl 999 -fa on -np "$maxc" -c "$ctx" \
    >"$out/llama-server.log" 2>&1 &
  lpid=$!
  wait_for "http://127.0.0.1:$port" "$lpid" || { echo "llama-server did not start" >&2; tail "$out/llama-server.log" >&2; exit 1; }
  sweep "http://127.0.0.1:$port" llama-server
  kill "$lpid"; wait "$lpid" 2>/dev/null || true
fi
echo "rows in $out/rows.jsonl"
