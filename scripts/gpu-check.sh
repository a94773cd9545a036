#!/usr/bin/env bash
# GPU checks in one call (for the lent GPU machine, which has the CUDA driver
# and libnvrtc but no Rust toolchain): the op parity harness in exact,
# deterministic and fast modes, and whole-model exact checks (GPU logits bitwise equal to the
# CPU's at every step of a greedy run) on synthetic SmolLM2-135M Q4_1 and
# Llama-3.2-1B Q4_K models, and the Rust tests that need a device (test
# binaries built here by scripts/build-gpu-tests.sh, run with --ignored).
# Writes logs and summary.txt to $OUT (or ./gpu-check-out); the last line
# is `gpu-check: N passed, N failed` (each step, and each test).
#
#   QUIRE=./.devbin/quire TESTS=./.devbin/tests scripts/gpu-check.sh [steps...]
# steps: ops-exact ops-det ops-fast invariance attn perf smollm fuse ahead l2 greedy llama bench tests (default: all)
set -uo pipefail
QUIRE="${QUIRE:-./target/release/quire}"
OUT="${OUT:-./gpu-check-out}"
TOKENS="${TOKENS:-256}"
TESTS="${TESTS:-./.devbin/tests}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(ops-exact ops-det ops-fast invariance attn perf smollm fuse ahead l2 greedy llama bench tests)
note() { echo "$*" | tee -a "$summary"; }
note "gpu-check: $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
status=0
n_pass=0
n_fail=0
pass() { note "$*"; n_pass=$((n_pass + 1)); }
fail() { note "$*"; n_fail=$((n_fail + 1)); status=1; }
run_step() {
  local name=$1
  shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed, .* failed|check-exact:|check-greedy:|check-sample:|^summary:|^invariant:|^negative control:|error:" "$OUT/$name.log" | tail -2 | tr '\n' ' ')
  note "$name: rc=$rc ($((SECONDS - t0)) s) $last"
  if [ $rc -eq 0 ]; then n_pass=$((n_pass + 1)); else n_fail=$((n_fail + 1)); status=1; fi
}
# Each test binary in $TESTS with --ignored (the tests that need a device,
# which fail without one): each test counts; a binary that exits non-zero
# without a failed test, or runs none, counts as one failure.
# NCCL for the tensor-parallel tests: cudarc loads `libnccl.so`, pip's
# nvidia-nccl package ships `libnccl.so.2`; link it under that name.
nccl_on_path() {
  local dir
  dir=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null) || return 0
  [ -f "$dir/libnccl.so.2" ] || return 0
  mkdir -p "$OUT/nccl-lib"
  ln -sf "$dir/libnccl.so.2" "$OUT/nccl-lib/libnccl.so"
  export LD_LIBRARY_PATH="$OUT/nccl-lib:$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
