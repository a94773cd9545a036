//! Paged attention: f64 reference, scattered vs contiguous blocks bitwise,
//! GQA ratios 1/3/8, head dims 64/80/128, odd lengths, batch invariance,
//! thread/ISA invariance, errors for bad shapes; sliding windows, softcap,
//! ALiBi and sinks against the f64 reference, and windows never reading
//! the blocks they left.

mod cpu_ops_util;
use cpu_ops_util::*;

use half::f16;
use quire::backend::cpu::CpuBackend;
use quire::backend::{alibi_slopes, AttnBatch, AttnOpts, Backend, KvLayer, Mode, Op};
use rand::seq::SliceRandom;

struct Case {
    nkv: usize,
    n_heads: usize,
    hd: usize,
    bs: usize,
    lens: Vec<usize>,
    /// Logical K/V per sequence: (len, nkv, hd).
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

impl Case {
    fn new(seed: u64, nkv: usize, ratio: usize, hd: usize, bs: usize, lens: Vec<usize>) -> Case {
        let mut r = rng(seed);
        let mk = |r: &mut _, l: usize| -> Vec<f16> {
            rand_vec(r, l * nkv * hd, 2.0)
                .into_iter()
                .map(f16::from_f32)
                .collect()
        };
        let k = lens.iter().map(|&l| mk(&mut r, l)).collect();
        let v = lens.iter().map(|&l| mk(&mut r, l)).collect();
        Case {
            nkv,
            n_heads: nkv * ratio,
            hd,
            bs,
            lens,
            k,
            v,
        }
    }

    /// Pool + block tables; `shuffle` scatters the physical blocks.
    fn layout(&self, shuffle: Option<u64>) -> (Vec<f16>, Vec<f16>, Vec<Vec<u32>>) {
        let need: Vec<usize> = self.lens.iter().map(|&l| l.div_ceil(self.bs)).collect();
        let total: usize = need.iter().sum::<usize>() + 3; // spare blocks
        let mut ids: Vec<u32> = (0..total as u32).collect();
        if let Some(s) = shuffle {
            ids.shuffle(&mut rng(s));
        }
        let cell = self.nkv * self.hd;
        // Fill unused cells with a sentinel that would poison any wrong read.
        let mut kp = vec![f16::from_f32(1e4); total * self.bs * cell];
        let mut vp = vec![f16::NAN; total * self.bs * cell];
        let mut tables = Vec::new();
        let mut next = 0;
        for (s, &nb) in need.iter().enumerate() {
            let t: Vec<u32> = ids[next..next + nb].to_vec();
            next += nb;
            for j in 0..self.lens[s] {
                let c = t[j / self.bs] as usize * self.bs + j % self.bs;
                kp[c * cell..(c + 1) * cell].copy_from_slice(&self.k[s][j * cell..(j + 1) * cell]);
                vp[c * cell..(c + 1) * cell].copy_from_slice(&self.v[s][j * cell..(j + 1) * cell]);
            }
            tables.push(t);
        }
        (kp, vp, tables)
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        be: &CpuBackend,
        kp: &[f16],
        vp: &[f16],
        tables: &[Vec<u32>],
        q: &[f32],
        row_seq: &[u32],
        pos: &[u32],
        scale: f32,
    ) -> Vec<f32> {
        self.run_opts(be, kp, vp, tables, q, row_seq, pos, scale, AttnOpts::none())
    }

    #[allow(clippy::too_many_arguments)]
    fn run_opts(
        &self,
        be: &CpuBackend,
        kp: &[f16],
        vp: &[f16],
        tables: &[Vec<u32>],
        q: &[f32],
        row_seq: &[u32],
        pos: &[u32],
        scale: f32,
        opts: AttnOpts<&[f32]>,
    ) -> Vec<f32> {
        let tabs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
        let mut out = vec![0f32; q.len()];
        be.run(
            Op::PagedAttention {
                q,
                n_heads: self.n_heads,
                scale,
                cache: KvLayer {
                    k: kp,
                    v: vp,
                    block_size: self.bs,
                    n_kv_heads: self.nkv,
                    head_dim: self.hd,
                    ty: quire::backend::KvType::F16,
                },
                batch: AttnBatch {
                    block_tables: &tabs,
                    row_seq,
                    positions: pos,
                },
                opts,
                out: &mut out,
            },
            Mode::Exact,
        )
        .unwrap();
        out
    }

    fn reference(&self, q: &[f32], row_seq: &[u32], pos: &[u32], scale: f32) -> Vec<f64> {
        self.reference_opts(q, row_seq, pos, scale, AttnOpts::none())
    }

