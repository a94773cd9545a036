//! Parity cases of `rope_kv_write` (rope of q and k, then the K/V store, as
//! one op): q, k and the whole cache against the cpu reference, and on the
//! backend under test against its own `Rope`, `Rope`, `KvWrite` (the fused
//! op must give those bits in every mode).

use super::{kv_cells, randv, Ctx, Guarded, GuardedF16, Status};
use crate::backend::{KvLayerMut, Op};
use half::f16;
use rand::Rng;

/// One case's tensors: q, k (rotated in place) and the cache k, v.
struct State {
    q: Vec<f32>,
    k: Vec<f32>,
    ck: Vec<f16>,
    cv: Vec<f16>,
}

impl State {
    /// Everything the op writes, as f32 (untouched cache cells included).
    fn flat(&self) -> Vec<f32> {
        let h = self.ck.iter().chain(&self.cv).map(|h| h.to_f32());
        self.q.iter().chain(&self.k).copied().chain(h).collect()
    }
}

impl Ctx<'_> {
    pub(super) fn rope_kv_write(&mut self) {
        if !self.want("rope_kv_write") {
            return;
        }
        let mode = self.opts.mode;
        // (n, n_heads, n_kv_heads, head_dim, rope_dim, block, blocks, neox)
        for &(n, nh, nkv, hd, rd, bs, nblk, neox) in &[
            (
                1usize, 9usize, 3usize, 64usize, 64usize, 16usize, 4usize, false,
            ),
            (7, 8, 2, 128, 128, 16, 8, true),
            (5, 4, 4, 80, 32, 7, 9, false),
            (33, 32, 8, 128, 128, 16, 16, false),
            (3, 2, 1, 256, 96, 16, 2, true),
        ] {
            let row = nkv * hd;
            let cells = bs * nblk;
            let q0 = randv(&mut self.rng, n * nh * hd, 4.0);
            let k0 = randv(&mut self.rng, n * row, 4.0);
            let v = randv(&mut self.rng, n * row, 3.0);
            let positions: Vec<u32> = (0..n).map(|_| self.rng.random_range(0..40_000)).collect();
            let inv_freq: Vec<f32> = (0..rd / 2)
                .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / rd as f32))
                .collect();
            let (slots, init) = kv_cells(&mut self.rng, cells, row, n);
            let mut r = State {
                q: q0.clone(),
                k: k0.clone(),
                ck: init.clone(),
                cv: init.clone(),
            };
            let (mut gq, mut gk) = (Guarded::from(&q0), Guarded::from(&k0));
            let (mut gck, mut gcv) = (GuardedF16::from(&init), GuardedF16::from(&init));
            macro_rules! op {
                ($q:expr, $k:expr, $ck:expr, $cv:expr) => {
                    Op::RopeKvWrite {
                        q: $q,
                        k: $k,
                        v: &v,
                        n_heads: nh,
                        rope_dim: rd,
                        positions: &positions,
                        inv_freq: &inv_freq,
                        neox,
                        slots: &slots,
                        cache: KvLayerMut {
                            k: $ck,
                            v: $cv,
                            block_size: bs,
                            n_kv_heads: nkv,
                            head_dim: hd,
                            ty: crate::backend::KvType::F16,
                        },
                    }
                };
            }
            let sup = self.be.supports_op(
                &op!(gq.body_mut(), gk.body_mut(), gck.body_mut(), gcv.body_mut()),
                mode,
            );
            let mut err = None;
            let mut unfused_diff = None;
            if sup {
                if let Err(e) = self
                    .cpu
                    .run(op!(&mut r.q, &mut r.k, &mut r.ck, &mut r.cv), mode)
                {
                    err = Some(format!("cpu reference: {e:#}"));
                } else if let Err(e) = self.be.run(
                    op!(gq.body_mut(), gk.body_mut(), gck.body_mut(), gcv.body_mut()),
                    mode,
                ) {
                    err = Some(format!("{e:#}"));
                } else {
                    // The same on the backend as Rope, Rope, KvWrite.
                    let mut u = State {
                        q: q0.clone(),
                        k: k0.clone(),
                        ck: init.clone(),
                        cv: init.clone(),
                    };
                    let mut res = Ok(());
                    for (x, heads) in [(&mut u.q, nh), (&mut u.k, nkv)] {
                        if res.is_ok() {
                            res = self.be.run(
                                Op::Rope {
                                    x,
                                    n_heads: heads,
                                    head_dim: hd,
                                    rope_dim: rd,
                                    positions: &positions,
                                    inv_freq: &inv_freq,
                                    neox,
                                },
                                mode,
                            );
                        }
                    }
                    if res.is_ok() {
                        res = self.be.run(
                            Op::KvWrite {
                                k: &u.k,
                                v: &v,
                                slots: &slots,
                                cache: KvLayerMut {
                                    k: &mut u.ck,
                                    v: &mut u.cv,
                                    block_size: bs,
                                    n_kv_heads: nkv,
                                    head_dim: hd,
                                    ty: crate::backend::KvType::F16,
                                },
                            },
                            mode,
                        );
                    }
                    match res {
                        Err(e) => err = Some(format!("unfused rope / kv_write: {e:#}")),
                        Ok(()) => {
                            let fused = State {
                                q: gq.body().to_vec(),
                                k: gk.body().to_vec(),
                                ck: gck.body().to_vec(),
                                cv: gcv.body().to_vec(),
                            }
                            .flat();
                            let i = fused.iter().zip(u.flat()).position(|(a, b)| {
                                a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())
                            });
                            if let Some(i) = i {
                                unfused_diff = Some(format!(
                                    "differs from rope, rope, kv_write on this backend at {i}"
                                ));
                            }
                        }
                    }
                }
            }
            let y = State {
                q: gq.body().to_vec(),
                k: gk.body().to_vec(),
                ck: gck.body().to_vec(),
                cv: gcv.body().to_vec(),
            }
            .flat();
            let g = gq.guards_ok() && gk.guards_ok() && gck.guards_ok() && gcv.guards_ok();
            self.finish(
                "rope_kv_write",
                format!("n={n} heads={nh}/{nkv} hd={hd} rope={rd} block={bs} neox={neox}"),
                sup,
                err,
                &y,
                &r.flat(),
                g,
                None,
            );
            if let (Some(why), Some(last)) = (unfused_diff, self.results.last_mut()) {
                if last.status == Status::Pass {
                    last.status = Status::Fail(why);
                }
            }
        }
    }
}
