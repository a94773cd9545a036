//! Parity cases of `norm_mat_muls` (RmsNorm, then matmuls of its output):
//! the normalized row and every job's output against the cpu reference
//! like every op, and on the backend under test against its own `RmsNorm`
//! then `MatMuls` (the fused op must give those bits in every mode). One
//! activation row at small sizes is where the cuda backend fuses the two
//! (`mv_q8_norm_r1*`); the other shapes check its two-launch path.

use super::mat_muls::{jobs, split_outs};
use super::{randv, CaseResult, Ctx, Guarded, Status};
use crate::backend::{Op, QMatrix};
use crate::quant::GgmlType;

/// One case: (job rows, dim, activation rows, adds).
type Shape = (Vec<usize>, usize, usize, Vec<bool>);

/// One case's inputs; `op` builds the op over an output buffer laid out
/// as the normalized rows, then each job's output.
struct Case<'c> {
    x: &'c [f32],
    nw: &'c [f32],
    ws: &'c [QMatrix<'c>],
    lens: &'c [usize],
    adds: &'c [bool],
    eps: f32,
    n: usize,
}

impl<'c> Case<'c> {
    fn op<'o>(&self, buf: &'o mut [f32]) -> Op<'o>
    where
        'c: 'o,
    {
        let mut outs = split_outs(buf, self.lens).into_iter();
        let h = outs.next().unwrap_or_default();
        Op::NormMatMuls {
            x: self.x,
            w: self.nw,
            dim: self.nw.len(),
            eps: self.eps,
            out: h,
            n: self.n,
            jobs: jobs(self.ws, outs.collect(), self.adds),
        }
    }
}

impl Ctx<'_> {
    pub(super) fn norm_mat_muls(&mut self) {
        if !self.want("norm_mat_muls") {
            return;
        }
        use GgmlType::*;
        let types: &[GgmlType] = if self.opts.quick {
            &[F16, Q4_0, Q8_0, Q4_K, Q6_K]
        } else {
            &[
                F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
            ]
        };
        // q/k/v and gate/up decode (SmolLM2's 576: fewer float4s than
        // threads; 2048 and 4096: one and four float4s per thread), rows
        // not a multiple of 8 (a CTA's last warps idle), an adding job, a
        // long row (k >= 3 m: two warps per row in `fast`), and batched
        // rows (the two-launch path).
        let shapes: Vec<Shape> = vec![
            (vec![64, 16, 16], 576, 1, vec![false, false, false]),
            (vec![96, 96], 576, 1, vec![false, false]),
            (vec![37, 11], 2048, 1, vec![false, true]),
            (vec![200], 4096, 1, vec![false]),
            (vec![40], 1024, 1, vec![true]),
            (vec![40, 40], 512, 3, vec![false, true]),
            (vec![33, 20], 256, 17, vec![false, false]),
        ];
        for &ty in types {
            // (K-quants need rows of whole 256-superblocks.)
            for (ms, dim, n, adds) in shapes.iter().filter(|s| s.1 % ty.block_size() == 0) {
                self.norm_mat_muls_case(ty, ms, *dim, *n, adds);
            }
        }
    }

    fn norm_mat_muls_case(&mut self, ty: GgmlType, ms: &[usize], dim: usize, n: usize, adds: &[bool]) {
        let mode = self.opts.mode;
        let desc = format!("{ty:?} m={ms:?} dim={dim} n={n} add={adds:?}");
        let datas: Vec<Vec<u8>> = match ms
            .iter()
            .map(|&m| crate::quant::quantize(ty, &randv(&mut self.rng, m * dim, 1.0)))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(d) => d,
            Err(e) => {
                self.results.push(CaseResult {
                    op: "norm_mat_muls",
                    desc,
                    status: Status::Fail(format!("quantizing the weights: {e}")),
                    nmse: f64::NAN,
                    bitwise: false,
                    perf: None,
                });
                return;
            }
        };
        let ws: Vec<QMatrix<'_>> = ms
            .iter()
            .zip(&datas)
            .map(|(&m, d)| QMatrix {
                ty,
                rows: m,
                cols: dim,
                data: d,
            })
            .collect();
        let x = randv(&mut self.rng, n * dim, 2.0);
        // Norm weights around 1, as trained models have them.
        let nw: Vec<f32> = randv(&mut self.rng, dim, 0.5)
            .iter()
            .map(|v| 1.0 + v)
            .collect();
        let eps = 1e-5f32;
        // Buffer layout: the normalized rows, then each job's output.
        let mut lens = vec![n * dim];
        lens.extend(ms.iter().map(|m| n * m));
        let mut init = randv(&mut self.rng, lens.iter().sum(), 3.0);
        // The normalized rows are an output only (start them as garbage).
        init[..n * dim].fill(f32::NAN);
        let mut r = init.clone();
        let mut y = Guarded::from(&init);
        let c = Case {
            x: &x,
            nw: &nw,
            ws: &ws,
            lens: &lens,
            adds,
            eps,
            n,
        };
        let sup = self.be.supports_op(&c.op(y.body_mut()), mode);
        let mut err = None;
        let mut unfused_diff = None;
        if sup {
            if let Err(e) = self.cpu.run(c.op(&mut r), mode) {
                err = Some(format!("cpu reference: {e:#}"));
            } else if let Err(e) = self.be.run(c.op(y.body_mut()), mode) {
                err = Some(format!("{e:#}"));
            } else {
                match self.norm_unfused(&ws, &x, &nw, eps, n, adds, &init, &lens) {
                    Ok(u) => {
                        let diff = u.iter().zip(y.body()).position(|(a, b)| {
                            a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())
                        });
                        if let Some(i) = diff {
                            unfused_diff = Some(format!(
                                "differs from rms_norm then mat_muls on this backend at {i}: {:e} vs {:e}",
                                y.body()[i],
                                u[i]
                            ));
                        }
                    }
                    Err(e) => err = Some(format!("unfused rms_norm / mat_muls: {e:#}")),
                }
            }
        }
        let g = y.guards_ok();
        self.finish("norm_mat_muls", desc, sup, err, y.body(), &r, g, None);
        if let (Some(why), Some(last)) = (unfused_diff, self.results.last_mut()) {
            if last.status == Status::Pass {
                last.status = Status::Fail(why);
            }
        }
        self.keep.extend(datas);
    }

    /// The same as `RmsNorm` then `MatMuls` ops on the backend under test.
    #[allow(clippy::too_many_arguments)]
    fn norm_unfused(
        &self,
        ws: &[QMatrix<'_>],
        x: &[f32],
        nw: &[f32],
        eps: f32,
        n: usize,
        adds: &[bool],
        init: &[f32],
        lens: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        let mode = self.opts.mode;
        let dim = nw.len();
        let mut out = init.to_vec();
        let mut outs = split_outs(&mut out, lens).into_iter();
        let h = outs.next().unwrap_or_default();
        self.be.run(
            Op::RmsNorm {
                x,
                w: nw,
                dim,
                eps,
                out: &mut *h,
            },
            mode,
        )?;
        self.be.run(
            Op::MatMuls {
                x: &*h,
                n,
                jobs: jobs(ws, outs.collect(), adds),
            },
            mode,
        )?;
        Ok(out)
    }
}
