#!/usr/bin/env bash
# Issue 5's benchmark matrix in one call on the GPU machine (device time is
# scarce: every goal of the table in docs/PERF.md, "where the issue-5 goals
# stand", measured by one command), with a summary of the ratios.
#
#   QUIRE=./.devbin/quire scripts/gpu-goals.sh
#   QUIRE=... LLAMA_BENCH=/path/llama-bench LLAMA_BATCHED=/path/llama-batched-bench scripts/gpu-goals.sh
#
# Quire side: `quire synth` GGUFs of SmolLM2-135M Q4_0, Llama-3.2-1B Q4_0
# and Llama-3.1-8B Q4_0 / Q8_0 / F16; per model pp512, pp2048 (512-token
# chunks), tg128 and tg128@d512 in `fast` mode; on the 8B Q4_0 batched
# decode at 8/32/64 sequences (128-token prompts), the same prefill and
# decode with the KV blocks scattered against in order; on the 8B Q4_0 and
# Q8_0 `exact` decode. Peers, only where given: an llama-bench and an
# llama-batched-bench binary built for the device (comparison only: this
# project never carries llama.cpp's sources or a recipe that builds them),
# run on the same files right after Quire's runs of each model.
#
# Env: OUT (default ./gpu-goals-out: results.jsonl, summary.md, logs),
# GOALS_AB (quire flags, e.g. "--tune matmul.mv_prefetch_mb=16": every model's
# decode also runs with them, alternating with the default, twice each),
# GOALS_AB_GREEDY=1 (those A/B runs with `--greedy`: tokens chosen on the
# device, the greedy graphs' path; without it every step feeds a token and
# copies the logits out, as llama-bench does, and never replays a greedy
# graph, so a change to the greedy chain needs it),
# GOALS_MODELS (a subset of the rows, below), COPY_BW (the device's measured copy bandwidth, TB/s, read + write; 3.01
# on the H100s here), REPS (default 3), GOALS_QUICK=1 (a dry run of this
# script: every model the SmolLM2 shape, short runs; with GOALS_GPU=off it
# runs on the cpu of a machine without a GPU), GOALS_FLASHINFER=1 (the
# paged decode attention alone: `quire bench-attn`, FlashInfer's
# scripts/flashinfer-decode-bench.py, bench-attn again, on Llama-3.1-8B
# heads; torch and flashinfer-python must import, e.g. from carried wheels
# on PYTHONPATH).
set -uo pipefail
QUIRE="${QUIRE:-./target/release/quire}"
OUT="${OUT:-./gpu-goals-out}"
COPY_BW="${COPY_BW:-3.01}"
REPS="${REPS:-3}"
GPU="${GOALS_GPU:-required}"
tmp="${TMPDIR:-/tmp}/quire-gpu-goals"
mkdir -p "$OUT" "$tmp"
res="$OUT/results.jsonl"
: >"$res"
status=0

# name shape type
models=(
  "smollm2-q4_0 SmolLM2-135M Q4_0"
  "llama1b-q4_0 Llama-3.2-1B Q4_0"
  "llama8b-q4_0 Llama-3.1-8B Q4_0"
  "llama8b-q8_0 Llama-3.1-8B Q8_0"
  "llama8b-f16 Llama-3.1-8B F16"
)
P1=512 P2=2048 G=128 D=512 BATCH=8,32,64 KV=20000
if [ "${GOALS_QUICK:-0}" = 1 ]; then
  models=(
    "smollm2-q4_0 SmolLM2-135M Q4_0"
    "llama1b-q4_0 SmolLM2-135M Q4_0"
    "llama8b-q4_0 SmolLM2-135M Q4_0"
    "llama8b-q8_0 SmolLM2-135M Q8_0"
    "llama8b-f16 SmolLM2-135M F16"
  )
  P1=32 P2=64 G=8 D=16 BATCH=2,3 KV=1024 REPS=1
fi

# GOALS_MODELS (names, e.g. "smollm2-q4_0 llama8b-q4_0"): only these rows,
# so the matrix can be split over calls of the device's 10-minute limit.
if [ -n "${GOALS_MODELS:-}" ]; then
  keep=()
  for m in "${models[@]}"; do
    read -r name _ <<<"$m"
    [[ " $GOALS_MODELS " == *" $name "* ]] && keep+=("$m")
  done
  models=("${keep[@]}")
