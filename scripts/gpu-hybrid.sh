#!/usr/bin/env bash
# Hybrid (qwen35, Gated DeltaNet) benchmarks in one call on the GPU machine,
# side by side with llama.cpp on the same files: `quire synth` GGUFs of the
# Qwen3.5 shapes; per model tg128 after a 512-token prompt, pp512 and pp2048
# (512-token chunks) in `fast`, the same decode in `deterministic`, decode
# with the KV blocks scattered against in order; on Q4_0 files batched
# decode at 8/32/64 sequences (128-token prompts). Peers only where given:
# llama-bench and llama-batched-bench binaries built for the device
# (comparison only: this project never carries llama.cpp's sources or a
# recipe that builds them), run right after Quire's runs of each model.
#
#   QUIRE=./.devbin/quire LLAMA_BENCH=... LLAMA_BATCHED=... scripts/gpu-hybrid.sh
#
# Env: OUT (default ./gpu-hybrid-out: results.jsonl, summary.txt, logs),
# MODELS (default "Qwen3.5-2B:Q4_0 Qwen3.5-2B:Q8_0 Qwen3.5-9B:Q4_0
# Qwen3.5-9B:Q8_0"), REPS (default 2), SKIP_SYNTH=1 (files already in
# $TMPDIR/quire-gpu-hybrid), QUICK=1 (short runs: a dry run of the script).
set -uo pipefail
QUIRE="${QUIRE:-./target/release/quire}"
OUT="${OUT:-./gpu-hybrid-out}"
REPS="${REPS:-2}"
MODELS="${MODELS:-Qwen3.5-2B:Q4_0 Qwen3.5-2B:Q8_0 Qwen3.5-9B:Q4_0 Qwen3.5-9B:Q8_0}"
tmp="${TMPDIR:-/tmp}/quire-gpu-hybrid"
mkdir -p "$OUT" "$tmp"
res="$OUT/results.jsonl"
sum="$OUT/summary.txt"
status=0
P1=512 P2=2048 G=128 D=512 BATCH=8,32,64 BP=128
if [ "${QUICK:-0}" = 1 ]; then P1=32 P2=64 G=8 D=16 BATCH=2,3 BP=8 REPS=1; fi
echo "gpu-hybrid: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" | tee -a "$sum"

name_of() { echo "$1" | tr ':.' '--' | tr 'A-Z' 'a-z'; }
if [ "${SKIP_SYNTH:-0}" != 1 ]; then
  for m in $MODELS; do
    n=$(name_of "$m")
    [ -f "$tmp/$n.gguf" ] || "$QUIRE" synth --shape "${m%:*}" --type "${m#*:}" -o "$tmp/$n.gguf" >"$OUT/synth-$n.log" 2>&1 &
  done
  wait
fi

# One `quire bench --json` run: {"model", "label", "bytes", "quire": {...}}.
qbench() {
  local n=$1 label=$2
  shift 2
  local log="$OUT/$n-$label.log"
  if "$QUIRE" bench -m "$tmp/$n.gguf" --gpu required --json "$@" >"$log" 2>&1; then
    printf '{"model":"%s","label":"%s","bytes":%s,"quire":%s}\n' "$n" "$label" \
      "$(stat -c %s "$tmp/$n.gguf")" "$(grep '^{' "$log" | tail -1)" >>"$res"
    echo "$n $label: $(grep -E 'tok/s' "$log" | tr -s ' ' | tr '\n' ';')" | tee -a "$sum"
  else
    echo "quire bench $n $label failed: $(tail -2 "$log" | tr '\n' ' ')" | tee -a "$sum"
    status=1
  fi
}

for m in $MODELS; do
  n=$(name_of "$m")
  [ -f "$tmp/$n.gguf" ] || { echo "no $n.gguf: $(tail -1 "$OUT/synth-$n.log" 2>/dev/null)" | tee -a "$sum"; status=1; continue; }
  qbench "$n" fast --mode fast -r "$REPS" --ubatch 512 -p "$P1" -g "$G" --depth "$D"
  qbench "$n" fast-p2 --mode fast -r "$REPS" --ubatch 512 -p "$P2" -g 0
  qbench "$n" det --mode deterministic -r "$REPS" -p 0 -g "$G" --depth "$D"
  qbench "$n" scattered --mode fast -r "$REPS" -p 0 -g "$G" --depth "$D" --kv-layout scattered
  qbench "$n" in-order --mode fast -r "$REPS" -p 0 -g "$G" --depth "$D" --kv-layout in-order
  if [[ "$m" == *Q4_0 ]]; then
    qbench "$n" batched --mode fast -r 1 -p 0 -g "$G" --batch "$BATCH" --batch-prompt "$BP" --kv-tokens 20000
    qbench "$n" batched-det --mode deterministic -r 1 -p 0 -g "$G" --batch "$BATCH" --batch-prompt "$BP" --kv-tokens 20000
  fi
  if [ -n "${LLAMA_BENCH:-}" ]; then
    if "$LLAMA_BENCH" -m "$tmp/$n.gguf" -p "$P1,$P2" -n "$G" -d "0,$D" -fa 1 -ngl 99 -r 2 -o json \
      >"$OUT/$n-llama.json" 2>"$OUT/$n-llama.err"; then
      printf '{"model":"%s","label":"llama","llama":%s}\n' "$n" "$(tr -d '\n' <"$OUT/$n-llama.json")" >>"$res"
      python3 - "$OUT/$n-llama.json" "$n" <<'EOF' | tee -a "$sum"
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"{sys.argv[2]} llama-bench p{r['n_prompt']} g{r['n_gen']} d{r.get('n_depth', 0)}: {r['avg_ts']:.1f} tok/s")
EOF
    else
      echo "llama-bench $n failed: $(tail -1 "$OUT/$n-llama.err")" | tee -a "$sum"
      status=1
    fi
  fi
  if [ -n "${LLAMA_BATCHED:-}" ] && [[ "$m" == *Q4_0 ]]; then
    if "$LLAMA_BATCHED" -m "$tmp/$n.gguf" -npp "$BP" -ntg "$G" -npl "1,$BATCH" -fa on -ngl 99 -c 40000 \
      >"$OUT/$n-batched.log" 2>&1; then
      grep -E '^\|' "$OUT/$n-batched.log" | sed "s/^/$n batched-bench /" | tee -a "$sum"
    else
      echo "llama-batched-bench $n failed: $(tail -1 "$OUT/$n-batched.log")" | tee -a "$sum"
      status=1
    fi
  fi
done
echo "gpu-hybrid: done, status $status" | tee -a "$sum"
exit $status
