//! Parity cases of `mat_muls` (several matmuls of one input, some adding
//! into their outputs): against the cpu reference like every op, and on the
//! backend under test against its own `MatMul` then `Add` (the fused op
//! must give those bits in every mode; in `fast` mode the wgmma prefill
//! GEMM plans an op's jobs together, so the shapes here are ones whose
//! plans agree: docs/DETERMINISM.md).

use super::{randv, CaseResult, Ctx, Guarded, Status};
use crate::backend::{Host, MatJob, Op, QMatrix};
use crate::quant::GgmlType;

/// Prefill tiles of the wgmma GEMM (sm_90; 32-value block types, k a
/// multiple of 256), as (job rows, k, n, adds): several 128-row weight
/// tiles and 128- or 256-token tiles with ragged ends; an even and an odd
/// number of 256-value raw superchunks, and a long k (32 chunks through
/// the stage rings). k = 320 takes the other prefill path. Their jobs'
/// k-split plans agree together and alone (checked in
/// `backend::cuda::launch::matmul_wgmma`'s tests), so the fused-vs-unfused
/// bit check holds for them in `fast` mode too.
pub(crate) const WIDE_SHAPES: &[(&[usize], usize, usize, &[bool])] = &[
    (&[300, 200], 512, 200, &[false, true]),
    (&[130, 70, 260], 768, 150, &[true, false, false]),
    (&[200], 2048, 300, &[true]),
    (&[300, 200], 320, 200, &[false, true]),
];

/// The first index where `a` and `b` differ in bits (NaNs of any payload
/// count as equal).
pub(super) fn first_bit_diff(a: &[f32], b: &[f32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()))
}

/// The weight types of the fused-matmul groups (`--quick`: one of each
/// family).
pub(super) fn fused_types(quick: bool) -> &'static [GgmlType] {
    use GgmlType::*;
    if quick {
        &[F16, Q4_0, Q8_0, Q4_K]
    } else {
        &[F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K]
    }
}

/// Why a fused op's result `y` is not its unfused ops' `u` bit for bit
/// (`what`: those ops, for the message), or None.
pub(super) fn unfused_bits(what: &str, y: &[f32], u: &[f32]) -> Option<String> {
    first_bit_diff(u, y).map(|i| {
        format!(
            "differs from {what} on this backend at {i}: {:e} vs {:e}",
            y[i], u[i]
        )
    })
}

/// QMatrix views of the job weights `datas` (rows `ms`, k columns).
pub(super) fn job_matrices<'a>(
    ty: GgmlType,
    ms: &[usize],
    k: usize,
    datas: &'a [Vec<u8>],
) -> Vec<QMatrix<'a>> {
    ms.iter()
        .zip(datas)
        .map(|(&m, d)| QMatrix {
            ty,
            rows: m,
            cols: k,
            data: d,
        })
        .collect()
}

/// Splits `buf` into consecutive outputs of `lens` elements.
pub(super) fn split_outs<'b>(mut buf: &'b mut [f32], lens: &[usize]) -> Vec<&'b mut [f32]> {
    let mut v = Vec::with_capacity(lens.len());
    for &l in lens {
        let (a, b) = buf.split_at_mut(l);
        v.push(a);
        buf = b;
    }
    v
}

/// The jobs of weights `ws` into `outs`, adding where `adds` says.
pub(super) fn jobs<'a>(
    ws: &[QMatrix<'a>],
    outs: Vec<&'a mut [f32]>,
    adds: &[bool],
) -> Vec<MatJob<'a, Host>> {
    ws.iter()
        .zip(outs)
        .zip(adds)
        .map(|((&w, out), &add)| MatJob { w, out, add })
        .collect()
}