fi

echo "gpu-goals: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1) copy_bw=$COPY_BW TB/s" >"$OUT/summary.md"

# The synth runs in parallel (disk-bound: about 70 s for the three 8B files).
for m in "${models[@]}"; do
  read -r name shape ty <<<"$m"
  [ -f "$tmp/$name.gguf" ] || "$QUIRE" synth --shape "$shape" --type "$ty" -o "$tmp/$name.gguf" >"$OUT/synth-$name.log" 2>&1 &
done
wait
for m in "${models[@]}"; do
  read -r name _ <<<"$m"
  [ -f "$tmp/$name.gguf" ] || { echo "synth of $name failed: $(tail -1 "$OUT/synth-$name.log")"; status=1; }
done

# One `quire bench --json` run, recorded as {"model", "label", "bytes",
# "quire": {...}}; AB_FLAGS (quire flags) apply to this run only.
AB_FLAGS=()
qbench() {
  local name=$1 label=$2
  shift 2
  local log="$OUT/$name-$label.log" bytes
  bytes=$(stat -c %s "$tmp/$name.gguf")
  if "$QUIRE" bench -m "$tmp/$name.gguf" --gpu "$GPU" --json "$@" ${AB_FLAGS[@]+"${AB_FLAGS[@]}"} >"$log" 2>&1; then
    printf '{"model":"%s","label":"%s","bytes":%s,"quire":%s}\n' "$name" "$label" "$bytes" "$(grep '^{' "$log" | tail -1)" >>"$res"
  else
    echo "quire bench $name $label failed: $(tail -1 "$log")"
    status=1
  fi
}

# llama-bench on the same file: {"model", "label": "llama", "llama": [rows]}.
lbench() {
  local name=$1
  [ -n "${LLAMA_BENCH:-}" ] || return 0
  local log="$OUT/$name-llama.json"
  if "$LLAMA_BENCH" -m "$tmp/$name.gguf" -p "$P1,$P2" -n "$G" -d "0,$D" -fa 1 -ngl 99 -r 2 -o json >"$log" 2>"$OUT/$name-llama.err"; then
    printf '{"model":"%s","label":"llama","llama":%s}\n' "$name" "$(tr -d '\n' <"$log")" >>"$res"
  else
    echo "llama-bench $name failed: $(tail -1 "$OUT/$name-llama.err")"
    status=1
  fi
}

fast=(--mode fast -r "$REPS" --ubatch 512)
for m in "${models[@]}"; do
  read -r name _ <<<"$m"
  [ -f "$tmp/$name.gguf" ] || continue
  qbench "$name" fast "${fast[@]}" -p "$P1" -g "$G" --depth "$D"
  qbench "$name" fast-p2 "${fast[@]}" -p "$P2" -g 0
  if [ -n "${GOALS_AB:-}" ]; then
    ab_flags=()
    [ "${GOALS_AB_GREEDY:-0}" = 1 ] && ab_flags=(--greedy)
    for i in 1 2; do
      qbench "$name" ab-off-$i "${fast[@]}" ${ab_flags[@]+"${ab_flags[@]}"} -p 0 -g "$G" --depth "$D"
      read -r -a AB_FLAGS <<<"$GOALS_AB"
      qbench "$name" ab-on-$i "${fast[@]}" ${ab_flags[@]+"${ab_flags[@]}"} -p 0 -g "$G" --depth "$D"
      AB_FLAGS=()
    done
  fi
  lbench "$name"
  case $name in
    llama8b-q4_0)
      qbench "$name" batched "${fast[@]}" -p 0 -g "$G" --batch "$BATCH" --batch-prompt "$G" --kv-tokens "$KV"
      # In order and scattered back to back, twice, for the paged-vs-contiguous ratio.
      for i in 1 2; do
        qbench "$name" in-order-$i "${fast[@]}" -p "$P1" -g "$G" --depth "$D" --kv-layout in-order
        qbench "$name" scattered-$i "${fast[@]}" -p "$P1" -g "$G" --depth "$D" --kv-layout scattered
      done
      if [ -n "${LLAMA_BATCHED:-}" ]; then
        "$LLAMA_BATCHED" -m "$tmp/$name.gguf" -npp "$G" -ntg "$G" -npl "$BATCH" -fa on -ngl 99 >"$OUT/$name-llama-batched.log" 2>&1 ||
          { echo "llama-batched-bench failed"; status=1; }
      fi
      ;;
  esac
  case $name in
    llama8b-q4_0 | llama8b-q8_0)
      # Against the same model's fast tg above (one call, one machine).
      qbench "$name" exact --mode exact -r "$REPS" -p 0 -g "$G"
      ;;
  esac
