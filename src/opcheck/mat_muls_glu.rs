//! Parity cases of `mat_muls` with the FFN's SwiGlu (`OpT::MatMuls::glu`):
//! the gate and up outputs and the SwiGlu's against the cpu reference like
//! every op, and on the backend under test against its own `MatMuls` then
//! `SwiGlu` (the op must give those bits in every mode, whatever a backend
//! fuses: CUDA's one-row `mv_q8_r1_glu*`).

use super::mat_muls::{fused_types, job_matrices, jobs, split_outs, unfused_bits};
use super::{randv, Ctx, Guarded};
use crate::backend::{MatNorm, Op, QMatrix};
use crate::quant::GgmlType;

/// (rows m of the gate and the up job, k, n, with the input's norm):
/// decode rows with the norm (the model graph's op, which CUDA fuses):
/// two CTAs of 32 indices, SmolLM2's 1,536 x 576 (48 CTAs), and 300 CTAs
/// (CUDA's default rule fuses it on 100-300 SMs; rows too long for the
/// short-row matvec, whose bits a fused launch would not give); then the
/// unfused paths: rows not a multiple of 32, no norm, several rows.
const SHAPES: &[(usize, usize, usize, bool)] = &[
    (64, 512, 1, true),
    (1536, 576, 1, true),
    (9600, 1024, 1, true),
    (40, 512, 1, true),
    (64, 256, 1, false),
    (64, 256, 3, true),
];

/// The one-row cases with the norm (those a backend may fuse), as (weight
/// type, k, blocks of 32 output rows): `quire ops` checks that CUDA's
/// fused launch ran where its rule takes one of them.
pub fn fusable_cases(quick: bool) -> impl Iterator<Item = (GgmlType, usize, usize)> {
    SHAPES
        .iter()
        .filter(|&&(m, _, n, norm)| n == 1 && norm && m.is_multiple_of(32))
        .flat_map(move |&(m, k, ..)| {
            fused_types(quick)
                .iter()
                .filter(move |ty| k.is_multiple_of(ty.block_size()))
                .map(move |&ty| (ty, k, m / 32))
        })
}

impl Ctx<'_> {
    pub(super) fn mat_muls_glu(&mut self) {
        if !self.want("mat_muls_glu") {
            return;
        }
        let mode = self.opts.mode;
        for &ty in fused_types(self.opts.quick) {
            for &(m, k, n, with_norm) in SHAPES {
                if !k.is_multiple_of(ty.block_size()) {
                    continue; // not a shape of this type
                }
                let ms = [m, m];
                let Some(datas) = self.job_weights("mat_muls_glu", ty, &ms, k, n) else {
                    continue;
                };
                let ws = job_matrices(ty, &ms, k, &datas);
                let x = randv(&mut self.rng, n * k, 3.0);
                let g = randv(&mut self.rng, k, 1.5);
                let norm = with_norm.then_some((&g[..], 1e-5f32));
                // Outputs: gate, up, glu (n, m) each, in one guarded buffer.
                let lens = [n * m; 3];
                let init = randv(&mut self.rng, 3 * n * m, 3.0);
                let mut r = init.clone();
                let mut y = Guarded::from(&init);
                let (mut s_cpu, mut s_be) = (vec![0f32; n * k], vec![0f32; n * k]);
                let desc = format!("{ty:?} m={m} k={k} n={n} norm={with_norm}");
                let sup = self.be.supports_op(
                    &glu_op(&ws, &x, n, split_outs(y.body_mut(), &lens), norm, &mut s_be),
                    mode,
                );
                let mut err = None;
                let mut unfused_diff = None;
                if sup {
                    let cpu_op = glu_op(&ws, &x, n, split_outs(&mut r, &lens), norm, &mut s_cpu);
                    if let Err(e) = self.cpu.run(cpu_op, mode) {
                        err = Some(format!("cpu reference: {e:#}"));
                    } else if let Err(e) = self.be.run(
                        glu_op(&ws, &x, n, split_outs(y.body_mut(), &lens), norm, &mut s_be),
                        mode,
                    ) {
                        err = Some(format!("{e:#}"));
                    } else {
                        match self.mat_muls_then_swiglu(&ws, &x, n, norm, &init, &lens) {
                            Ok(u) => {
                                let what = format!(
                                    "mat_muls then swiglu (gate, up, glu: {} values each)",
                                    n * m
                                );
                                unfused_diff = unfused_bits(&what, y.body(), &u);
                            }
                            Err(e) => err = Some(format!("unfused mat_muls / swiglu: {e:#}")),
                        }
                    }
                }
                let gd = y.guards_ok();
                self.finish("mat_muls_glu", desc, sup, err, y.body(), &r, gd, None);
                self.fail_last(unfused_diff);
                self.keep.extend(datas);
            }
        }
    }

    /// The backend's `MatMuls` (with the norm, no SwiGlu) then `SwiGlu`
    /// from `init`: (gate, up, glu) in one buffer.
    fn mat_muls_then_swiglu(
        &self,
        ws: &[QMatrix<'_>],
        x: &[f32],
        n: usize,
        norm: Option<(&[f32], f32)>,
        init: &[f32],
        lens: &[usize],
    ) -> anyhow::Result<Vec<f32>> {
        let mode = self.opts.mode;
        let mut out = init.to_vec();
        let mut s = vec![0f32; x.len()];
        let mut outs = split_outs(&mut out, lens);
        let h = outs.pop().expect("three outputs");
        self.be.run(
            Op::MatMuls {
                x,
                n,
                jobs: jobs(ws, outs, &[false, false]),
                norm: norm.map(|(w, eps)| MatNorm {
                    w,
                    eps,
                    out: &mut s[..],
                }),
                next_norm: None,
                glu: None,
            },
            mode,
        )?;
        let mut hv = h.to_vec();
        let (gate, up) = out[..2 * lens[0]].split_at(lens[0]);
        self.be.run(
            Op::SwiGlu {
                gate,
                up,
                out: &mut hv,
            },
            mode,
        )?;
        out[2 * lens[0]..].copy_from_slice(&hv);
        Ok(out)
    }
}

/// The case's op over the given buffers: outputs (gate, up, glu), the
/// norm's weights and eps if any, its scratch `s`.
fn glu_op<'a>(
    ws: &[QMatrix<'a>],
    x: &'a [f32],
    n: usize,
    mut outs: Vec<&'a mut [f32]>,
    norm: Option<(&'a [f32], f32)>,
    s: &'a mut [f32],
) -> Op<'a> {
    let h = outs.pop().expect("three outputs");
    Op::MatMuls {
        x,
        n,
        jobs: jobs(ws, outs, &[false, false]),
        norm: norm.map(|(w, eps)| MatNorm { w, eps, out: s }),
        next_norm: None,
        glu: Some(h),
    }
}
