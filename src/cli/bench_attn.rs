//! `quire bench-attn`: the paged decode-attention kernel alone on the CUDA
//! device, for comparison with FlashInfer's paged decode on the same
//! shapes. One query row per sequence at position ctx - 1 (a decode step),
//! every sequence's blocks drawn at random from the whole pool (scattered
//! physical blocks), K/V f16 random. Each shape is checked against the cpu
//! reference on its first and last sequence before it is timed, so the
//! numbers are of a kernel that computed the right thing.
//!
//! Bytes counted per call: K and V of every key read once (2 bytes each)
//! plus q and out (f32). Time: CUDA events around `--iters` calls, three
//! ways: replayed from a CUDA graph of 20 calls with full edges between
//! kernels; the same graph with programmatic edges (PDL, sm_90+ unless
//! `--tune runtime.pdl=false`), the way a decode step's graph runs them (GB/s uses this
//! one where it exists); and launched one by one from the host (where small
//! shapes are bound by the host's per-call work). FlashInfer's decode
//! wrapper launches with PDL by default on sm_90+ (`enable_pdl`), so its
//! graph is to be compared with the PDL column.

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::device::memory::{Dev, DevAttnBatch, DevKv};
use crate::backend::cuda::CudaBackend;
use crate::backend::{AttnBatch, Backend, GpuMode, KvLayer, Mode, Op, OpT};
use anyhow::{ensure, Context, Result};
use clap::Args;
use half::f16;
use half::slice::HalfBitsSliceExt;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct BenchAttnArgs {
    /// Sequences per step (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 32, 64])]
    pub batch: Vec<usize>,
    /// Context length of every sequence (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [512usize, 2048, 8192])]
    pub ctx: Vec<usize>,
    /// Query heads (default: Llama-3.1-8B).
    #[arg(long, default_value_t = 32)]
    pub heads: usize,
    #[arg(long, default_value_t = 8)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    #[arg(long, default_value = "fast")]
    pub mode: Mode,
    /// Timed calls per shape (after 10 warm-up calls).
    #[arg(long, default_value_t = 200)]
    pub iters: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object per shape instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write a PNG plot of GB/s against context length, one line per batch.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// CUDA tuning overrides (JSON file; see `quire tuning`).
    #[arg(long, value_name = "FILE")]
    pub tuning: Option<PathBuf>,
    /// One tuning override, `table.key=value` (repeatable).
    #[arg(long = "tune", value_name = "KEY=VALUE")]
    pub tune: Vec<String>,
}

/// Calls per captured graph.
const GRAPH_CALLS: usize = 20;

/// One timed shape.
struct Row {
    batch: usize,
    ctx: usize,
    /// Per call, replayed from a CUDA graph with full edges.
    us: f64,
    /// Per call, the same graph with programmatic edges (None: no PDL).
    us_pdl: Option<f64>,
    /// Per call, launched one by one from the host.
    us_launch: f64,
    gbps: f64,
    nmse: f64,
    bitwise: bool,
}

/// Random f16 bits in [-2, 2), filled in parallel (chunk i from seed + i,
/// so the contents do not depend on the thread count).
fn random_f16(n: usize, seed: u64) -> Vec<u16> {
    let mut v = vec![0u16; n];
    v.par_chunks_mut(1 << 20).enumerate().for_each(|(i, c)| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9));
        for x in c {
            *x = f16::from_f32(rng.random_range(-2.0f32..2.0)).to_bits();
        }
    });
    v
}