done

if [ "${GOALS_FLASHINFER:-0}" = 1 ]; then
  ab=(--batch 1,8,32,64 --ctx 512,2048,8192)
  "$QUIRE" bench-attn --mode fast "${ab[@]}" --json >"$OUT/attn-quire-1.jsonl" 2>"$OUT/attn-quire-1.err" || { echo "bench-attn failed"; status=1; }
  python3 scripts/flashinfer-decode-bench.py "${ab[@]}" >"$OUT/attn-flashinfer.md" 2>"$OUT/attn-flashinfer.err" || { echo "flashinfer-decode-bench failed: $(tail -1 "$OUT/attn-flashinfer.err")"; status=1; }
  "$QUIRE" bench-attn --mode fast "${ab[@]}" --json >"$OUT/attn-quire-2.jsonl" 2>"$OUT/attn-quire-2.err" || { echo "bench-attn failed"; status=1; }
fi

python3 - "$res" "$OUT" "$COPY_BW" "$P1" "$P2" "$G" "$D" "$BATCH" "${GOALS_AB:-}" >>"$OUT/summary.md" <<'PY' || status=1
import json, os, re, sys

res, out, bw, p1, p2, g, d, batch, ab = sys.argv[1:]
bw = float(bw) * 1e12
runs = [json.loads(l) for l in open(res) if l.strip()]


def q(model, label, key):
    for r in runs:
        if r["model"] == model and r["label"] == label:
            v = r["quire"]["results"].get(key)
            return v["tps"] if v else None
    return None


def size(model):
    return next((r["bytes"] for r in runs if r["model"] == model), None)


def llama(model, n_prompt, n_gen, depth=0):
    for r in runs:
        if r["model"] == model and r["label"] == "llama":
            for row in r["llama"]:
                if (row.get("n_prompt"), row.get("n_gen"), row.get("n_depth", 0)) == (n_prompt, n_gen, depth):
                    return row.get("avg_ts")
    return None


def ratio(a, b):
    return f"{a / b:.3f}" if a and b else "-"


def num(v):
    return f"{v:,.1f}" if v else "-"


models = sorted({r["model"] for r in runs}, key=lambda m: [r["model"] for r in runs].index(m))
pp1, pp2, tg, tgd = f"pp{p1}", f"pp{p2}", f"tg{g}", f"tg{g}@d{d}"
print(f"\n## Quire (fast) and llama.cpp, tokens/s\n")
print(f"| model | {pp1} Q / L | ratio | {pp2} Q / L | ratio | {tg} Q / L | ratio | {tgd} Q / L | ratio | {tg} share of copy BW |")
print("|---|---|---|---|---|---|---|---|---|---|")
for m in models:
    a, b = q(m, "fast", pp1), llama(m, int(p1), 0)
    c, e = q(m, "fast-p2", pp2), llama(m, int(p2), 0)
    t, lt = q(m, "fast", tg), llama(m, 0, int(g))
    td, ltd = q(m, "fast", tgd), llama(m, 0, int(g), int(d))
    share = f"{size(m) * t / bw:.0%}" if t and size(m) else "-"
    print(f"| {m} | {num(a)} / {num(b)} | {ratio(a, b)} | {num(c)} / {num(e)} | {ratio(c, e)} | {num(t)} / {num(lt)} | {ratio(t, lt)} | {num(td)} / {num(ltd)} | {ratio(td, ltd)} | {share} |")

print("\n## Quantized prefill against F16 (8B)\n")
f1, f2 = q("llama8b-f16", "fast", pp1), q("llama8b-f16", "fast-p2", pp2)
for m in ("llama8b-q4_0", "llama8b-q8_0"):
    print(f"- {m}: {pp1} {ratio(q(m, 'fast', pp1), f1)}, {pp2} {ratio(q(m, 'fast-p2', pp2), f2)} of F16")

print("\n## exact decode against fast (8B)\n")
for m in ("llama8b-q4_0", "llama8b-q8_0"):
    ex, fa = q(m, "exact", tg), q(m, "fast", tg)
    print(f"- {m}: exact {num(ex)} / fast {num(fa)} = {ratio(ex, fa)}")

