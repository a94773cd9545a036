//! Parity cases of `mat_muls` with its input's RMS norm
//! (`OpT::MatMuls::norm`): against the cpu reference like every op, and on
//! the backend under test against its own `RmsNorm` then `MatMuls` (the
//! fused op must give those bits in every mode, whatever a backend fuses).

use super::mat_muls::{fused_types, job_matrices, jobs, split_outs, unfused_bits};
use super::{randv, Ctx, Guarded};
use crate::backend::{MatNorm, Op, QMatrix};

/// (job rows, k, n, adds): decode rows (q/k/v of a small head layout,
/// gate/up, the SmolLM2 width k = 576, a 2,048-wide row with two units
/// per lane, ragged CTA tails: 8 rows per CTA), several rows (the
/// unfolded path of every backend), and a prefill-sized batch.
const SHAPES: &[(&[usize], usize, usize, &[bool])] = &[
    (&[64, 16, 16], 512, 1, &[false, false, false]),
    (&[96, 96], 576, 1, &[false, false]),
    (&[40, 13], 2048, 1, &[false, false]),
    (&[24], 256, 1, &[true]),
    (&[64], 4096, 1, &[false]),
    (&[40, 24], 512, 3, &[false, false]),
    (&[32, 32], 256, 70, &[false, true]),
];

impl Ctx<'_> {
    pub(super) fn mat_muls_norm(&mut self) {
        if !self.want("mat_muls_norm") {
            return;
        }
        let mode = self.opts.mode;
        for &ty in fused_types(self.opts.quick) {
            for &(ms, k, n, adds) in SHAPES {
                if !k.is_multiple_of(ty.block_size()) {
                    continue; // not a shape of this type
                }
                let Some(datas) = self.job_weights("mat_muls_norm", ty, ms, k, n) else {
                    continue;
                };
                let ws = job_matrices(ty, ms, k, &datas);
                // Rows of different scales (what the norm takes out), and
                // norm weights of both signs.
                let mut x = randv(&mut self.rng, n * k, 3.0);
                for (r, row) in x.chunks_mut(k).enumerate() {
                    let s = 0.25 + r as f32;
                    row.iter_mut().for_each(|v| *v *= s);
                }
                let g = randv(&mut self.rng, k, 1.5);
                let eps = 1e-5f32;
                let lens: Vec<usize> = ms.iter().map(|m| n * m).collect();
                let init = randv(&mut self.rng, lens.iter().sum(), 3.0);
                let mut r = init.clone();
                let mut y = Guarded::from(&init);
                let (mut s_cpu, mut s_be) = (vec![0f32; n * k], vec![0f32; n * k]);
                let desc = format!("{ty:?} m={ms:?} k={k} n={n} add={adds:?}");
                let sup = self.be.supports_op(
                    &norm_op(
                        &ws,
                        &x,
                        n,
                        split_outs(y.body_mut(), &lens),
                        adds,
                        (&g, eps),
                        &mut s_be,
                    ),
                    mode,
                );
                let mut err = None;
                let mut unfused_diff = None;
                if sup {
                    if let Err(e) = self.cpu.run(
                        norm_op(
                            &ws,
                            &x,
                            n,
                            split_outs(&mut r, &lens),
                            adds,
                            (&g, eps),
                            &mut s_cpu,
                        ),
                        mode,
                    ) {
                        err = Some(format!("cpu reference: {e:#}"));
                    } else if let Err(e) = self.be.run(
                        norm_op(
                            &ws,
                            &x,
                            n,
                            split_outs(y.body_mut(), &lens),
                            adds,
                            (&g, eps),
                            &mut s_be,
                        ),
                        mode,
                    ) {
                        err = Some(format!("{e:#}"));
                    } else {
                        match self.norm_then_mat_muls(&ws, &x, n, adds, (&g, eps), &init, &lens) {
                            Ok(u) => {
                                unfused_diff = unfused_bits("rms_norm then mat_muls", y.body(), &u)
                            }
                            Err(e) => err = Some(format!("unfused rms_norm / mat_muls: {e:#}")),
                        }
                    }
                }
                let gd = y.guards_ok();
                self.finish("mat_muls_norm", desc, sup, err, y.body(), &r, gd, None);
                self.fail_last(unfused_diff);
                self.keep.extend(datas);
            }
        }
    }

    /// The backend's `RmsNorm` then `MatMuls` (no norm) from `init`.
    #[allow(clippy::too_many_arguments)]
    fn norm_then_mat_muls(
        &self,
        ws: &[QMatrix<'_>],
        x: &[f32],
        n: usize,
        adds: &[bool],
        (g, eps): (&[f32], f32),
        init: &[f32],
        lens: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        let mode = self.opts.mode;
        let k = ws[0].cols;
        let mut h = vec![0f32; x.len()];
        self.be.run(
            Op::RmsNorm {
                x,
                w: g,
                dim: k,
                eps,
                out: &mut h,
            },
            mode,
        )?;
        let mut out = init.to_vec();
        self.be.run(
            Op::MatMuls {
                x: &h,
                n,
                jobs: jobs(ws, split_outs(&mut out, lens), adds),
                norm: None,
                next_norm: None,
                glu: None,
            },
            mode,
        )?;
        Ok(out)
    }
}

/// The case's op over the given buffers: the norm's weights and eps, its
/// scratch `s`.
fn norm_op<'a>(
    ws: &[QMatrix<'a>],
    x: &'a [f32],
    n: usize,
    outs: Vec<&'a mut [f32]>,
    adds: &[bool],
    (g, eps): (&'a [f32], f32),
    s: &'a mut [f32],
) -> Op<'a> {
    Op::MatMuls {
        x,
        n,
        jobs: jobs(ws, outs, adds),
        norm: Some(MatNorm { w: g, eps, out: s }),
        next_norm: None,
        glu: None,
    }
}