    /// Softmax attention in f64 over the visible keys, with the options'
    /// softcap, ALiBi bias and sink term.
    fn reference_opts(
        &self,
        q: &[f32],
        row_seq: &[u32],
        pos: &[u32],
        scale: f32,
        opts: AttnOpts<&[f32]>,
    ) -> Vec<f64> {
        let (nh, hd, nkv) = (self.n_heads, self.hd, self.nkv);
        let mut out = vec![0f64; q.len()];
        for (r, (&s, &p)) in row_seq.iter().zip(pos).enumerate() {
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let qv = &q[(r * nh + h) * hd..][..hd];
                let w = opts.window as usize;
                let lo = if w == 0 {
                    0
                } else {
                    (p as usize + 1).saturating_sub(w)
                };
                let keys: Vec<usize> = (lo..=p as usize).collect();
                let sc: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let kr = &self.k[s as usize][(j * nkv + kvh) * hd..][..hd];
                        let mut x = qv
                            .iter()
                            .zip(kr)
                            .map(|(&a, b)| a as f64 * b.to_f64())
                            .sum::<f64>()
                            * scale as f64;
                        if opts.softcap > 0.0 {
                            let c = opts.softcap as f64;
                            x = c * (x / c).tanh();
                        }
                        if let Some(a) = opts.alibi {
                            x += a[h] as f64 * (j as f64 - p as f64);
                        }
                        x
                    })
                    .collect();
                let sink = opts.sinks.map(|t| t[h] as f64);
                let mx = sc
                    .iter()
                    .cloned()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |t| (t - mx).exp());
                for d in 0..hd {
                    let acc: f64 = e
                        .iter()
                        .zip(&keys)
                        .map(|(w, &j)| w * self.v[s as usize][(j * nkv + kvh) * hd + d].to_f64())
                        .sum();
                    out[(r * nh + h) * hd + d] = acc / z;
                }
            }
        }
        out
    }
}

