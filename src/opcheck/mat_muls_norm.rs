//! Parity cases of `mat_muls` with its norms: `norm_in` (the products read
//! rms_norm(x)) against the cpu's rms_norm then matmuls, and `norm_next`
//! (a fusion hint) against the same op without it on the backend under
//! test: the outputs must be the same bits.

use super::{randv, Ctx, Guarded};
use crate::backend::{Host, MatJob, NormIn, NormNext, Op, QMatrix};
use crate::quant::GgmlType;

impl Ctx<'_> {
    pub(super) fn mat_muls_norm(&mut self) {
        if !self.want("mat_muls_norm") {
            return;
        }
        use GgmlType::*;
        let mode = self.opts.mode;
        let types: &[GgmlType] = if self.opts.quick {
            &[F16, Q4_0, Q8_0, Q4_K]
        } else {
            &[F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K]
        };
        // (job rows, k, n, adds, norm_next): q/k/v and gate/up of one
        // decode row (one warp per weight row), the FFN down projection's
        // long rows (k >= 3 m: split rows in `fast`), several rows, a
        // residual projection with the hint (one job of whole 32-row
        // groups, adding), and the hint where it cannot be used (rows not
        // a multiple of 32).
        type Shape = (Vec<usize>, usize, usize, Vec<bool>, bool);
        let shapes: Vec<Shape> = vec![
            (vec![64, 16, 16], 512, 1, vec![false; 3], false),
            (vec![96, 96], 256, 1, vec![false; 2], false),
            (vec![64], 1024, 1, vec![true], false),
            (vec![40, 24], 512, 3, vec![false; 2], false),
            (vec![32, 32], 256, 70, vec![false; 2], false),
            (vec![128], 512, 1, vec![true], true),
            (vec![64], 768, 1, vec![false], true),
            (vec![48], 256, 1, vec![true], true),
            (vec![96], 256, 4, vec![true], true),
        ];
        for &ty in types {
            for (ms, k, n, adds, hint) in &shapes {
                let (k, n, hint) = (*k, *n, *hint);
                let datas: Vec<Vec<u8>> = match ms
                    .iter()
                    .map(|&m| crate::quant::quantize(ty, &randv(&mut self.rng, m * k, 1.0)))
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(d) => d,
                    Err(_) => continue, // block size over k: not this type's shape
                };
                let ws: Vec<QMatrix<'_>> = ms
                    .iter()
                    .zip(&datas)
                    .map(|(&m, d)| QMatrix {
                        ty,
                        rows: m,
                        cols: k,
                        data: d,
                    })
                    .collect();
                // Activations with a spread of row scales (the norm's job).
                let mut x = randv(&mut self.rng, n * k, 3.0);
                for (r, row) in x.chunks_mut(k).enumerate() {
                    let s = 0.25 + r as f32;
                    row.iter_mut().for_each(|v| *v *= s);
                }
                let g = randv(&mut self.rng, k, 1.5);
                let gn = randv(&mut self.rng, ms[0], 1.5);
                let lens: Vec<usize> = ms.iter().map(|m| n * m).collect();
                let init = randv(&mut self.rng, lens.iter().sum(), 3.0);
                let mut r = init.clone();
                let mut y = Guarded::from(&init);
                let (mut s_cpu, mut s_be) = (vec![0f32; n * k], vec![0f32; n * k]);
                let eps = 1e-5f32;
                let desc = format!(
                    "{ty:?} m={ms:?} k={k} n={n} add={adds:?}{}",
                    if hint { " norm_next" } else { " norm_in" }
                );
                let gs = (&g[..], &gn[..], eps);
                let sup = self.be.supports_op(
                    &norm_op(
                        &ws,
                        &x,
                        n,
                        split_outs(y.body_mut(), &lens),
                        adds,
                        hint,
                        gs,
                        &mut s_be,
                    ),
                    mode,
                );
                let mut err = None;
                let mut hint_diff = None;
                if sup {
                    if let Err(e) = self.cpu.run(
                        norm_op(
                            &ws,
                            &x,
                            n,
                            split_outs(&mut r, &lens),
                            adds,
                            hint,
                            gs,
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
                            hint,
                            gs,
                            &mut s_be,
                        ),
                        mode,
                    ) {
                        err = Some(format!("{e:#}"));
                    } else if hint {
                        // The same op without the hint, on the backend.
                        let mut u = init.clone();
                        let jobs = ws
                            .iter()
                            .zip(split_outs(&mut u, &lens))
                            .zip(adds)
                            .map(|((&w, out), &add)| MatJob::<Host> { w, out, add })
                            .collect();
                        let plain = Op::MatMuls {
                            x: &x,
                            n,
                            jobs,
                            norm_in: None,
                            norm_next: None,
                        };
                        match self.be.run(plain, mode) {
                            Ok(()) => {
                                if let Some(i) = u.iter().zip(y.body()).position(|(a, b)| {
                                    a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())
                                }) {
                                    hint_diff = Some(format!(
                                        "norm_next changed the output at {i}: {:e} vs {:e} without it",
                                        y.body()[i],
                                        u[i]
                                    ));
                                }
                            }
                            Err(e) => err = Some(format!("without norm_next: {e:#}")),
                        }
                    }
                }
                let gd = y.guards_ok();
                self.finish("mat_muls", desc, sup, err, y.body(), &r, gd, None);
                if let (Some(why), Some(last)) = (hint_diff, self.results.last_mut()) {
                    if last.status == super::Status::Pass {
                        last.status = super::Status::Fail(why);
                    }
                }
                self.keep.extend(datas);
            }
        }
    }
}

/// The case's op over the given buffers: `norm_next` with the weights gn
/// when `hint`, else `norm_in` with g and scratch s.
#[allow(clippy::too_many_arguments)]
fn norm_op<'a>(
    ws: &[QMatrix<'a>],
    x: &'a [f32],
    n: usize,
    outs: Vec<&'a mut [f32]>,
    adds: &[bool],
    hint: bool,
    (g, gn, eps): (&'a [f32], &'a [f32], f32),
    s: &'a mut [f32],
) -> Op<'a> {
    let jobs = ws
        .iter()
        .zip(outs)
        .zip(adds)
        .map(|((&w, out), &add)| MatJob::<Host> { w, out, add })
        .collect();
    let (norm_in, norm_next) = if hint {
        (None, Some(NormNext { w: gn, eps }))
    } else {
        (Some(NormIn { w: g, eps, out: s }), None)
    };
    Op::MatMuls {
        x,
        n,
        jobs,
        norm_in,
        norm_next,
    }
}

/// Splits `buf` into consecutive outputs of `lens` elements.
fn split_outs<'b>(mut buf: &'b mut [f32], lens: &[usize]) -> Vec<&'b mut [f32]> {
    let mut v = Vec::with_capacity(lens.len());
    for &l in lens {
        let (a, b) = buf.split_at_mut(l);
        v.push(a);
        buf = b;
    }
    v
}
