//! Parity cases of norm-ahead (cuda, `fast` mode, one row;
//! ops/matmul/norm_ahead.rs): a residual `MatMuls` with `next_norm` (the
//! producer, `mv_q8_r1_na`) and right after it a `MatMuls` carrying that
//! norm on that residual (the consumer, `mv_q8_r1_nc` or a split-row
//! form), run as device ops on device buffers (host ops upload every input
//! afresh, so no hint could reach the next op), against the cpu's same two
//! ops: the residual and the consumer's outputs each within the matmul
//! NMSE bound, non-finite positions equal, guard values around every
//! output intact, and the norm-ahead path must have run.

use super::{graded, randv, CaseResult, Guarded, Options, Status, GUARD};
use crate::backend::cuda::device::memory::DevMatrix;
use crate::backend::cuda::fusion::OpFusion;
use crate::backend::cuda::{CudaBackend, Switch};
use crate::backend::{Backend, MatJob, MatNorm, Mode, Op, OpT, QMatrix};
use crate::quant::GgmlType;
use anyhow::{Context, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::Ordering;

/// (dim: the residual's width and the consumer's k, the producer's k, the
/// consumer's job rows, whether the consumer is a gate/up op with its
/// SwiGlu): an o projection into q/k/v at SmolLM2's width (18 blocks), a
/// down projection into gate/up, a 1B-shaped down into q/k/v, a consumer
/// with rows long enough (k >= 3 m) for the split-row form, and the 1B's
/// o projection into its gate/up with the SwiGlu (256 blocks: the fused
/// `mv_q8_r1_glu16_nc` for 32-value block types) and SmolLM2's (48
/// blocks: `mv_q8_r1_glu32_nc`, `glu_form`'s choice on norm-ahead's
/// input); the K-quants take the matvec then `swiglu` in both.
type Shape = (usize, usize, &'static [usize], bool);
const SHAPES: &[Shape] = &[
    (576, 576, &[64, 16, 16], false),
    (576, 1536, &[192, 192], false),
    (2048, 8192, &[256, 64, 64], false),
    (256, 512, &[64], false),
    (2048, 2048, &[8192, 8192], true),
    (576, 576, &[1536, 1536], true),
];

/// Runs the cases with norm-ahead switched on in `cuda` (mode `fast` only:
/// the path exists nowhere else; other modes get no cases).
pub fn run(cuda: &mut CudaBackend, cpu: &dyn Backend, opts: &Options) -> Vec<CaseResult> {
    let mut out = Vec::new();
    if opts.mode != Mode::Fast
        || opts
            .op_filter
            .as_deref()
            .is_some_and(|f| !"norm_ahead".contains(f))
    {
        return out;
    }
    let was = cuda.tuning.matvec.norm_ahead;
    cuda.tuning.matvec.norm_ahead = Switch::On;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ 0x6e6f_726d);
    use GgmlType::*;
    let types: &[GgmlType] = if opts.quick {
        &[Q4_0, Q8_0, Q4_K]
    } else {
        &[Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
    };
    for &ty in types {
        for &(dim, k_in, rows, glu) in SHAPES {
            let bs = ty.block_size();
            if !dim.is_multiple_of(bs) || !k_in.is_multiple_of(bs) {
                continue; // not a shape of this type
            }
            // Finite values only: the cpu's canonical quantization reads a
            // NaN activation as 0 where `fast` propagates it (the harness
            // feeds NaN to quantized matmuls in exact mode only;
            // DETERMINISM.md), and an Inf in the residual makes the norm's
            // products NaN.
            let desc = format!("{ty:?} dim={dim} k={k_in} rows={rows:?} glu={glu}");
            out.extend(case(cuda, cpu, &mut rng, ty, (dim, k_in, rows, glu), &desc));
        }
    }
    cuda.tuning.matvec.norm_ahead = was;
    out
}

/// A host weight matrix of `ty` over `data` (r rows of c values).
fn qm(ty: GgmlType, data: &[u8], r: usize, c: usize) -> QMatrix<'_> {
    QMatrix {
        ty,
        rows: r,
        cols: c,
        data,
    }
}

/// A device copy of the harness's guarded buffer of `init` (its body at
/// GUARD..GUARD + len).
fn guarded(cuda: &CudaBackend, init: &[f32]) -> Result<cudarc::driver::CudaSlice<f32>> {
    cuda.up(
        &Guarded::from(init).buf,
        "norm_ahead case: a guarded buffer",
    )
}

/// A guarded device buffer of body length `len`, downloaded: its body and
/// whether its guards held.
fn body(
    cuda: &CudaBackend,
    d: &cudarc::driver::CudaSlice<f32>,
    len: usize,
) -> Result<(Vec<f32>, bool)> {
    let mut g = Guarded::new(len);
    cuda.down(d, &mut g.buf, "norm_ahead case: downloading")?;
    Ok((g.body().to_vec(), g.guards_ok()))
}

fn case(
    cuda: &CudaBackend,
    cpu: &dyn Backend,
    rng: &mut ChaCha8Rng,
    ty: GgmlType,
    (dim, k_in, rows, glu): Shape,
    desc: &str,
) -> Vec<CaseResult> {
    let fail = |why: String| {
        ["x", "out", "glu"][..if glu { 3 } else { 2 }]
            .iter()
            .map(|part| CaseResult {
                op: "norm_ahead",
                desc: format!("{part}: {desc}"),
                status: Status::Fail(why.clone()),
                nmse: f64::NAN,
                bitwise: false,
                perf: None,
            })
            .collect()
    };
    // Inputs: the producer's activations and weights, the residual, the
    // norm's weights (both signs), the consumer's weights and outputs.
    let a = randv(rng, k_in, 2.0);
    let x0 = randv(rng, dim, 3.0);
    let g = randv(rng, dim, 1.5);
    let eps = 1e-5f32;
    let quant = |rng: &mut ChaCha8Rng, r: usize, c: usize| {
        crate::quant::quantize(ty, &randv(rng, r * c, 1.0))
    };
    let wp = match quant(rng, dim, k_in) {
        Ok(w) => w,
        Err(e) => return fail(format!("quantize: {e}")),
    };
    let mut wc = Vec::new();
    for &m in rows {
        match quant(rng, m, dim) {
            Ok(w) => wc.push(w),
            Err(e) => return fail(format!("quantize: {e}")),
        }
    }
    // The cpu's residual product.
    let mut x_ref = x0.clone();
    let r1 = cpu.run(
        Op::MatMuls {
            x: &a,
            n: 1,
            jobs: vec![MatJob {
                w: qm(ty, &wp, dim, k_in),
                out: &mut x_ref,
                add: true,
            }],
            norm: None,
            next_norm: None,
            glu: None,
        },
        Mode::Fast,
    );
    if let Err(e) = r1 {
        return fail(format!("cpu reference: {e:#}"));
    }
    let Some(fusion) = pass_pair(cuda, ty, (dim, k_in, rows, glu), eps) else {
        return fail("the fusion pass does not plan these ops as norm-ahead's pair".into());
    };
    let before = cuda.norm_ahead_runs.load(Ordering::Relaxed);
    let dev = device_pair(
        cuda,
        (&a, &x0, &g, eps),
        (&wp, &wc),
        ty,
        (dim, k_in, rows, glu),
        fusion,
    );
    let ((x_dev, x_ok), outs_dev, glu_dev) = match dev {
        Ok(v) => v,
        Err(e) => return fail(format!("{e:#}")),
    };
    if cuda.norm_ahead_runs.load(Ordering::Relaxed) != before + 1 {
        return fail("the consumer did not take norm-ahead's blocks (the path did not run)".into());
    }
    let mut outs_ref: Vec<Vec<f32>> = rows.iter().map(|&m| vec![0f32; m]).collect();
    let mut scratch = vec![0f32; dim];
    let mut glu_ref = vec![0f32; if glu { rows[0] } else { 0 }];
    // The consumer's reference reads the device's residual, so each stage is
    // graded against the cpu on the inputs it had: against the cpu's own
    // residual, the consumer's error would also carry the producer's (two
    // activation quantizations stacked; measured up to 1.01e-4 on 64 rows,
    // over the matmul bound, on the first device run).
    let r2 = cpu.run(
        Op::MatMuls {
            x: &x_dev,
            n: 1,
            jobs: wc
                .iter()
                .zip(outs_ref.iter_mut())
                .zip(rows)
                .map(|((w, o), &m)| MatJob {
                    w: qm(ty, w, m, dim),
                    out: o.as_mut_slice(),
                    add: false,
                })
                .collect(),
            norm: Some(MatNorm {
                w: &g,
                eps,
                out: &mut scratch,
            }),
            next_norm: None,
            glu: glu.then_some(glu_ref.as_mut_slice()),
        },
        Mode::Fast,
    );
    if let Err(e) = r2 {
        return fail(format!("cpu reference: {e:#}"));
    }
    let mut res = vec![graded(
        "norm_ahead",
        format!("x: {desc}"),
        Mode::Fast,
        &x_dev,
        &x_ref,
        x_ok,
        None,
    )];
    let all_dev: Vec<f32> = outs_dev
        .iter()
        .flat_map(|(o, _)| o.iter().copied())
        .collect();
    let all_ref: Vec<f32> = outs_ref.concat();
    let ok = outs_dev.iter().all(|(_, ok)| *ok);
    res.push(graded(
        "norm_ahead",
        format!("out: {desc}"),
        Mode::Fast,
        &all_dev,
        &all_ref,
        ok,
        None,
    ));
    if let Some((h, h_ok)) = glu_dev {
        // silu(gate) * up: the SwiGlu's bound (both products' errors).
        res.push(graded(
            "norm_ahead_glu",
            format!("glu: {desc}"),
            Mode::Fast,
            &h,
            &glu_ref,
            h_ok,
            None,
        ));
    }
    res
}

/// The residual, the consumer's outputs and its SwiGlu (if any), each with
/// whether its guards held.
type Pair = (
    (Vec<f32>, bool),
    Vec<(Vec<f32>, bool)>,
    Option<(Vec<f32>, bool)>,
);

/// An uploaded weight matrix of `ty` ((rows, cols), `len` bytes of data).
fn dev_mat(
    ty: GgmlType,
    (rows, cols): (usize, usize),
    d: &cudarc::driver::CudaSlice<u8>,
    len: usize,
) -> DevMatrix<'_> {
    DevMatrix {
        ty,
        rows,
        cols,
        data: d.slice(0..len),
    }
}