impl Ctx<'_> {
    /// Random weights of `ty` for each job's `ms` rows x k, quantized; on
    /// a quantizer error a failed case of `op` and None.
    pub(super) fn job_weights(
        &mut self,
        op: &'static str,
        ty: GgmlType,
        ms: &[usize],
        k: usize,
        n: usize,
    ) -> Option<Vec<Vec<u8>>> {
        let datas = ms
            .iter()
            .map(|&m| crate::quant::quantize(ty, &randv(&mut self.rng, m * k, 1.0)))
            .collect::<Result<Vec<_>, _>>();
        match datas {
            Ok(d) => Some(d),
            Err(e) => {
                self.results.push(CaseResult {
                    op,
                    desc: format!("{ty:?} k={k} n={n}"),
                    status: Status::Fail(format!("quantizing the weights: {e}")),
                    nmse: f64::NAN,
                    bitwise: false,
                    perf: None,
                });
                None
            }
        }
    }

    pub(super) fn mat_muls(&mut self) {
        if !self.want("mat_muls") {
            return;
        }
        use GgmlType::*;
        let mode = self.opts.mode;
        if self.opts.wave_tail_forced {
            eprintln!(
                "mat_muls: fused-vs-unfused bit check SKIPPED: matmul.wr_tail_sms plans a \
                 wave tail per launch (the cpu comparison runs)"
            );
        }
        let types: &[GgmlType] = if self.opts.quick {
            &[F16, Q4_0, Q8_0, Q4_K, Q6_K]
        } else {
            &[
                F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
            ]
        };
        // (job rows, k, n, adds): q/k/v and gate/up decode, a residual
        // projection, the batched-decode and prefill row counts, four jobs;
        // prefill-sized jobs of one shape (the cuBLAS path batches them:
        // k and v, gate and up, also adding).
        let mut shapes: Vec<(Vec<usize>, usize, usize, Vec<bool>)> = vec![
            (vec![64, 16, 16], 512, 1, vec![false, false, false]),
            // One row of k = 2,048 (two 32-value units per lane of the
            // warp-per-row kernel), the second job adding.
            (vec![48, 16], 2048, 1, vec![false, true]),
            (vec![40, 40], 512, 3, vec![false, true]),
            // k = 1,280: a whole group of 32 blocks and a tail of 8, with an
            // odd job (a warp of one row): both paths of the exact decode
            // matvec (kernels/matmul.cu mv_exact_rows), one row and three.
            (vec![37, 16], 1280, 3, vec![false, true]),
            (vec![37], 1280, 1, vec![true]),
            (vec![72], 768, 1, vec![true]),
            (vec![33, 97], 512, 17, vec![true, false]),
            (vec![130, 7], 256, 70, vec![true, true]),
            (vec![16, 8, 8, 24], 256, 5, vec![false, true, false, true]),
            (vec![48, 16, 16], 256, 70, vec![false, false, false]),
            (vec![32, 32], 256, 100, vec![true, true]),
        ];
        let wide: Vec<(Vec<usize>, usize, usize, Vec<bool>)> = WIDE_SHAPES
            .iter()
            .map(|&(ms, k, n, adds)| (ms.to_vec(), k, n, adds.to_vec()))
            .collect();
        for &ty in types {
            let float_w = matches!(ty, F32 | F16 | BF16);
            if float_w {
                shapes.push((vec![5, 9], 33, 2, vec![true, false]));
            }
            let extra: &[_] = if ty.block_size() <= 32 { &wide } else { &[] };
            for (ms, k, n, adds) in shapes.iter().chain(extra) {
                let (k, n) = (*k, *n);
                let Some(datas) = self.job_weights("mat_muls", ty, ms, k, n) else {
                    continue;
                };
                let ws = job_matrices(ty, ms, k, &datas);
                let x = randv(&mut self.rng, n * k, 2.0);
                let lens: Vec<usize> = ms.iter().map(|m| n * m).collect();
                let init = randv(&mut self.rng, lens.iter().sum(), 3.0);
                let mut r = init.clone();
                let mut y = Guarded::from(&init);
                let desc = format!("{ty:?} m={ms:?} k={k} n={n} add={adds:?}");
                let sup = self.be.supports_op(
                    &Op::MatMuls {
                        x: &x,
                        n,
                        jobs: jobs(&ws, split_outs(y.body_mut(), &lens), adds),
                        norm: None,
                        next_norm: None,
                        glu: None,
                    },
                    mode,
                );
                let mut err = None;
                let mut unfused_diff = None;
                // A forced wave tail (Options::wave_tail_forced) is planned
                // per launch, so fused and unfused launches differ in bits
                // by design there; the cpu comparison still runs.
                let bits = !self.opts.wave_tail_forced;
                if sup {
                    if let Err(e) = self.cpu.run(
                        Op::MatMuls {
                            x: &x,
                            n,
                            jobs: jobs(&ws, split_outs(&mut r, &lens), adds),
                            norm: None,
                            next_norm: None,
                            glu: None,
                        },
                        mode,
                    ) {
                        err = Some(format!("cpu reference: {e:#}"));
                    } else if let Err(e) = self.be.run(
                        Op::MatMuls {
                            x: &x,
                            n,
                            jobs: jobs(&ws, split_outs(y.body_mut(), &lens), adds),
                            norm: None,
                            next_norm: None,
                            glu: None,
                        },
                        mode,
                    ) {
                        err = Some(format!("{e:#}"));
                    } else {
                        match self.unfused(&ws, &x, n, adds, &init, &lens) {
                            Ok(_) if !bits => {}
                            Ok(u) => unfused_diff = unfused_bits("mat_mul then add", y.body(), &u),
                            Err(e) => err = Some(format!("unfused mat_mul / add: {e:#}")),
                        }
                    }
                }
                let g = y.guards_ok();
                self.finish("mat_muls", desc, sup, err, y.body(), &r, g, None);
                self.fail_last(unfused_diff);
                self.keep.extend(datas);
            }
            if float_w {
                shapes.pop();
            }
        }
    }

    /// The same jobs as `MatMul` then `Add` ops on the backend under test.
    fn unfused(
        &self,
        ws: &[QMatrix<'_>],
        x: &[f32],
        n: usize,
        adds: &[bool],
        init: &[f32],
        lens: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        let mode = self.opts.mode;
        let mut out = init.to_vec();
        for ((w, &add), o) in ws.iter().zip(adds).zip(split_outs(&mut out, lens)) {
            let mut p = vec![0f32; o.len()];
            self.be.run(
                Op::MatMul {
                    w: *w,
                    x,
                    n,
                    out: &mut p,
                },
                mode,
            )?;
            if add {
                self.be.run(Op::Add { x: o, y: &p }, mode)?;
            } else {
                o.copy_from_slice(&p);
            }
        }
        Ok(out)
    }
}
