#!/usr/bin/env bash
# GPU checks in one call (for the lent GPU machine, which has the CUDA driver
# and libnvrtc but no Rust toolchain): the op parity harness in exact,
# deterministic and fast modes, and whole-model exact checks (GPU logits bitwise equal to the
# CPU's at every step of a greedy run) on synthetic SmolLM2-135M Q4_1 and
# Llama-3.2-1B Q4_K models. Writes logs and summary.txt to $OUT (or ./gpu-check-out).
#
#   QUIRE=./.devbin/quire scripts/gpu-check.sh [steps...]
# steps: ops-exact ops-det ops-fast attn perf smollm fuse layers ahead l2 greedy llama bench (default: all)
set -uo pipefail
QUIRE="${QUIRE:-./target/release/quire}"
OUT="${OUT:-./gpu-check-out}"
TOKENS="${TOKENS:-256}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(ops-exact ops-det ops-fast attn perf smollm fuse layers ahead l2 greedy llama bench)
note() { echo "$*" | tee -a "$summary"; }
note "gpu-check: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
status=0
run_step() {
  local name=$1
  shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed, .* failed|check-exact:|check-greedy:|check-sample:|error:" "$OUT/$name.log" | tail -2 | tr '\n' ' ')
  note "$name: rc=$rc ($((SECONDS - t0)) s) $last"
  [ $rc -eq 0 ] || status=1
}
tmp=${TMPDIR:-/tmp}/quire-gpu-check
mkdir -p "$tmp"
for s in "${steps[@]}"; do
  case $s in
    ops-exact)
      run_step ops-exact "$QUIRE" ops --backend cuda --mode exact
      # The exact decode matvec's warp-pair form (off by default): on every
      # launch, bitwise.
      QUIRE_MV_EXACT_SPLIT_WAVES=100000 run_step ops-exact-split "$QUIRE" ops --backend cuda --mode exact --op mat_mul
      # The exact attention's thread-block clusters (sm_90+; elsewhere one
      # CTA per (row, head) runs the same cases): every size, bitwise.
      for cs in 2 3 8; do
        QUIRE_ATT_EX_CLUSTER=$cs run_step "ops-exact-attn-cluster$cs" "$QUIRE" ops --backend cuda --mode exact --op paged_attention
      done
      ;;
    ops-det) run_step ops-det "$QUIRE" ops --backend cuda --mode deterministic ;;
    ops-fast)
      run_step ops-fast "$QUIRE" ops --backend cuda --mode fast
      # Norm-ahead's pairs (in the run above) with the consumer's four-warp
      # form and the producer at one unit per lane in flight.
      QUIRE_MV_WARPS_LONG=4 run_step ops-fast-ahead-w4 "$QUIRE" ops --backend cuda --mode fast --op norm_ahead
      QUIRE_CUDA_DEFINES=MV_NA_UNITS=1 run_step ops-fast-ahead-u1 "$QUIRE" ops --backend cuda --mode fast --op norm_ahead
      # The one-CTA producer (the default on sm_90+ is the cluster form),
      # and every gate/up + SwiGlu form as norm-ahead's consumer.
      QUIRE_NORM_AHEAD_FORM=na run_step ops-fast-ahead-na "$QUIRE" ops --backend cuda --mode fast --op norm_ahead
      for form in glu8 glu16 glu32 glu8c2 glu8c4 glu16c2; do
        QUIRE_MV_GLU_FORM=$form run_step "ops-fast-ahead-$form" "$QUIRE" ops --backend cuda --mode fast --op norm_ahead
      done
      # The short-row matvec (by default only output heads) on every
      # one-row matmul case.
      QUIRE_MV_SHORT=4 run_step ops-fast-short4 "$QUIRE" ops --backend cuda --mode fast --op mat_mul
      # Every form of the gate/up matvec with the SwiGlu in its epilogue
      # (the default rule takes one of the cases; each form all of them).
      for form in glu8 glu16 glu32 glu8c2 glu8c4 glu16c2; do
        QUIRE_MV_GLU_FORM=$form run_step "ops-fast-$form" "$QUIRE" ops --backend cuda --mode fast --op mat_muls_glu
      done
      # The int8 tensor-core matmul (Q4_0/Q4_1/Q8_0, k % 256 == 0) serves
      # every row count past 7, the f16 tile kernel the other types up to
      # 64: cover both at every row count.
      for wn in 1 2; do
        QUIRE_MQ_WN=$wn QUIRE_MMA_MIN_ROWS=0 QUIRE_MMA_MAX_ROWS=100000 run_step "ops-fast-mma-w$wn" "$QUIRE" ops --backend cuda --mode fast --op mat_mul
      done
      # The mq kernels' cp.async weight copies (sm_90 moves Q4_0 / Q8_0
      # chunks by bulk tensor copy; MQ_TMA=0 is the other path).
      QUIRE_CUDA_DEFINES=MQ_TMA=0 QUIRE_MMA_MIN_ROWS=0 QUIRE_MMA_MAX_ROWS=100000 run_step ops-fast-mma-cpasync "$QUIRE" ops --backend cuda --mode fast --op mat_mul
      QUIRE_MQ=0 QUIRE_MMA_MIN_ROWS=0 QUIRE_MMA_MAX_ROWS=100000 run_step ops-fast-tile "$QUIRE" ops --backend cuda --mode fast --op mat_mul
      # The wgmma prefill GEMM (sm_90 only; elsewhere the same cases run the
      # cuBLAS path): by default it takes Q4_0, Q4_1 and Q8_0, QUIRE_WGMMA=1 every
      # 32-value block type, in each CTA shape (128 or 256 rows, 256 tokens);
      # QUIRE_WGMMA=0 leaves the cuBLAS path every type.
      QUIRE_WGMMA=0 run_step ops-fast-blas "$QUIRE" ops --backend cuda --mode fast --op mat_mul
      # Each shape unsplit and (where k / 256 allows) in 2 and 4 k splits
      # added by split_sum_jobs.
      for sp in 1 2 4; do
        for mt in 1 2; do
          QUIRE_WGMMA=1 QUIRE_WR_MT=$mt QUIRE_WR_SPLIT=$sp run_step "ops-fast-wgmma-m$mt-s$sp" "$QUIRE" ops --backend cuda --mode fast --op mat_mul
        done
        QUIRE_WGMMA=1 QUIRE_WR_BN=256 QUIRE_WR_SPLIT=$sp run_step "ops-fast-wgmma-n256-s$sp" "$QUIRE" ops --backend cuda --mode fast --op mat_mul
      done
      # The producer's cp.async raw copies instead of the bulk tensor copies.
      QUIRE_WGMMA=1 QUIRE_WR_BN=256 QUIRE_WG_DEFINES=WR_TMA=0 run_step ops-fast-wgmma-cpasync "$QUIRE" ops --backend cuda --mode fast --op mat_mul
      # The wave tail (wr_tail, added by wr_tail_sum) in every CTA shape,
      # planned for 4 and 7 SMs so that the cases' few CTAs have one (the
      # 520 x 1024 x 300 case takes it in every shape; mat_muls: a tail
      # across jobs and into an adding job).
      for tsms in 4 7; do
        for shape in QUIRE_WR_MT=1 QUIRE_WR_MT=2 QUIRE_WR_BN=256; do
          run_step "ops-fast-wgmma-tail$tsms-${shape#QUIRE_WR_}" env QUIRE_WGMMA=1 QUIRE_WR_TAIL_SMS=$tsms "$shape" "$QUIRE" ops --backend cuda --mode fast --op mat_mul
        done
      done
      # The 8-key-tile split attention (att_pipe_w_*), which fast mode takes
      # only for launches past one wave (larger batches than the cases).
      QUIRE_ATT_RMMA=0 QUIRE_ATT_WIDE=1 run_step ops-fast-att-wide "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      # The split attention merged by attention_combine instead of the
      # unit's cluster (att_pipe_c_*, the default for small launches of 2-16
      # CTAs per unit).
      QUIRE_ATT_RMMA=0 QUIRE_ATT_CLUSTER=0 run_step ops-fast-att-combine "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      # The split forms alone (the row form off, so that the cases' short
      # rows take the cluster forms too), with the cluster merge through
      # rank 0's shared memory and through L2 (the same bits; ATT_CL_DSMEM).
      QUIRE_ATT_RMMA=0 QUIRE_ATT_ROW=0 run_step ops-fast-att-cluster "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      QUIRE_ATT_RMMA=0 QUIRE_ATT_ROW=0 QUIRE_CUDA_DEFINES=ATT_CL_DSMEM=0 run_step ops-fast-att-cluster-l2 "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      # The 4-warp partials, merging and cluster forms, which fast mode
      # leaves for launches of more than two CTAs per SM (the cases' small
      # batches take the eight-warp att_pipe8_*).
      QUIRE_ATT_RMMA=0 QUIRE_ATT_EIGHT=0 run_step ops-fast-att-four "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      # The row form (att_row_*: one CTA per (row, KV head) over the whole
      # row), which fast mode takes only for rows of one chunk: every case,
      # at its default 16 warps and at 32 (head_dim <= 64), and with every
      # lane's cp.async.
      QUIRE_ATT_RMMA=0 QUIRE_ATT_ROW=1 run_step ops-fast-att-row "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      QUIRE_ATT_RMMA=0 QUIRE_ATT_ROW=1 QUIRE_ATT_ROW_WARPS=32 run_step ops-fast-att-row32 "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      QUIRE_ATT_RMMA=0 QUIRE_ATT_ROW=1 QUIRE_ATT_TMA=0 run_step ops-fast-att-row-cpasync "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      # One CTA per row folding 2-16 chunks at 3 stages (att_pipe_m3_*,
      # which fast mode takes only for batches that fill the GPU), and the
      # K/V copies by every lane's cp.async instead of bulk tensor copies
      # (sm_90+), in every form.
      QUIRE_ATT_RMMA=0 QUIRE_ATT_DEEP=1 run_step ops-fast-att-deep "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      QUIRE_ATT_RMMA=0 QUIRE_ATT_TMA=0 run_step ops-fast-att-cpasync "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      QUIRE_ATT_RMMA=0 QUIRE_ATT_TMA=1 run_step ops-fast-att-tma "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      # The tensor-core row form (att_rmma_*: one CTA per (row, KV head),
      # m16n8k16 MMAs), which fast mode takes for few units of one chunk
      # (and a few more in decode graphs with the L2 read-ahead): every
      # case with head_dim 64 or 128, at its default warps and stages, at
      # 8 warps of 4 stages and at 4 warps of one stage (every tile past
      # the first refilled in the loop). The lines above turn it off so
      # that the small cases reach the forms they name.
      QUIRE_ATT_RMMA=1 run_step ops-fast-att-rmma "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      QUIRE_ATT_RMMA=1 QUIRE_ATT_RMMA_WARPS=8 QUIRE_ATT_RMMA_STAGES=4 run_step ops-fast-att-rmma8 "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      QUIRE_ATT_RMMA=1 QUIRE_ATT_RMMA_WARPS=4 QUIRE_ATT_RMMA_STAGES=1 run_step ops-fast-att-rmma4 "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      # Its cluster form (att_rmma_c_*: 2-4 CTAs per (row, KV head), merged
      # in rank 0's shared memory), which decode graphs with the L2
      # read-ahead take for rows of several chunks: every case it can
      # place, at 2, 3 and 4 CTAs.
      for c in 2 3 4; do
        QUIRE_ATT_RMMA=0 QUIRE_ATT_RMMA_CL=1 QUIRE_ATT_RMMA_CL_CTAS=$c run_step ops-fast-att-rmma-cl$c "$QUIRE" ops --backend cuda --mode fast --op paged_attention
      done
      ;;
    attn)
      # Paged decode attention over scattered blocks at long contexts
      # (bench-attn fails unless every shape matches the cpu reference:
      # bitwise in exact mode, within the NMSE bound otherwise).
      for m in exact deterministic fast; do
        run_step "attn-$m" "$QUIRE" bench-attn --mode "$m" --batch 1,5,64 --ctx 300,4100 --iters 3
      done
      ;;
    perf) run_step ops-perf "$QUIRE" ops --backend cuda --mode exact --perf --op mat_mul ;;
    smollm)
      "$QUIRE" synth --shape SmolLM2-135M --type Q4_1 -o "$tmp/smollm2-q4_1.gguf" >"$OUT/synth-smollm.log" 2>&1
      run_step smollm-exact "$QUIRE" check-exact -m "$tmp/smollm2-q4_1.gguf" --tokens "$TOKENS"
      ;;
    fuse)
      # Fast and deterministic decode with the device fusions (norm and
      # swiglu quantizing for the next matmul) against the same mode
      # without them: bitwise at every step.
      [ -f "$tmp/smollm2-q4_1.gguf" ] || "$QUIRE" synth --shape SmolLM2-135M --type Q4_1 -o "$tmp/smollm2-q4_1.gguf" >"$OUT/synth-smollm.log" 2>&1
      for m in fast deterministic; do
        run_step "fuse-$m" "$QUIRE" check-exact --mode "$m" -m "$tmp/smollm2-q4_1.gguf" --tokens 64
      done
      # Prefill: rms_norm and swiglu writing the wgmma GEMM's f16 tiles
      # (k a multiple of 256: the 1B shape; a 700-token prompt in one step,
      # a partial tile) against to_f16_wr, bitwise.
      [ -f "$tmp/llama1b-q4_0.gguf" ] || "$QUIRE" synth --shape Llama-3.2-1B --type Q4_0 -o "$tmp/llama1b-q4_0.gguf" >"$OUT/synth-llama-q4_0.log" 2>&1
      run_step fuse-prefill-fast "$QUIRE" check-exact --mode fast -m "$tmp/llama1b-q4_0.gguf" --prompt-tokens 700 --tokens 8
      ;;
    layers)
      # The fused decode layers (experimental, QUIRE_FUSED_LAYERS) against
      # the op-by-op fast graph, both against the cpu (NMSE): Q4_0 (the one
      # type it takes), a prompt long enough for every key split.
      "$QUIRE" synth --shape SmolLM2-135M --type Q4_0 -o "$tmp/smollm2-q4_0.gguf" >"$OUT/synth-smollm-q4_0.log" 2>&1
      [ -f "$tmp/llama1b-q4_0.gguf" ] || "$QUIRE" synth --shape Llama-3.2-1B --type Q4_0 -o "$tmp/llama1b-q4_0.gguf" >"$OUT/synth-llama-q4_0.log" 2>&1
      run_step layers-smollm "$QUIRE" check-exact --mode fast-layers -m "$tmp/smollm2-q4_0.gguf" --prompt-tokens 300 --tokens 32
      run_step layers-llama "$QUIRE" check-exact --mode fast-layers -m "$tmp/llama1b-q4_0.gguf" --prompt-tokens 200 --tokens 16
      ;;
    ahead)
      # Norm-ahead (the default for residual rows <= 1,024;
      # QUIRE_NORM_AHEAD): the norms folded into the residual matvecs and
      # the next op's, against the op-by-op fast
      # graph, both against the cpu (NMSE): SmolLM2's 576-wide rows (18
      # blocks), the 1B's 2,048 (Q4_0, and Q4_K's superblocks), decode
      # graphs after a prompt.
      "$QUIRE" synth --shape SmolLM2-135M --type Q4_0 -o "$tmp/smollm2-q4_0.gguf" >"$OUT/synth-smollm-q4_0.log" 2>&1
      [ -f "$tmp/llama1b-q4_0.gguf" ] || "$QUIRE" synth --shape Llama-3.2-1B --type Q4_0 -o "$tmp/llama1b-q4_0.gguf" >"$OUT/synth-llama-q4_0.log" 2>&1
      [ -f "$tmp/llama1b-q4_k.gguf" ] || "$QUIRE" synth --shape Llama-3.2-1B --type Q4_K -o "$tmp/llama1b-q4_k.gguf" >"$OUT/synth-llama-q4_k.log" 2>&1
      run_step ahead-smollm "$QUIRE" check-exact --mode fast-norm-ahead -m "$tmp/smollm2-q4_0.gguf" --prompt-tokens 300 --tokens 32
      run_step ahead-llama "$QUIRE" check-exact --mode fast-norm-ahead -m "$tmp/llama1b-q4_0.gguf" --prompt-tokens 200 --tokens 16
      run_step ahead-llama-q4k "$QUIRE" check-exact --mode fast-norm-ahead -m "$tmp/llama1b-q4_k.gguf" --prompt-tokens 40 --tokens 16
      ;;
    l2)
      # The L2 read-ahead (on by default for one-row Q4_0 / Q4_1 / Q8_0
      # graphs of 256 MiB or more) only prefetches: greedy text with it on
      # and off, identical. Twice: after a short prompt, and after one of
      # about 250 tokens, whose decode attention merges in thread-block
      # clusters without the read-ahead and with the combine with it.
      [ -f "$tmp/llama1b-q4_0.gguf" ] || "$QUIRE" synth --shape Llama-3.2-1B --type Q4_0 -o "$tmp/llama1b-q4_0.gguf" >"$OUT/synth-llama-q4_0.log" 2>&1
      long="$(for i in $(seq 40); do printf 'The read-ahead streams weights. '; done)"
      for pr in short long; do
        prompt="The read-ahead"
        [ $pr = long ] && prompt="$long"
        for ahead in on off; do
          # on: the automatic distance (the knob unset); off: QUIRE_L2_AHEAD_MB=0.
          knob=(-u QUIRE_L2_AHEAD_MB)
          [ $ahead = off ] && knob=(QUIRE_L2_AHEAD_MB=0)
          env "${knob[@]}" RUST_LOG=quire::dispatch=debug "$QUIRE" run -m "$tmp/llama1b-q4_0.gguf" --gpu required --mode fast --temperature 0 -n 64 --raw -p "$prompt" >"$OUT/l2-$pr-$ahead.txt" 2>"$OUT/l2-$pr-$ahead.log"
        done
        if ! grep -q 'l2 read-ahead of [1-9]' "$OUT/l2-$pr-on.log"; then
          note "l2 ($pr prompt): FAILED (the read-ahead did not run; see l2-$pr-on.log)"; status=1
        elif [ -s "$OUT/l2-$pr-on.txt" ] && cmp -s "$OUT/l2-$pr-on.txt" "$OUT/l2-$pr-off.txt"; then
          note "l2 ($pr prompt): identical greedy text with the read-ahead on and off"
        else
          note "l2 ($pr prompt): FAILED (texts differ or are empty: l2-$pr-on.txt, l2-$pr-off.txt)"; status=1
        fi
      done
      # Bitwise, after 300 prompt tokens: the fused graph against the
      # unfused op-by-op run (check-exact), with the read-ahead (attention
      # merged by the combine) and without it (in clusters).
      for ahead in on off; do
        knob=(-u QUIRE_L2_AHEAD_MB)
        [ $ahead = off ] && knob=(QUIRE_L2_AHEAD_MB=0)
        RUST_LOG=quire::dispatch=debug run_step "l2-check-$ahead" env "${knob[@]}" "$QUIRE" check-exact --mode fast -m "$tmp/llama1b-q4_0.gguf" --prompt-tokens 300 --tokens 8
      done
      if ! grep -q 'l2 read-ahead of [1-9]' "$OUT/l2-check-on.log"; then
        note "l2-check-on: FAILED (the read-ahead did not run)"; status=1
      fi
      ;;
    greedy)
      # Greedy and sampled decoding with the tokens chosen on the device
      # (sample_rows in the decode graph, the host one step ahead) against
      # the same steps (same seeds) sampled on the host: identical tokens,
      # in every mode; and sample_rows against the sampler on crafted rows
      # (ties, signed zeros, -inf runs, NaN, +inf) for every parameter
      # shape the device draws.
      [ -f "$tmp/smollm2-q4_1.gguf" ] || "$QUIRE" synth --shape SmolLM2-135M --type Q4_1 -o "$tmp/smollm2-q4_1.gguf" >"$OUT/synth-smollm.log" 2>&1
      for m in fast deterministic exact; do
        run_step "greedy-$m" "$QUIRE" check-greedy --mode "$m" -m "$tmp/smollm2-q4_1.gguf" --tokens 300 --prompt-tokens 200
      done
      ;;
    llama)
      "$QUIRE" synth --shape Llama-3.2-1B --type Q4_K -o "$tmp/llama1b-q4_k.gguf" >"$OUT/synth-llama.log" 2>&1
      run_step llama-exact "$QUIRE" check-exact -m "$tmp/llama1b-q4_k.gguf" --tokens "$TOKENS"
      ;;
    bench)
      # Prefill/decode tokens/s on the device-resident path, exact and fast
      # kernels, vs the CPU, on the synthetic SmolLM2 model (smollm step first).
      run_step bench-gpu-exact "$QUIRE" bench -m "$tmp/smollm2-q4_1.gguf" --gpu required --mode exact -p 512 -g 128 -r 2 --show-backends
      run_step bench-gpu-fast "$QUIRE" bench -m "$tmp/smollm2-q4_1.gguf" --gpu required --mode fast -p 512 -g 128 -r 2
      run_step bench-cpu "$QUIRE" bench -m "$tmp/smollm2-q4_1.gguf" -p 128 -g 64 -r 1
      grep -E "pp|tg" "$OUT"/bench-*.log | tee -a "$summary"
      ;;
    *) note "unknown step $s"; status=1 ;;
  esac
done
note "gpu-check: $([ $status -eq 0 ] && echo ALL PASSED || echo FAILURES)"
exit $status