/// The fusion pass's annotations of the case's two ops (backend/cuda/
/// fusion.rs, under the backend's tuning), where it plans them as
/// norm-ahead's producer and consumer: the device runs them with these,
/// as an executor runs a planned step.
fn pass_pair(
    cuda: &CudaBackend,
    ty: GgmlType,
    (dim, k_in, rows, glu): Shape,
    eps: f32,
) -> Option<(OpFusion, OpFusion)> {
    use crate::backend::cuda::fusion::{plan, ActRead, JobDesc, MatOp, NormDesc, StepOp};
    // Buffers: the producer's input, the residual, the norm's scratch, the
    // SwiGlu's output, the consumer's outputs; one norm.
    let (a, x, h, act, norm_w) = (0, 1, 2, 3, 0);
    let producer = StepOp::MatMuls(MatOp {
        x: a,
        n: 1,
        k: k_in,
        ty,
        jobs: vec![JobDesc {
            m: dim,
            add: true,
            out: x,
        }],
        norm: None,
        next_norm: Some((norm_w, eps.to_bits())),
        glu: None,
        reads: ActRead::Q8,
    });
    let consumer = StepOp::MatMuls(MatOp {
        x,
        n: 1,
        k: dim,
        ty,
        jobs: (4..)
            .zip(rows)
            .map(|(out, &m)| JobDesc { m, add: false, out })
            .collect(),
        norm: Some(NormDesc {
            w: norm_w,
            eps: eps.to_bits(),
            scratch: h,
        }),
        next_norm: None,
        glu: glu.then_some(act),
        reads: ActRead::Q8,
    });
    // With the SwiGlu, the down projection that reads it in a model (not
    // run here): the consumer's annotation writes its int8 blocks, as in
    // a decode step, so the gate/up op may take the fused launch.
    let down = StepOp::MatMuls(MatOp {
        x: act,
        n: 1,
        k: rows[0],
        ty,
        jobs: vec![JobDesc {
            m: dim,
            add: true,
            out: x,
        }],
        norm: None,
        next_norm: None,
        glu: None,
        reads: ActRead::Q8,
    });
    let ops = if glu {
        vec![producer, consumer, down]
    } else {
        vec![producer, consumer]
    };
    let f = plan(&ops, Mode::Fast, &cuda.tuning.matvec);
    let (p, c) = (f.ops[0], f.ops[1]);
    (p.ahead_producer && c.ahead_consumer).then_some((p, c))
}