#[test]
fn paged_attention_all_configs() {
    let bes = backends();
    let mut seed = 500;
    for (nkv, ratio, hd, bs) in [
        (3usize, 1usize, 64usize, 16usize),
        (1, 3, 80, 7),
        (2, 8, 128, 16),
        (3, 3, 64, 32),
    ] {
        seed += 1;
        // Odd lengths; one sequence spans several 32-position chunks.
        let lens = vec![1, 45, 97];
        let c = Case::new(seed, nkv, ratio, hd, bs, lens);
        // Rows: seq 0 decode at 0; seq 1 full prefill 0..45; seq 2 a chunk 60..97.
        let mut row_seq = vec![0u32];
        let mut pos = vec![0u32];
        for p in 0..45 {
            row_seq.push(1);
            pos.push(p);
        }
        for p in 60..97 {
            row_seq.push(2);
            pos.push(p);
        }
        let mut r = rng(seed + 1000);
        let q = rand_vec(&mut r, pos.len() * c.n_heads * hd, 2.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let (kc, vc, tc) = c.layout(None);
        let (ks, vs, ts) = c.layout(Some(seed));
        let got = c.run(&bes[0].1, &kc, &vc, &tc, &q, &row_seq, &pos, scale);
        let want = c.reference(&q, &row_seq, &pos, scale);
        let e = nmse(&got, &want);
        let cfg = format!("nkv {nkv} ratio {ratio} hd {hd} bs {bs}");
        assert!(e < 1e-10, "{cfg}: nmse {e:.3e}");
        for (label, be) in &bes {
            let scattered = c.run(be, &ks, &vs, &ts, &q, &row_seq, &pos, scale);
            assert_eq!(
                bits(&scattered),
                bits(&got),
                "{cfg} {label}: scattered != contiguous"
            );
        }
        // Batch invariance: each of a few rows alone (decode-style) is bitwise
        // equal to the same row inside the batch.
        let row = c.n_heads * hd;
        for ri in [0usize, 1, 30, 45, 46, pos.len() - 1] {
            let alone = c.run(
                &bes[1].1,
                &ks,
                &vs,
                &ts,
                &q[ri * row..(ri + 1) * row],
                &row_seq[ri..ri + 1],
                &pos[ri..ri + 1],
                scale,
            );
            assert_eq!(
                bits(&alone),
                bits(&got[ri * row..(ri + 1) * row]),
                "{cfg}: row {ri} alone"
            );
        }
    }
}

#[test]
fn paged_attention_errors() {
    let be = CpuBackend::new(Some(2)).unwrap();
    let c = Case::new(9, 1, 2, 64, 16, vec![20]);
    let (kp, vp, t) = c.layout(None);
    let q = vec![0.5f32; 2 * 64];
    let mut out = vec![0f32; 2 * 64];
    let tabs: Vec<&[u32]> = t.iter().map(|t| t.as_slice()).collect();
    let cache = KvLayer {
        k: &kp,
        v: &vp,
        block_size: 16,
        n_kv_heads: 1,
        head_dim: 64,
        ty: quire::backend::KvType::F16,
    };
    let mut run = |pos: u32, seq: u32, nh: usize, qlen: usize| {
        be.run(
            Op::PagedAttention {
                q: &q[..qlen],
                n_heads: nh,
                scale: 0.125,
                cache,
                batch: AttnBatch {
                    block_tables: &tabs,
                    row_seq: &[seq],
                    positions: &[pos],
                },
                opts: AttnOpts::none(),
                out: &mut out[..qlen],
            },
            Mode::Exact,
        )
    };
    assert!(run(19, 0, 2, 128).is_ok());
    // Position beyond the table (2 blocks of 16).
    let e = run(32, 0, 2, 128).unwrap_err();
    assert!(format!("{e:#}").contains("paged_attention"), "{e:#}");
    assert!(run(5, 1, 2, 128).is_err()); // no such sequence
    assert!(run(5, 0, 2, 127).is_err()); // q length
    assert!(run(5, 0, 3, 192.min(q.len())).is_err()); // 3 heads: q too short
}

#[test]
fn paged_attention_options_match_the_f64_reference() {
    let bes = backends();
    let mut seed = 900;
    for (nkv, ratio, hd, bs) in [
        (2usize, 2usize, 64usize, 16usize),
        (1, 8, 80, 7),
        (2, 3, 128, 32),
    ] {
        seed += 1;
        let lens = vec![3, 70, 200];
        let c = Case::new(seed, nkv, ratio, hd, bs, lens);
        let mut row_seq = vec![0u32, 0];
        let mut pos = vec![1u32, 2];
        for p in 0..70 {
            row_seq.push(1);
            pos.push(p);
        }
        for p in 150..200 {
            row_seq.push(2);
            pos.push(p);
        }
        let mut r = rng(seed + 1000);
        let q = rand_vec(&mut r, pos.len() * c.n_heads * hd, 2.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let slopes = alibi_slopes(c.n_heads, 8.0);
        let sinks = rand_vec(&mut r, c.n_heads, 3.0);
        let (ks, vs, ts) = c.layout(Some(seed));
        for (window, softcap, alibi, sink) in [
            (1u32, 0f32, false, false),
            (17, 0.0, false, false),
            (64, 0.0, false, false),
            (0, 2.0, false, false),
            (0, 0.0, true, false),
            (0, 0.0, false, true),
            (33, 5.0, true, true),
        ] {
            let opts = AttnOpts {
                window,
                softcap,
                alibi: alibi.then_some(&slopes[..]),
                sinks: sink.then_some(&sinks[..]),
            };
            let cfg = format!("nkv {nkv} ratio {ratio} hd {hd} bs {bs} opts {opts:?}");
            let got = c.run_opts(&bes[0].1, &ks, &vs, &ts, &q, &row_seq, &pos, scale, opts);
            let want = c.reference_opts(&q, &row_seq, &pos, scale, opts);
            let e = nmse(&got, &want);
            assert!(e < 1e-10, "{cfg}: nmse {e:.3e}");
            for (label, be) in &bes {
                let other = c.run_opts(be, &ks, &vs, &ts, &q, &row_seq, &pos, scale, opts);
                assert_eq!(bits(&other), bits(&got), "{cfg} {label}");
            }
            // A row alone is bitwise the row inside the batch.
            let row = c.n_heads * hd;
            for ri in [0usize, 40, pos.len() - 1] {
                let alone = c.run_opts(
                    &bes[1].1,
                    &ks,
                    &vs,
                    &ts,
                    &q[ri * row..(ri + 1) * row],
                    &row_seq[ri..ri + 1],
                    &pos[ri..ri + 1],
                    scale,
                    opts,
                );
                assert_eq!(
                    bits(&alone),
                    bits(&got[ri * row..(ri + 1) * row]),
                    "{cfg}: row {ri}"
                );
            }
        }
        // The plain options are the plain op, bitwise.
        let plain = c.run(&bes[0].1, &ks, &vs, &ts, &q, &row_seq, &pos, scale);
        let big_window = AttnOpts {
            window: 10_000,
            ..AttnOpts::none()
        };
        let wide = c.run_opts(
            &bes[0].1, &ks, &vs, &ts, &q, &row_seq, &pos, scale, big_window,
        );
        assert_eq!(
            bits(&plain),
            bits(&wide),
            "a window past every row changes nothing"
        );
    }
}

#[test]
fn sliding_window_never_reads_the_blocks_it_left() {
    let be = CpuBackend::new(Some(2)).unwrap();
    let (nkv, ratio, hd, bs) = (2usize, 2usize, 64usize, 16usize);
    let c = Case::new(77, nkv, ratio, hd, bs, vec![100]);
    let (mut kp, mut vp, t) = c.layout(Some(3));
    let pos = [99u32];
    let mut r = rng(78);
    let q = rand_vec(&mut r, c.n_heads * hd, 2.0);
    let opts = AttnOpts {
        window: 40,
        ..AttnOpts::none()
    };
    let before = c.run_opts(&be, &kp, &vp, &t, &q, &[0], &pos, 0.125, opts);
    // Keys 0..60 are outside the window: poison their whole blocks (0..3,
    // keys 0..48) and check nothing changes.
    let cell = nkv * hd;
    for &b in &t[0][..3] {
        let at = b as usize * bs * cell;
        kp[at..at + bs * cell].fill(f16::NAN);
        vp[at..at + bs * cell].fill(f16::INFINITY);
    }
    let after = c.run_opts(&be, &kp, &vp, &t, &q, &[0], &pos, 0.125, opts);
    assert_eq!(bits(&before), bits(&after));
    assert!(after.iter().all(|x| x.is_finite()));
}

#[test]
fn attention_options_are_validated() {
    let be = CpuBackend::new(Some(1)).unwrap();
    let c = Case::new(5, 1, 2, 64, 16, vec![20]);
    let (kp, vp, t) = c.layout(None);
    let q = vec![0.5f32; 2 * 64];
    let short = [0.5f32];
    for (opts, want) in [
        (
            AttnOpts {
                softcap: -1.0,
                ..AttnOpts::none()
            },
            "softcap",
        ),
        (
            AttnOpts {
                softcap: f32::NAN,
                ..AttnOpts::none()
            },
            "softcap",
        ),
        (
            AttnOpts {
                alibi: Some(&short[..]),
                ..AttnOpts::none()
            },
            "alibi",
        ),
        (
            AttnOpts {
                sinks: Some(&short[..]),
                ..AttnOpts::none()
            },
            "sinks",
        ),
    ] {
        let tabs: Vec<&[u32]> = t.iter().map(|t| t.as_slice()).collect();
        let mut out = vec![0f32; 2 * 64];
        let e = be
            .run(
                Op::PagedAttention {
                    q: &q,
                    n_heads: 2,
                    scale: 0.125,
                    cache: KvLayer {
                        k: &kp,
                        v: &vp,
                        block_size: 16,
                        n_kv_heads: 1,
                        head_dim: 64,
                        ty: quire::backend::KvType::F16,
                    },
                    batch: AttnBatch {
                        block_tables: &tabs,
                        row_seq: &[0],
                        positions: &[5],
                    },
                    opts,
                    out: &mut out,
                },
                Mode::Exact,
            )
            .unwrap_err();
        assert!(format!("{e:#}").contains(want), "{e:#}");
    }
}

#[test]
fn alibi_slopes_follow_the_paper() {
    // 8 heads, max bias 8: 2^-1 .. 2^-8.
    let s = alibi_slopes(8, 8.0);
    for (h, &x) in s.iter().enumerate() {
        assert_eq!(x, 2f32.powi(-(h as i32 + 1)));
    }
    // 12 heads: the first 8 as above, then the odd powers of 2^-0.5.
    let s = alibi_slopes(12, 8.0);
    assert_eq!(s[7], 2f32.powi(-8));
    assert!((s[8] as f64 - 2f64.powf(-0.5)).abs() < 1e-7);
    assert!((s[9] as f64 - 2f64.powf(-1.5)).abs() < 1e-7);
}

#[test]
fn quantized_kv_rows_round_trip_and_attend_as_their_values() {
    use quire::backend::{KvLayerMut, KvType};
    use quire::quant::{dequantize, quantize};
    let bes = backends();
    let (nkv, ratio, hd, bs) = (2usize, 3usize, 64usize, 16usize);
    let nh = nkv * ratio;
    let n = 50; // positions of one sequence
    let mut r = rng(41);
    let k = rand_vec(&mut r, n * nkv * hd, 2.0);
    let v = rand_vec(&mut r, n * nkv * hd, 2.0);
    let q = rand_vec(&mut r, n * nh * hd, 2.0);
    let n_blocks = n.div_ceil(bs) + 2;
    // Cells in scattered blocks: position p in block table[p / bs].
    let table: Vec<u32> = (0..n.div_ceil(bs) as u32).rev().map(|b| b + 1).collect();
    let slots: Vec<u32> = (0..n)
        .map(|p| table[p / bs] * bs as u32 + (p % bs) as u32)
        .collect();
    let pos: Vec<u32> = (0..n as u32).collect();
    let row_seq = vec![0u32; n];
    for ty in [KvType::Q8_0, KvType::Q4_0] {
        let units = n_blocks * bs * nkv * ty.row_units(hd);
        let (mut kc, mut vc) = (vec![f16::NAN; units], vec![f16::NAN; units]);
        bes[0]
            .1
            .run(
                Op::KvWrite {
                    k: &k,
                    v: &v,
                    slots: &slots,
                    cache: KvLayerMut {
                        k: &mut kc,
                        v: &mut vc,
                        block_size: bs,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        ty,
                    },
                },
                Mode::Exact,
            )
            .unwrap();
        let tabs: Vec<&[u32]> = vec![&table[..]];
        let run = |be: &CpuBackend, qs: &[f32], rs: &[u32], ps: &[u32]| {
            let mut out = vec![0f32; qs.len()];
            be.run(
                Op::PagedAttention {
                    q: qs,
                    n_heads: nh,
                    scale: 0.125,
                    cache: KvLayer {
                        k: &kc,
                        v: &vc,
                        block_size: bs,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        ty,
                    },
                    batch: AttnBatch {
                        block_tables: &tabs,
                        row_seq: rs,
                        positions: ps,
                    },
                    opts: AttnOpts::none(),
                    out: &mut out,
                },
                Mode::Exact,
            )
            .unwrap();
            out
        };
        let got = run(&bes[0].1, &q, &row_seq, &pos);
        // f64 reference over the dequantized rows.
        let rows = |x: &[f32]| -> Vec<f64> {
            x.chunks(hd)
                .flat_map(|row| {
                    let b = quantize(ty.ggml(), row).unwrap();
                    let mut y = vec![0f32; hd];
                    dequantize(ty.ggml(), &b, &mut y).unwrap();
                    y.into_iter().map(|v| v as f64)
                })
                .collect()
        };
        let (kd, vd) = (rows(&k), rows(&v));
        let mut want = vec![0f64; q.len()];
        for p in 0..n {
            for h in 0..nh {
                let kvh = h / ratio;
                let qv = &q[(p * nh + h) * hd..][..hd];
                let sc: Vec<f64> = (0..=p)
                    .map(|j| {
                        let kr = &kd[(j * nkv + kvh) * hd..][..hd];
                        qv.iter().zip(kr).map(|(&a, &b)| a as f64 * b).sum::<f64>() * 0.125
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    want[(p * nh + h) * hd + d] = e
                        .iter()
                        .enumerate()
                        .map(|(j, w)| w * vd[(j * nkv + kvh) * hd + d])
                        .sum::<f64>()
                        / z;
                }
            }
        }
        let e = nmse(&got, &want);
        assert!(e < 1e-10, "{ty}: nmse {e:.3e}");
        for (label, be) in &bes {
            assert_eq!(
                bits(&run(be, &q, &row_seq, &pos)),
                bits(&got),
                "{ty} {label}"
            );
        }
        // A row alone is bitwise the row in the batch.
        let row = nh * hd;
        for p in [0usize, 17, n - 1] {
            let alone = run(&bes[1].1, &q[p * row..(p + 1) * row], &[0], &[p as u32]);
            assert_eq!(
                bits(&alone),
                bits(&got[p * row..(p + 1) * row]),
                "{ty} row {p}"
            );
        }
        // Quantized rows are lossy: the f16 cache's result is close, not equal.
        assert!(got.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn a_head_dim_the_kv_blocks_do_not_fit_is_an_error() {
    use quire::backend::{KvLayerMut, KvType};
    let be = CpuBackend::new(Some(1)).unwrap();
    let (k, v) = (vec![0.5f32; 2 * 40], vec![0.5f32; 2 * 40]);
    let mut kc = vec![f16::ZERO; 16 * 2 * 40];
    let mut vc = kc.clone();
    let e = be
        .run(
            Op::KvWrite {
                k: &k,
                v: &v,
                slots: &[0, 1],
                cache: KvLayerMut {
                    k: &mut kc,
                    v: &mut vc,
                    block_size: 16,
                    n_kv_heads: 2,
                    head_dim: 40,
                    ty: KvType::Q8_0,
                },
            },
            Mode::Exact,
        )
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("multiple of 32") && msg.contains("f16"),
        "{msg}"
    );
}