print("\n## Paged KV scattered against in order (8B Q4_0)\n")
for key in (pp1, tg, tgd):
    pairs = [(q("llama8b-q4_0", f"scattered-{i}", key), q("llama8b-q4_0", f"in-order-{i}", key)) for i in (1, 2)]
    print(f"- {key}: " + ", ".join(f"{num(s)} / {num(o)} = {ratio(s, o)}" for s, o in pairs))

print("\n## Batched decode (8B Q4_0), generated tokens/s\n")
lb = {}
log = os.path.join(out, "llama8b-q4_0-llama-batched.log")
if os.path.exists(log):
    head = None
    for line in open(log):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            head = cells
        elif head and len(cells) == len(head) and cells[head.index("B")].isdigit():
            lb[int(cells[head.index("B")])] = float(cells[head.index("S_TG t/s")])
print("| B | Quire | llama-batched-bench | ratio |\n|---|---|---|---|")
for b in batch.split(","):
    v = q("llama8b-q4_0", "batched", f"tg{g} B{b} p{g}")
    print(f"| {b} | {num(v)} | {num(lb.get(int(b)))} | {ratio(v, lb.get(int(b)))} |")

fi_md = os.path.join(out, "attn-flashinfer.md")
if os.path.exists(fi_md):
    fi = {}
    for line in open(fi_md):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].isdigit() and cells[1].isdigit():
            fi[(int(cells[0]), int(cells[1]))] = float(cells[2].replace(",", ""))
    qa = [{}, {}]
    for i in (1, 2):
        path = os.path.join(out, f"attn-quire-{i}.jsonl")
        if os.path.exists(path):
            for l in open(path):
                if l.startswith("{"):
                    r = json.loads(l)
                    qa[i - 1][(r["batch"], r["ctx"])] = r.get("us_pdl") or r["us"]
    print("\n## Paged decode attention alone (8B heads, us per call, PDL on both)\n")
    print("| B | ctx | Quire (run 1 / 2) | FlashInfer | FlashInfer / Quire |\n|---|---|---|---|---|")
    logs = []
    for key in sorted(fi):
        q1, q2 = qa[0].get(key), qa[1].get(key)
        r = fi[key] / q1 if q1 else None
        if r:
            logs.append(r)
        us = lambda v: f"{v:.2f}" if v else "-"
        print(f"| {key[0]} | {key[1]} | {us(q1)} / {us(q2)} | {fi[key]:.2f} | {f'{r:.3f}' if r else '-'} |")
    if logs:
        import math
        gm = math.exp(sum(math.log(v) for v in logs) / len(logs))
        print(f"\ngeometric mean {gm:.3f}; {sum(v >= 1.0 for v in logs)} of {len(logs)} shapes at 1.0 or above")

if ab:
    # --greedy's rows carry its tag (quire bench's chain_tag).
    tag = " greedy" if os.environ.get("GOALS_AB_GREEDY") == "1" else ""
    atg, atgd = tg + tag, tgd + tag
    print(f"\n## Decode with `{ab}` against without (alternating runs{', greedy' if tag else ''})\n")
    print(f"| model | {atg} off / on | {atgd} off / on | ratio ({atg}, {atgd}) |\n|---|---|---|---|")
    for m in models:
        offs = [(q(m, f"ab-off-{i}", atg), q(m, f"ab-off-{i}", atgd)) for i in (1, 2)]
        ons = [(q(m, f"ab-on-{i}", atg), q(m, f"ab-on-{i}", atgd)) for i in (1, 2)]
        mean = lambda v: sum(v) / len(v) if v and all(v) else None
        a = [mean([o[j] for o in offs]) for j in (0, 1)]
        b = [mean([o[j] for o in ons]) for j in (0, 1)]
        cell = lambda j: " / ".join(num(v) for v in [offs[0][j], offs[1][j]]) + " ; " + " / ".join(num(v) for v in [ons[0][j], ons[1][j]])
        print(f"| {m} | {cell(0)} | {cell(1)} | {ratio(b[0], a[0])}, {ratio(b[1], a[1])} |")
PY
echo "gpu-goals: $([ $status -eq 0 ] && echo done || echo FAILURES)" >>"$OUT/summary.md"
cat "$OUT/summary.md"
exit $status