/// The producer then the consumer as device ops; the residual and the
/// consumer's outputs downloaded with their guards' state.
fn device_pair(
    cuda: &CudaBackend,
    (a, x0, g, eps): (&[f32], &[f32], &[f32], f32),
    (wp, wc): (&[u8], &[Vec<u8>]),
    ty: GgmlType,
    (dim, k_in, rows, glu): Shape,
    (fp, fc): (OpFusion, OpFusion),
) -> Result<Pair> {
    let a_d = cuda.up(a, "norm_ahead case: activations")?;
    let g_d = cuda.up(g, "norm_ahead case: norm weights")?;
    let mut x_d = guarded(cuda, x0)?;
    let wp_d = cuda.up_weight(wp, "norm_ahead case: producer weights")?;
    let wc_d = wc
        .iter()
        .map(|w| cuda.up_weight(w, "norm_ahead case: consumer weights"))
        .collect::<Result<Vec<_>>>()?;
    let mut outs_d = rows
        .iter()
        .map(|&m| guarded(cuda, &vec![0f32; m]))
        .collect::<Result<Vec<_>>>()?;
    let mut scratch_d = cuda.up(&vec![0f32; dim], "norm_ahead case: norm scratch")?;
    let mut glu_d = if glu {
        Some(guarded(cuda, &vec![0f32; rows[0]])?)
    } else {
        None
    };
    cuda.run_fused(
        OpT::MatMuls {
            x: a_d.slice(0..k_in),
            n: 1,
            jobs: vec![MatJob {
                w: dev_mat(ty, (dim, k_in), &wp_d, wp.len()),
                out: x_d.slice_mut(GUARD..GUARD + dim),
                add: true,
            }],
            norm: None,
            next_norm: Some((g_d.slice(0..dim), eps)),
            glu: None,
        },
        Mode::Fast,
        Some(fp),
    )
    .context("producer")?;
    let jobs = outs_d
        .iter_mut()
        .zip(&wc_d)
        .zip(wc)
        .zip(rows)
        .map(|(((o, w), h), &m)| MatJob {
            w: dev_mat(ty, (m, dim), w, h.len()),
            out: o.slice_mut(GUARD..GUARD + m),
            add: false,
        })
        .collect();
    cuda.run_fused(
        OpT::MatMuls {
            x: x_d.slice(GUARD..GUARD + dim),
            n: 1,
            jobs,
            norm: Some(MatNorm {
                w: g_d.slice(0..dim),
                eps,
                out: scratch_d.slice_mut(0..dim),
            }),
            next_norm: None,
            glu: glu_d.as_mut().map(|h| h.slice_mut(GUARD..GUARD + rows[0])),
        },
        Mode::Fast,
        Some(fc),
    )
    .context("consumer")?;
    let x = body(cuda, &x_d, dim)?;
    let outs = outs_d
        .iter()
        .zip(rows)
        .map(|(o, &m)| body(cuda, o, m))
        .collect::<Result<Vec<_>>>()?;
    let h = match &glu_d {
        Some(h) => Some(body(cuda, h, rows[0])?),
        None => None,
    };
    Ok((x, outs, h))
}