pub fn bench_attn(a: BenchAttnArgs) -> Result<()> {
    let (nh, nkv, hd, bs) = (a.heads, a.kv_heads, a.head_dim, a.block_size);
    ensure!(
        nh > 0 && nkv > 0 && hd > 0 && bs > 0 && nh % nkv == 0,
        "bench-attn: heads {nh} must be a positive multiple of kv-heads {nkv}; head-dim {hd} and block-size {bs} must be > 0"
    );
    ensure!(
        !a.batch.is_empty() && !a.ctx.is_empty() && a.batch.iter().chain(&a.ctx).all(|&x| x > 0),
        "bench-attn: --batch and --ctx need at least one value each, all > 0"
    );
    let tuning = super::tuning_overrides(a.tuning.as_deref(), &a.tune)?;
    let be = CudaBackend::new_tuned(GpuMode::Required, &tuning)
        .context("quire bench-attn needs a CUDA device")?;
    let cpu = CpuBackend::new(None)?;
    let max_b = *a.batch.iter().max().unwrap_or(&1);
    let max_ctx = *a.ctx.iter().max().unwrap_or(&1);
    // Enough blocks for the largest shape, plus one so even that shape's
    // blocks are a random subset of the pool.
    let n_blocks = max_b * max_ctx.div_ceil(bs) + 1;
    let cell = nkv * hd;
    let kv_len = n_blocks * bs * cell;
    eprintln!(
        "bench-attn: {} on {}; pool of {n_blocks} blocks ({:.2} GiB of K+V)",
        format!("{:?}", a.mode).to_lowercase(),
        be.device_description(),
        (4 * kv_len) as f64 / (1u64 << 30) as f64
    );
    let kh = random_f16(kv_len, a.seed ^ 1);
    let vh = random_f16(kv_len, a.seed ^ 2);
    let kd = be.up(&kh, "bench-attn: K pool")?;
    let vd = be.up(&vh, "bench-attn: V pool")?;
    let (kf, vf): (&[f16], &[f16]) = (kh.reinterpret_cast(), vh.reinterpret_cast());
    let scale = 1.0 / (hd as f32).sqrt();
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed);
    let mut rows = Vec::new();
    let pdl = be.pdl_enabled();
    eprintln!(
        "bench-attn: graph edges between kernels: full{}",
        if pdl {
            ", then programmatic (PDL, as in decode graphs)"
        } else {
            " only (no PDL: before sm_90 or --tune runtime.pdl=false)"
        }
    );
    if !a.json {
        println!(
            "| batch | ctx | us/call (graph, PDL) | us/call (graph) | us/call (launches) | GB/s (graph{}) | NMSE vs cpu |",
            if pdl { ", PDL" } else { "" }
        );
        println!("|---|---|---|---|---|---|---|");
    }
    for &b in &a.batch {
        for &ctx in &a.ctx {
            let nb = ctx.div_ceil(bs);
            // A random permutation of the pool; each sequence takes nb.
            let mut perm: Vec<u32> = (0..n_blocks as u32).collect();
            perm.shuffle(&mut rng);
            let tables: Vec<&[u32]> = (0..b).map(|s| &perm[s * nb..(s + 1) * nb]).collect();
            let row_seq: Vec<u32> = (0..b as u32).collect();
            let positions = vec![(ctx - 1) as u32; b];
            let q: Vec<f32> = (0..b * nh * hd)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            let batch = AttnBatch {
                block_tables: &tables,
                row_seq: &row_seq,
                positions: &positions,
            };
            let db = DevAttnBatch::upload(&be, &batch, bs, n_blocks)?;
            let qd = be.up(&q, "bench-attn: q")?;
            let mut od = be.scratch::<f32>(q.len(), "bench-attn: out")?;
            let call = |be: &CudaBackend, od: &mut cudarc::driver::CudaSlice<f32>| {
                <CudaBackend as Backend<Dev>>::run(
                    be,
                    OpT::PagedAttention {
                        q: qd.as_view(),
                        n_heads: nh,
                        scale,
                        cache: DevKv {
                            k: kd.as_view(),
                            v: vd.as_view(),
                            block_size: bs,
                            n_kv_heads: nkv,
                            head_dim: hd,
                        },
                        batch: &db,
                        opts: crate::backend::AttnOpts::none(),
                        out: od.as_view_mut(),
                    },
                    a.mode,
                )
            };
            call(&be, &mut od)?;
            let mut y = vec![0f32; q.len()];
            be.down(&od, &mut y, "bench-attn: out")?;
            // The cpu reference for the first and last sequence.
            let check: Vec<usize> = if b > 1 { vec![0, b - 1] } else { vec![0] };
            let ctables: Vec<&[u32]> = check.iter().map(|&s| tables[s]).collect();
            let cseq: Vec<u32> = (0..check.len() as u32).collect();
            let cpos = vec![(ctx - 1) as u32; check.len()];
            let per = nh * hd;
            let cq: Vec<f32> = check
                .iter()
                .flat_map(|&s| q[s * per..(s + 1) * per].iter().copied())
                .collect();
            let mut r = vec![0f32; cq.len()];
            cpu.run(
                Op::PagedAttention {
                    q: &cq,
                    n_heads: nh,
                    scale,
                    cache: KvLayer {
                        k: kf,
                        v: vf,
                        block_size: bs,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        ty: crate::backend::KvType::F16,
                    },
                    batch: AttnBatch {
                        block_tables: &ctables,
                        row_seq: &cseq,
                        positions: &cpos,
                    },
                    opts: crate::backend::AttnOpts::none(),
                    out: &mut r,
                },
                Mode::Exact,
            )?;
            let yc: Vec<f32> = check
                .iter()
                .flat_map(|&s| y[s * per..(s + 1) * per].iter().copied())
                .collect();
            let cmp = crate::opcheck::compare(&yc, &r);
            let bound = if a.mode == Mode::Exact {
                0.0
            } else {
                crate::opcheck::nmse_bound("paged_attention")
            };
            ensure!(
                cmp.finite_ok && cmp.nmse <= bound && (a.mode != Mode::Exact || cmp.bitwise),
                "bench-attn: B={b} ctx={ctx}: the kernel disagrees with the cpu reference (NMSE {:.3e}, bound {bound:.0e}, bitwise {}, first difference {:?})",
                cmp.nmse,
                cmp.bitwise,
                cmp.first_diff
            );
            for _ in 0..10 {
                call(&be, &mut od)?;
            }
            let ev = |what| {
                be.stream()
                    .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .with_context(|| format!("bench-attn: recording the {what} event"))
            };
            let iters = a.iters.max(1);
            let t0 = ev("start")?;
            for _ in 0..iters {
                call(&be, &mut od)?;
            }
            let t1 = ev("end")?;
            let ms = t0.elapsed_ms(&t1).context("bench-attn: event timing")? as f64;
            let us_launch = 1e3 * ms / iters as f64;
            // The same calls captured into one CUDA graph (as a decode step
            // runs them): device time without the host's per-call work.
            let st = be.stream();
            st.begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .context("bench-attn: beginning graph capture")?;
            let captured = (0..GRAPH_CALLS).try_for_each(|_| call(&be, &mut od));
            let graph = st
                .end_capture(
                    cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
                )
                .context("bench-attn: ending graph capture");
            captured?;
            let graph = graph?.context("bench-attn: graph capture produced no graph")?;
            let reps = iters.div_ceil(GRAPH_CALLS);
            let time_reps = |launch: &dyn Fn() -> Result<()>| -> Result<f64> {
                launch().context("bench-attn: graph warm-up")?;
                let t0 = ev("start")?;
                for _ in 0..reps {
                    launch().context("bench-attn: graph launch")?;
                }
                let t1 = ev("end")?;
                let ms = t0.elapsed_ms(&t1).context("bench-attn: event timing")? as f64;
                Ok(1e3 * ms / (reps * GRAPH_CALLS) as f64)
            };
            let us = time_reps(&|| Ok(graph.launch()?))?;
            // The same graph's kernel-to-kernel edges made programmatic (it
            // is instantiated anew; `graph`'s own exec keeps full edges).
            let us_pdl = if pdl {
                let (exec, _) = be
                    .instantiate_pdl(graph.cu_graph())
                    .context("bench-attn: graph with programmatic edges")?;
                Some(time_reps(&|| be.launch_pdl(&exec))?)
            } else {
                None
            };
            let us_best = us_pdl.unwrap_or(us);
            let bytes = (b * ctx * cell * 2 * 2 + 2 * q.len() * 4) as f64;
            let row = Row {
                batch: b,
                ctx,
                us,
                us_pdl,
                us_launch,
                gbps: bytes / (us_best * 1e-6) / 1e9,
                nmse: cmp.nmse,
                bitwise: cmp.bitwise,
            };
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "engine": "quire",
                        "mode": format!("{:?}", a.mode).to_lowercase(),
                        "batch": b, "ctx": ctx, "heads": nh, "kv_heads": nkv,
                        "head_dim": hd, "block_size": bs,
                        "us": row.us, "us_pdl": row.us_pdl, "us_launch": row.us_launch, "gbps": row.gbps,
                        "nmse": row.nmse, "bitwise": row.bitwise,
                    })
                );
            } else {
                println!(
                    "| {b} | {ctx} | {} | {:.2} | {:.2} | {:.0} | {:.2e}{} |",
                    row.us_pdl.map_or("-".to_string(), |u| format!("{u:.2}")),
                    row.us,
                    row.us_launch,
                    row.gbps,
                    row.nmse,
                    if row.bitwise { " (bitwise)" } else { "" }
                );
            }
            rows.push(row);
        }
    }
    if let Some(path) = &a.plot {
        use super::plot::{write_png, Panel, Series};
        let series = a
            .batch
            .iter()
            .map(|&b| Series {
                label: format!("B={b}"),
                points: rows
                    .iter()
                    .filter(|r| r.batch == b)
                    .map(|r| (r.ctx as f64, r.gbps))
                    .collect(),
            })
            .collect();
        write_png(
            path,
            &format!("quire paged decode attention: {nh} heads, {nkv} KV heads, head_dim {hd}, block {bs}"),
            &[Panel {
                title: "achieved bandwidth (K+V+q+out bytes / time)".into(),
                x_label: "context length".into(),
                y_label: "GB/s".into(),
                series,
            }],
        )?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(())
}