run_tests() {
  local bins=() b name log t0 rc res p f
  nccl_on_path
  for b in "$TESTS"/*; do
    [ -f "$b" ] && [ -x "$b" ] && bins+=("$b")
  done
  if [ ${#bins[@]} -eq 0 ]; then
    fail "tests: FAILED (no test binaries in $TESTS; scripts/build-gpu-tests.sh builds them)"
    return
  fi
  for b in "${bins[@]}"; do
    name="tests-$(basename "$b")"
    log="$OUT/$name.log"
    t0=$SECONDS
    "$b" --ignored --test-threads=1 >"$log" 2>&1
    rc=$?
    res=$(grep -E '^test result: ' "$log" | tail -1)
    p=$(sed -nE 's/.* ([0-9]+) passed;.*/\1/p' <<<"$res")
    f=$(sed -nE 's/.* ([0-9]+) failed;.*/\1/p' <<<"$res")
    p=${p:-0}
    f=${f:-0}
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    if [ $rc -eq 0 ] && [ "$p" -eq 0 ]; then f=1; fi
    n_pass=$((n_pass + p))
    n_fail=$((n_fail + f))
    [ "$f" -eq 0 ] || status=1
    note "$name: rc=$rc ($((SECONDS - t0)) s) $p passed, $f failed $(grep -E '^test .* FAILED$' "$log" | sed -E 's/^test ([^ ]+) .*/\1/' | tr '\n' ' ')"
  done
}
tmp=${TMPDIR:-/tmp}/quire-gpu-check
# The tensor-core decode kernels on every row count (parity coverage).
MMA_ALL="--tune matmul.mma_min_rows=0 --tune matmul.mma_max_rows=100000"
mkdir -p "$tmp"
for s in "${steps[@]}"; do
  case $s in
    ops-exact)
      run_step ops-exact "$QUIRE" ops --backend cuda --mode exact
      # The exact attention's thread-block clusters (sm_90+; elsewhere one
      # CTA per (row, head) runs the same cases): every size, bitwise.
      for cs in 2 3 8; do
        run_step "ops-exact-attn-cluster$cs" "$QUIRE" ops --backend cuda --mode exact --op paged_attention --tune attention.exact_cluster=$cs
      done
      ;;
    ops-det) run_step ops-det "$QUIRE" ops --backend cuda --mode deterministic ;;
    invariance)
      # The full invariance grid: deterministic and exact bitwise invariant
      # (exact also the cpu's bits); fast must show a difference (the
      # negative control).
      run_step invariance-det "$QUIRE" check-invariance --backend cuda --mode deterministic --full
      run_step invariance-exact "$QUIRE" check-invariance --backend cuda --mode exact --full
      run_step invariance-fast "$QUIRE" check-invariance --backend cuda --mode fast --full --expect-differences
      ;;
    ops-fast)
      run_step ops-fast "$QUIRE" ops --backend cuda --mode fast
      # Norm-ahead's pairs (in the run above) with the consumer's four-warp
      # form and the producer at one unit per lane in flight.
      run_step ops-fast-ahead-w4 "$QUIRE" ops --backend cuda --mode fast --op norm_ahead --tune matmul.mv_warps_long=4
      QUIRE_CUDA_DEFINES=MV_NA_UNITS=1 run_step ops-fast-ahead-u1 "$QUIRE" ops --backend cuda --mode fast --op norm_ahead
      # The one-CTA producer (the default on sm_90+ is the cluster form),
      # and every gate/up + SwiGlu form as norm-ahead's consumer.
      run_step ops-fast-ahead-na "$QUIRE" ops --backend cuda --mode fast --op norm_ahead --tune matvec.norm_ahead_clusters=false
      for form in glu8 glu16 glu32 glu8c2 glu8c4 glu16c2; do
        run_step "ops-fast-ahead-$form" "$QUIRE" ops --backend cuda --mode fast --op norm_ahead --tune matmul.mv_glu_form=$form
      done
      # The short-row matvec (by default only output heads) on every
      # one-row matmul case.
      run_step ops-fast-short4 "$QUIRE" ops --backend cuda --mode fast --op mat_mul --tune matmul.mv_short=on
      # Every form of the gate/up matvec with the SwiGlu in its epilogue
      # (the default rule takes one of the cases; each form all of them).
      for form in glu8 glu16 glu32 glu8c2 glu8c4 glu16c2; do
        run_step "ops-fast-$form" "$QUIRE" ops --backend cuda --mode fast --op mat_muls_glu --tune matmul.mv_glu_form=$form
      done
      # The int8 tensor-core matmul (Q4_0/Q4_1/Q8_0, k % 256 == 0) serves
      # every row count past 7, the f16 tile kernel the other types up to
      # 64: cover both at every row count.
      for wn in 1 2; do
        run_step "ops-fast-mma-w$wn" "$QUIRE" ops --backend cuda --mode fast --op mat_mul $MMA_ALL --tune matmul.mq_wn=$wn
      done
      # The mq kernels' cp.async weight copies (sm_90 moves Q4_0 / Q8_0
      # chunks by bulk tensor copy; MQ_TMA=0 is the other path).
      QUIRE_CUDA_DEFINES=MQ_TMA=0 run_step ops-fast-mma-cpasync "$QUIRE" ops --backend cuda --mode fast --op mat_mul $MMA_ALL
      run_step ops-fast-tile "$QUIRE" ops --backend cuda --mode fast --op mat_mul $MMA_ALL --tune matmul.mq=false
      # The wgmma prefill GEMM (sm_90 only; elsewhere the same cases run the
      # cuBLAS path): by default the shapes where it measured faster,
      # matmul.wgmma=on every 32-value block type and shape, in each CTA
      # shape (128 or 256 rows, 256 tokens); off leaves the cuBLAS path every
      # type.
      run_step ops-fast-blas "$QUIRE" ops --backend cuda --mode fast --op mat_mul --tune matmul.wgmma=off
      # Each shape unsplit and (where k / 256 allows) in 2 and 4 k splits
      # added by split_sum_jobs.
      for sp in 1 2 4; do
        for mt in 1 2; do
          run_step "ops-fast-wgmma-m$mt-s$sp" "$QUIRE" ops --backend cuda --mode fast --op mat_mul --tune matmul.wgmma=on --tune matmul.wr_shape=m$mt --tune matmul.wr_split=$sp
        done
        run_step "ops-fast-wgmma-n256-s$sp" "$QUIRE" ops --backend cuda --mode fast --op mat_mul --tune matmul.wgmma=on --tune matmul.wr_shape=n256 --tune matmul.wr_split=$sp
      done
      # The producer's cp.async raw copies instead of the bulk tensor copies.
      QUIRE_CUDA_DEFINES=WR_TMA=0 run_step ops-fast-wgmma-cpasync "$QUIRE" ops --backend cuda --mode fast --op mat_mul --tune matmul.wgmma=on --tune matmul.wr_shape=n256
      # The wave tail (wr_tail, added by wr_tail_sum) in every CTA shape,
      # planned for 4 and 7 SMs so that the cases' few CTAs have one (the
      # 520 x 1024 x 300 case takes it in every shape; mat_muls: a tail
      # across jobs and into an adding job).
      for tsms in 4 7; do
        for shape in m1 m2 n256; do
          run_step "ops-fast-wgmma-tail$tsms-$shape" "$QUIRE" ops --backend cuda --mode fast --op mat_mul --tune matmul.wgmma=on --tune matmul.wr_tail_sms=$tsms --tune matmul.wr_shape=$shape
        done
      done
      # The 8-key-tile split attention (att_pipe_w_*), which fast mode takes
      # only for launches past one wave (larger batches than the cases).
      run_step ops-fast-att-wide "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.wide=on
      # The split attention merged by attention_combine instead of the
      # unit's cluster (att_pipe_c_*, the default for small launches of 2-16
      # CTAs per unit).
      run_step ops-fast-att-combine "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.cluster=false
      # The split forms alone (the row form off, so that the cases' short
      # rows take the cluster forms too), with the cluster merge through
      # rank 0's shared memory and through L2 (the same bits; ATT_CL_DSMEM).
      run_step ops-fast-att-cluster "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.row=off
      QUIRE_CUDA_DEFINES=ATT_CL_DSMEM=0 run_step ops-fast-att-cluster-l2 "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.row=off
      # The 4-warp partials, merging and cluster forms, which fast mode
      # leaves for launches of more than two CTAs per SM (the cases' small
      # batches take the eight-warp att_pipe8_*).
      run_step ops-fast-att-four "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.eight=off
      # The row form (att_row_*: one CTA per (row, KV head) over the whole
      # row), which fast mode takes only for rows of one chunk: every case,
      # and with every lane's cp.async.
      run_step ops-fast-att-row "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.row=on
      run_step ops-fast-att-row-cpasync "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.row=on --tune attention.tma=off
      # One CTA per row folding 2-16 chunks at 3 stages (att_pipe_m3_*,
      # which fast mode takes only for batches that fill the GPU), and the
      # K/V copies by every lane's cp.async instead of bulk tensor copies
      # (sm_90+), in every form.
      run_step ops-fast-att-deep "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.deep=on
      run_step ops-fast-att-cpasync "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.tma=off
      run_step ops-fast-att-tma "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.tma=on
      # The tensor-core row form (att_rmma_*: one CTA per (row, KV head),
      # m16n8k16 MMAs), which fast mode takes for few units of one chunk
      # (and a few more in decode graphs with the L2 read-ahead): every
      # case with head_dim 64 or 128. The lines above turn it off so that
      # the small cases reach the forms they name.
      run_step ops-fast-att-rmma "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=on
      # Its cluster form (att_rmma_c_*: 2-4 CTAs per (row, KV head), merged
      # in rank 0's shared memory), which decode graphs with the L2
      # read-ahead take for rows of several chunks: every case it can
      # place, at 2, 3 and 4 CTAs.
      for c in 2 3 4; do
        run_step ops-fast-att-rmma-cl$c "$QUIRE" ops --backend cuda --mode fast --op paged_attention --tune attention.rmma=off --tune attention.rmma_cluster=on --tune attention.rmma_cluster_ctas=$c
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
    ahead)
      # Norm-ahead (the default for residual rows <= 1,024;
      # tuning matvec.norm_ahead): the norms folded into the residual matvecs and
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
          # on: the automatic distance (the default); off: matvec.l2_ahead_mb=0.
          knob=()
          [ $ahead = off ] && knob=(--tune matvec.l2_ahead_mb=0)
          RUST_LOG=quire::dispatch=debug "$QUIRE" run -m "$tmp/llama1b-q4_0.gguf" --gpu required --mode fast ${knob[@]+"${knob[@]}"} --temperature 0 -n 64 --raw -p "$prompt" >"$OUT/l2-$pr-$ahead.txt" 2>"$OUT/l2-$pr-$ahead.log"
        done
        if ! grep -q 'l2 read-ahead of [1-9]' "$OUT/l2-$pr-on.log"; then
          fail "l2 ($pr prompt): FAILED (the read-ahead did not run; see l2-$pr-on.log)"
        elif [ -s "$OUT/l2-$pr-on.txt" ] && cmp -s "$OUT/l2-$pr-on.txt" "$OUT/l2-$pr-off.txt"; then
          pass "l2 ($pr prompt): identical greedy text with the read-ahead on and off"
        else
          fail "l2 ($pr prompt): FAILED (texts differ or are empty: l2-$pr-on.txt, l2-$pr-off.txt)"
        fi
      done
      # Bitwise, after 300 prompt tokens: the fused graph against the
      # unfused op-by-op run (check-exact), with the read-ahead (attention
      # merged by the combine) and without it (in clusters).
      for ahead in on off; do
        knob=()
        [ $ahead = off ] && knob=(--tune matvec.l2_ahead_mb=0)
        RUST_LOG=quire::dispatch=debug run_step "l2-check-$ahead" "$QUIRE" check-exact --mode fast -m "$tmp/llama1b-q4_0.gguf" ${knob[@]+"${knob[@]}"} --prompt-tokens 300 --tokens 8
      done
      if ! grep -q 'l2 read-ahead of [1-9]' "$OUT/l2-check-on.log"; then
        fail "l2-check-on: FAILED (the read-ahead did not run)"
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
    tests)
      # The Rust tests that need a CUDA device (#[ignore]d in `cargo test`).
      run_tests
      ;;
    *) fail "unknown step $s" ;;
  esac
done
# A failure that no check counted still counts.
[ $status -eq 0 ] || [ $n_fail -gt 0 ] || n_fail=1
note "gpu-check: $n_pass passed, $n_fail failed"
exit $status
