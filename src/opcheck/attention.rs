//! Parity cases of the KV cache writes and paged attention: random K/V in
//! randomly ordered physical blocks, against the cpu reference.

use super::*;

impl Ctx<'_> {
    pub(super) fn kv_write(&mut self) {
        if !self.want("kv_write") {
            return;
        }
        let mode = self.opts.mode;
        use crate::backend::KvType;
        for &(n, nkv, hd, bs, nblk, ty) in &[
            (1usize, 1usize, 64usize, 16usize, 4usize, KvType::F16),
            (7, 3, 80, 16, 8, KvType::F16),
            (64, 8, 128, 16, 16, KvType::F16),
            (5, 2, 256, 7, 9, KvType::F16),
            (7, 3, 64, 16, 8, KvType::Q8_0),
            (9, 2, 128, 7, 9, KvType::Q8_0),
            (7, 3, 64, 16, 8, KvType::Q4_0),
            (5, 2, 256, 16, 4, KvType::Q4_0),
        ] {
            let row = nkv * hd;
            let cells = bs * nblk;
            let k = randv(&mut self.rng, n * row, 3.0);
            let v = randv(&mut self.rng, n * row, 3.0);
            let (slots, init) = kv_cells(&mut self.rng, cells, nkv * ty.row_units(hd), n);
            let (mut rk, mut rv) = (init.clone(), init.clone());
            let (mut gk, mut gv) = (GuardedF16::from(&init), GuardedF16::from(&init));
            // The op around one pair of cache buffers.
            macro_rules! kv_write {
                ($kb:expr, $vb:expr) => {
                    Op::KvWrite {
                        k: &k,
                        v: &v,
                        slots: &slots,
                        cache: KvLayerMut {
                            k: $kb,
                            v: $vb,
                            block_size: bs,
                            n_kv_heads: nkv,
                            head_dim: hd,
                            ty,
                        },
                    }
                };
            }
            let sup = self
                .be
                .supports_op(&kv_write!(gk.body_mut(), gv.body_mut()), mode);
            let err = if !sup {
                None
            } else {
                self.cpu
                    .run(kv_write!(&mut rk, &mut rv), mode)
                    .and_then(|_| self.be.run(kv_write!(gk.body_mut(), gv.body_mut()), mode))
                    .err()
                    .map(|e| format!("{e:#}"))
            };
            // Compare the whole cache (untouched cells must stay) as f32.
            let to32 = |a: &[f16], b: &[f16]| -> Vec<f32> {
                a.iter().chain(b).map(|h| h.to_f32()).collect()
            };
            let y = to32(gk.body(), gv.body());
            let r = to32(&rk, &rv);
            let g = gk.guards_ok() && gv.guards_ok();
            self.finish(
                "kv_write",
                format!("n={n} kv_heads={nkv} hd={hd} block={bs} blocks={nblk} {ty}"),
                sup,
                err,
                &y,
                &r,
                g,
                None,
            );
        }
    }

    pub(super) fn attention(&mut self) {
        if !self.want("paged_attention") {
            return;
        }
        let mode = self.opts.mode;
        let mut cases: Vec<AttnCase> = vec![
            (64, 3, 3, 16, vec![(0, 1)]),
            (64, 1, 8, 16, vec![(31, 1), (32, 1), (100, 1)]),
            (80, 2, 1, 16, vec![(0, 17)]),
            (128, 8, 3, 16, vec![(40, 9), (7, 1)]),
            (256, 1, 8, 7, vec![(63, 2), (5, 5)]),
            (128, 2, 8, 32, vec![(1000, 1), (0, 40), (300, 3)]),
            (64, 3, 3, 16, vec![(4000, 1)]),
            (96, 1, 3, 16, vec![(33, 33)]),
            // head_dim not a multiple of 8: cuda's non-split fast kernel.
            (36, 2, 2, 16, vec![(20, 5), (300, 1)]),
            // Past ATT_PARTS chunks of 128 keys: split-KV partials wrap.
            (64, 2, 2, 16, vec![(4500, 2)]),
            // cuda split-KV: a group of 6 heads in the 8-head kernel,
            // head_dim not a multiple of 32, and 12 heads per KV head (past
            // the grouped kernels: the per-head one).
            (72, 2, 6, 16, vec![(1500, 2), (3, 1)]),
            (64, 1, 12, 16, vec![(700, 1)]),
            // >= 64 rows (cuda fast: tensor-core prefill tiles), mixed
            // sequences, continued prefill, block sizes not 16.
            (128, 2, 4, 16, vec![(100, 50), (0, 30), (5, 1)]),
            (64, 1, 2, 7, vec![(0, 70)]),
            (80, 1, 1, 32, vec![(17, 64)]),
            // Prefill tiles with 8 and 7 query heads per KV head (the
            // grouped kernel's largest CTA, and a group not a power of
            // two), and 12 (past it: the warp-per-head kernel).
            (128, 1, 8, 16, vec![(0, 80)]),
            (64, 2, 7, 16, vec![(30, 70)]),
            (64, 1, 12, 16, vec![(0, 64)]),
        ];
        if !self.opts.quick {
            cases.push((128, 8, 4, 16, vec![(8000, 1); 4]));
            cases.push((64, 3, 3, 16, vec![(0, 256)]));
        }
        use crate::backend::KvType;
        let plain = (0u32, 0f32, 0f32, false);
        let mut cases: Vec<(AttnCase, AttnCaseOpts, KvType)> =
            cases.into_iter().map(|c| (c, plain, KvType::F16)).collect();
        // Windows (inside a chunk, across chunks and blocks, past the row),
        // softcaps, ALiBi and sinks, alone and together, decode and prefill.
        let scored: Vec<(AttnCase, AttnCaseOpts)> = vec![
            (
                (64, 2, 2, 16, vec![(100, 1), (7, 20)]),
                (40, 0.0, 0.0, false),
            ),
            ((128, 1, 8, 16, vec![(300, 70)]), (64, 0.0, 0.0, false)),
            ((80, 2, 1, 7, vec![(90, 3)]), (5, 0.0, 0.0, false)),
            ((64, 1, 4, 16, vec![(10, 1)]), (4096, 0.0, 0.0, false)),
            (
                (64, 2, 3, 16, vec![(200, 4), (0, 9)]),
                (0, 30.0, 0.0, false),
            ),
            ((96, 1, 8, 16, vec![(150, 2)]), (0, 0.0, 8.0, false)),
            ((72, 3, 2, 16, vec![(60, 2), (0, 33)]), (0, 0.0, 0.0, true)),
            (
                (256, 2, 4, 16, vec![(500, 2), (31, 40)]),
                (128, 50.0, 8.0, true),
            ),
            ((112, 1, 6, 32, vec![(1000, 1)]), (256, 20.0, 0.0, true)),
        ];
        cases.extend(scored.into_iter().map(|(c, o)| (c, o, KvType::F16)));
        // Quantized K/V rows (decode, prefill tiles, with options).
        cases.extend([
            ((64, 2, 3, 16, vec![(40, 9), (7, 1)]), plain, KvType::Q8_0),
            ((128, 1, 8, 16, vec![(0, 80)]), plain, KvType::Q8_0),
            (
                (64, 2, 2, 16, vec![(300, 2)]),
                (100, 0.0, 0.0, true),
                KvType::Q8_0,
            ),
            ((64, 2, 3, 16, vec![(40, 9), (7, 1)]), plain, KvType::Q4_0),
            ((256, 1, 4, 7, vec![(90, 3)]), plain, KvType::Q4_0),
        ]);
        for ((hd, nkv, ratio, bs, seqs), (window, softcap, max_bias, sinks), ty) in cases {
            let nh = nkv * ratio;
            // Blocks per sequence; physical ids scattered over a shuffled pool
            // (plus spare unused blocks).
            let per: Vec<usize> = seqs.iter().map(|&(s, c)| (s + c) / bs + 1).collect();
            let total: usize = per.iter().sum::<usize>() + 5;
            let mut pool: Vec<u32> = (0..total as u32).collect();
            pool.shuffle(&mut self.rng);
            let mut tables: Vec<Vec<u32>> = Vec::new();
            let mut at = 0;
            for &p in &per {
                tables.push(pool[at..at + p].to_vec());
                at += p;
            }
            let mut row_seq = Vec::new();
            let mut positions = Vec::new();
            for (si, &(s, c)) in seqs.iter().enumerate() {
                for p in s..s + c {
                    row_seq.push(si as u32);
                    positions.push(p as u32);
                }
            }
            let n_rows = positions.len();
            let cell = nkv * hd;
            // Every (cell, KV head) row written as `ty` stores it.
            let rows = |rng: &mut ChaCha8Rng| -> Vec<f16> {
                let x = randv(rng, total * bs * cell, 2.0);
                let u = ty.row_units(hd);
                let mut out = vec![f16::ZERO; total * bs * nkv * u];
                for (xr, o) in x.chunks_exact(hd).zip(out.chunks_exact_mut(u)) {
                    crate::backend::cpu::ops::kv_write::store(ty, xr, o)
                        .expect("rows of a multiple of 32");
                }
                out
            };
            let kc = rows(&mut self.rng);
            let vc = rows(&mut self.rng);
            let q = randv(&mut self.rng, n_rows * nh * hd, 2.0);
            let trefs: Vec<&[u32]> = tables.iter().map(|t| &t[..]).collect();
            let batch = AttnBatch {
                block_tables: &trefs,
                row_seq: &row_seq,
                positions: &positions,
            };
            let cache = KvLayer {
                k: &kc,
                v: &vc,
                block_size: bs,
                n_kv_heads: nkv,
                head_dim: hd,
                ty,
            };
            let scale = 1.0 / (hd as f32).sqrt();
            let slopes = crate::backend::alibi_slopes(nh, max_bias);
            let sink_logits = randv(&mut self.rng, nh, 3.0);
            let opts = crate::backend::AttnOpts {
                window,
                softcap,
                alibi: (max_bias > 0.0).then_some(&slopes[..]),
                sinks: sinks.then_some(&sink_logits[..]),
            };
            let mut r = vec![0f32; q.len()];
            let mut y = Guarded::new(q.len());
            let mut tmp = vec![0f32; q.len()];
            let (sup, err, t) = run_case!(self, mode, y, r, time tmp, |out| Op::PagedAttention {
                q: &q,
                n_heads: nh,
                scale,
                cache,
                batch,
                opts,
                out,
            });
            let ctx: usize = positions.iter().map(|&p| p as usize + 1).sum();
            let perf = t.map(|t| {
                (
                    t,
                    (ctx * nkv * hd * 4 + 8 * q.len()) as f64,
                    (4 * ctx * nh * hd) as f64,
                )
            });
            let g = y.guards_ok();
            let mut desc = format!(
                "hd={hd} kv={nkv} gqa={ratio} B={bs} rows={n_rows} seqs={:?}",
                seqs
            );
            if !opts.is_plain() {
                desc +=
                    &format!(" window={window} softcap={softcap} alibi={max_bias} sinks={sinks}");
            }
            if ty != KvType::F16 {
                desc += &format!(" kv={ty}");
            }
            self.finish("paged_attention", desc, sup, err, y.body(), &r, g, perf);
        }
    }
}
