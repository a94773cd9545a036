#!/usr/bin/env bash
# Where a batch-1 decode step's time goes, per kernel, in one call on the
# GPU machine (Nsight Compute reads counters on its Firecracker machines;
# nsys does not run there). For each model: `quire bench` for the step's
# wall time (greedy tg@depth), then the same decode under `ncu` (every
# kernel, graph nodes included, serialized, clocks and caches left alone),
# summarized by scripts/ncu-step.py: per kernel name the launches, time,
# DRAM bytes and rate of the last complete step, and how much of the wall
# time the kernels' own durations cover (the rest: launches, graph edges,
# waits between kernels).
#
#   QUIRE=./.devbin/quire scripts/gpu-profile.sh
#
# Env: OUT (default ./gpu-profile-out), PROFILE_MODELS (name:shape:type
# entries, default the four decode rows of issue 5), MODE (fast), DEPTH
# (512), COPY_BW (3.01 TB/s, the H100s here), NCU (ncu), EXTRA_ENV
# (environment for both runs, e.g. "QUIRE_CUDA_DEFINES=MQ_TMA=0"; a tuning
# setting goes in as PROFILE_ARGS="--tune runtime.pdl=false"), PROFILE_QUICK=1 (the
# SmolLM2 shape only, 8-token depth: a dry run of the script).
set -uo pipefail
QUIRE="${QUIRE:-./target/release/quire}"
OUT="${OUT:-./gpu-profile-out}"
MODE="${MODE:-fast}"
DEPTH="${DEPTH:-512}"
COPY_BW="${COPY_BW:-3.01}"
NCU="${NCU:-ncu}"
here=$(cd "$(dirname "$0")" && pwd)
tmp="${TMPDIR:-/tmp}/quire-gpu-goals" # shared with gpu-goals.sh: synth once
mkdir -p "$OUT" "$tmp"
models=(${PROFILE_MODELS:-smollm2-q4_0:SmolLM2-135M:Q4_0 llama1b-q4_0:Llama-3.2-1B:Q4_0 llama8b-q4_0:Llama-3.1-8B:Q4_0 llama8b-q8_0:Llama-3.1-8B:Q8_0})
[ "${PROFILE_QUICK:-0}" = 1 ] && models=(smollm2-q4_0:SmolLM2-135M:Q4_0) && DEPTH=8
read -r -a extra <<<"${EXTRA_ENV:-}"
status=0
summary="$OUT/summary.md"
echo "gpu-profile: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1) mode=$MODE depth=$DEPTH ${EXTRA_ENV:-}" >"$summary"

for m in "${models[@]}"; do
  IFS=: read -r name shape ty <<<"$m"
  f="$tmp/$name.gguf"
  if [ ! -f "$f" ] && ! "$QUIRE" synth --shape "$shape" --type "$ty" -o "$f" >"$OUT/synth-$name.log" 2>&1; then
    echo "synth of $name failed: $(tail -1 "$OUT/synth-$name.log")" | tee -a "$summary"
    status=1
    continue
  fi
  # shellcheck disable=SC2206 # PROFILE_ARGS: quire flags, split on spaces
  bench=(bench -m "$f" --gpu required --mode "$MODE" -p 0 --depth "$DEPTH" --greedy --json ${PROFILE_ARGS:-})
  # The step's wall time: tokens/s of the greedy decode after DEPTH tokens.
  if ! env "${extra[@]}" "$QUIRE" "${bench[@]}" -g 128 -r 2 >"$OUT/$name-bench.log" 2>&1; then
    echo "quire bench $name failed: $(tail -1 "$OUT/$name-bench.log")" | tee -a "$summary"
    status=1
    continue
  fi
  tps=$(grep '^{' "$OUT/$name-bench.log" | tail -1 | python3 -c "import json,sys; r=json.load(sys.stdin)['results']; print(next(v['tps'] for k, v in r.items() if '@d' in k))")
  step_us=$(python3 -c "print(1e6 / $tps)")
  # A few steps under ncu; the summary takes the last complete one.
  if ! env "${extra[@]}" "$NCU" --clock-control none --cache-control none --graph-profiling node \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --page raw --print-units base \
    "$QUIRE" "${bench[@]}" -g 4 -r 1 >"$OUT/$name-ncu.csv" 2>"$OUT/$name-ncu.err"; then
    echo "ncu $name failed: $(tail -1 "$OUT/$name-ncu.err")" | tee -a "$summary"
    status=1
    continue
  fi
  {
    echo
    echo "## $name ($shape $ty), tg@d$DEPTH greedy $tps tok/s"
    echo
    python3 "$here/ncu-step.py" "$OUT/$name-ncu.csv" --step-us "$step_us" --bw "$COPY_BW" --model-bytes "$(stat -c %s "$f")"
  } >>"$summary" 2>&1 || status=1
done
echo "gpu-profile: $([ $status -eq 0 ] && echo done || echo FAILURES)" >>"$summary"
cat "$summary"
exit $status
