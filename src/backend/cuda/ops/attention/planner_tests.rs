//! The attention planner's table tests: shapes x modes x architectures ->
//! the plan today's defaults take, and the invariant of `deterministic`
//! and `exact` (a row's reduction order does not follow the batch).

use super::*;
use crate::backend::cuda::ops::attention::{ATT_PIPE, ATT_RMMA};
use crate::backend::cuda::tuning::{AttnFamily, Switch, Tuning};

/// A device's capabilities: `sms` SMs of `arch_major`, the occupancy of
/// each counted kernel (CTAs per SM by family and head_dim class, as an
/// H100/H200 gives them) and, on sm_90+, clusters by size (one GPC-free
/// model: every SM's worth of whole clusters).
struct Dev {
    arch_major: u32,
    sms: usize,
    per_sm: HashMap<&'static str, usize>,
    clusters: HashMap<(&'static str, usize), usize>,
}

impl Dev {
    fn new(arch_major: u32, sms: usize) -> Dev {
        let mut per_sm = HashMap::new();
        let mut clusters = HashMap::new();
        // (form index in ATT_PIPE, CTAs per SM at head_dim 64, at 128).
        for (form, n64, n128) in [
            (SplitForm::Partials, 4, 3),
            (SplitForm::Partials8, 3, 1),
            (SplitForm::Wide, 6, 4),
            (SplitForm::Deep, 3, 2),
        ] {
            for (d, n) in [(0, n64), (1, n128)] {
                for &e in &ATT_PIPE[form as usize][d] {
                    per_sm.insert(e, n);
                }
            }
        }
        per_sm.insert("paged_attention_split", 4);
        if arch_major >= 9 {
            for form in [SplitForm::Cluster, SplitForm::Cluster8] {
                for &e in ATT_PIPE[form as usize].iter().flatten() {
                    for c in 2..=16 {
                        clusters.insert((e, c), sms / c);
                    }
                }
            }
            for &e in ATT_RMMA[1].iter().flatten() {
                for c in 2..=4 {
                    clusters.insert((e, c), sms / c);
                }
            }
            for c in 2..=ATT_EX_CLUSTER_MAX {
                clusters.insert(("paged_attention_par", c), sms / c);
            }
        }
        Dev {
            arch_major,
            sms,
            per_sm,
            clusters,
        }
    }

    fn caps(&self) -> AttnCaps<'_> {
        AttnCaps {
            arch_major: self.arch_major,
            sms: self.sms,
            per_sm: &self.per_sm,
            clusters: &self.clusters,
            exact_threads: 256,
        }
    }
}

fn h100() -> Dev {
    Dev::new(9, 132)
}

fn a100() -> Dev {
    Dev::new(8, 108)
}

/// A decode batch of `rows` rows of (heads, kv_heads, head_dim) heads
/// whose longest row has `chunks` 128-key chunks, 16-cell pages, device
/// fusions on, no read-ahead.
fn decode(
    rows: usize,
    (heads, kv_heads, head_dim): (usize, usize, usize),
    chunks: usize,
) -> AttnShape {
    AttnShape {
        rows,
        heads,
        kv_heads,
        head_dim,
        block_size: 16,
        kv_cells: 1 << 20,
        part_ctas: chunks,
        prefill_tiles: false,
        one_row_per_seq: true,
        fusions: true,
        read_ahead: false,
        scored: false,
    }
}

const SMOL: (usize, usize, usize) = (9, 3, 64);
const L1B: (usize, usize, usize) = (32, 8, 64);
const L8B: (usize, usize, usize) = (32, 8, 128);

fn tuning(arch: &str) -> AttentionTuning {
    Tuning::for_arch(arch).attention
}

fn split(s: &AttnShape, mode: Mode, dev: &Dev, t: &AttentionTuning) -> SplitPlan {
    match plan(s, mode, &dev.caps(), t).unwrap() {
        AttnPlan::Split(p) => p,
        other => panic!("{s:?} {mode:?}: {other:?}"),
    }
}

/// (kernel, parts, ctas_y, tma) of a split plan.
fn brief(p: &SplitPlan) -> (&'static str, usize, usize, bool) {
    (p.kernel, p.parts, p.ctas_y, p.tma)
}

#[test]
fn fast_decode_table_on_an_h100() {
    let (dev, t) = (h100(), tuning("sm_90"));
    let f = |s: AttnShape| brief(&split(&s, Mode::Fast, &dev, &t));
    // One chunk, few units: the tensor-core row form, one CTA per unit.
    assert_eq!(f(decode(1, SMOL, 1)), ("att_rmma_d2_g3", 32, 1, false));
    assert_eq!(f(decode(1, L8B, 1)), ("att_rmma_d4_g4", 32, 1, false));
    // SmolLM2 B=1 at two chunks (64 KiB of K/V): still the row on tensor
    // cores; at 8 chunks (256 KiB) its cluster form of 3 CTAs per unit.
    assert_eq!(f(decode(1, SMOL, 2)), ("att_rmma_d2_g3", 32, 1, false));
    assert_eq!(f(decode(1, SMOL, 8)), ("att_rmma_c_d2_g3", 32, 3, false));
    // The 8B, B=1, 16 chunks: 8 x 16 CTAs, the eight-warp partials (one
    // wave of them at one per SM; past cluster_ctas_max for clusters),
    // bulk copies, the combine merges.
    let p = split(&decode(1, L8B, 16), Mode::Fast, &dev, &t);
    assert_eq!(brief(&p), ("att_pipe8_d4_g4", 32, 16, true));
    assert!(!p.merges() && !p.clustered());
    // The 1B, B=1, 4 chunks (read-ahead capture): the combine instead of
    // the split forms' cluster makes the tensor-core row form take rows up
    // to 192 KiB (6 chunks at head_dim 64).
    let ra = AttnShape {
        read_ahead: true,
        ..decode(1, L1B, 4)
    };
    assert_eq!(f(ra), ("att_rmma_d2_g4", 32, 1, false));
    // Without the read-ahead, four chunks are 128 KiB: the cluster form.
    assert_eq!(f(decode(1, L1B, 4)), ("att_rmma_c_d2_g4", 32, 2, false));
    // The 8B, B=8, 4 chunks: 64 units, parts for 396 slots (6), 4 CTAs per
    // unit: 256 CTAs, past 80 for clusters; the four-warp partials
    // (more than two CTAs per SM of the eight-warp form's one) and the
    // combine.
    assert_eq!(f(decode(8, L8B, 4)), ("att_pipe_d4_g4", 6, 4, true));
    // One chunk at B=8: 64 units, at most one per two SMs: the tensor-core
    // row form.
    assert_eq!(f(decode(8, L8B, 1)), ("att_rmma_d4_g4", 6, 1, false));
    // B=16, one chunk: 128 units, not the row forms; one CTA per unit
    // merges its own partials (att_pipe_m_), four warps (128 CTAs fit
    // the eight-warp form's one wave: its eight warps).
    assert_eq!(f(decode(16, L8B, 1)), ("att_pipe8_m_d4_g4", 3, 1, true));
    // B=32 / 64, 4 and 16 chunks of the 8B: the deep merging form (one
    // partial, units fill 264 deep slots).
    assert_eq!(f(decode(32, L8B, 4)), ("att_pipe_m3_d4_g4", 1, 1, true));
    assert_eq!(f(decode(64, L8B, 16)), ("att_pipe_m3_d4_g4", 1, 1, true));
    // B=64 past 16 chunks: the 16-key split form, 3 partials.
    assert_eq!(f(decode(64, L8B, 32)), ("att_pipe_d4_g4", 3, 3, true));
    // B=16 of the 8B at 4 chunks: 128 units x 3 parts = 384 CTAs in one
    // wave; deep would need 264 units; the four-warp partials.
    assert_eq!(f(decode(16, L8B, 4)), ("att_pipe_d4_g4", 3, 3, true));
}

#[test]
fn fast_decode_table_on_an_a100() {
    // No clusters and no bulk copies before sm_90.
    let (dev, t) = (a100(), tuning("sm_80"));
    let f = |s: AttnShape| brief(&split(&s, Mode::Fast, &dev, &t));
    assert_eq!(f(decode(1, SMOL, 1)), ("att_rmma_d2_g3", 32, 1, false));
    // SmolLM2 at 8 chunks: no cluster form; the eight-warp partials, 3 x
    // 8 CTAs.
    assert_eq!(f(decode(1, SMOL, 8)), ("att_pipe8_d2_g3", 32, 8, false));
    // The 8B at 16 chunks: 128 CTAs, past one wave of the eight-warp
    // form (one per SM on 108 SMs): the four-warp partials.
    assert_eq!(f(decode(1, L8B, 16)), ("att_pipe_d4_g4", 32, 16, false));
    // B=32 of the 8B at 4 chunks: 256 units do not fill 216 deep slots in
    // whole waves (one partial would be 59% of two), so the multi-wave
    // 8-key form, 5 partials for its 432 slots (99% of three waves).
    assert_eq!(f(decode(32, L8B, 4)), ("att_pipe_w_d4_g4", 5, 4, false));
    // B=27 (216 units: one whole wave of 216 at one partial): deep.
    assert_eq!(f(decode(27, L8B, 4)), ("att_pipe_m3_d4_g4", 1, 1, false));
}

#[test]
fn other_plans() {
    let (dev, t) = (h100(), tuning("sm_90"));
    let caps = dev.caps();
    // Prefill (fast, tiles): the grouped tensor-core kernel up to 8 heads
    // per KV head, else one warp per head.
    let pre = |heads: (usize, usize, usize)| AttnShape {
        prefill_tiles: true,
        one_row_per_seq: false,
        ..decode(256, heads, 4)
    };
    assert_eq!(
        plan(&pre(L8B), Mode::Fast, &caps, &t).unwrap(),
        AttnPlan::Prefill {
            kernel: "flash_attention_prefill_g",
            grid_y: 8,
            threads: 128
        }
    );
    assert_eq!(
        plan(&pre(SMOL), Mode::Fast, &caps, &t).unwrap(),
        AttnPlan::Prefill {
            kernel: "flash_attention_prefill_g",
            grid_y: 3,
            threads: 96
        }
    );
    assert_eq!(
        plan(&pre((12, 1, 64)), Mode::Fast, &caps, &t).unwrap(),
        AttnPlan::Prefill {
            kernel: "flash_attention_prefill",
            grid_y: 12,
            threads: 32
        }
    );
    // Prefill with head_dim 256 or in deterministic: the split forms.
    assert!(matches!(
        plan(&pre((8, 8, 256)), Mode::Fast, &caps, &t).unwrap(),
        AttnPlan::Split(_)
    ));
    // head_dim not a multiple of 8: eight warps per (row, head).
    assert_eq!(
        plan(&decode(1, (4, 4, 20), 1), Mode::Fast, &caps, &t).unwrap(),
        AttnPlan::RowHead
    );
    // More than 8 heads per KV head or head_dim past 128: the per-head
    // split kernel and the combine.
    let p = split(&decode(1, (12, 1, 64), 4), Mode::Fast, &dev, &t);
    assert_eq!(
        (p.form, p.kernel, p.ctas_x),
        (None, "paged_attention_split", 12)
    );
    assert!(!p.merges() && !p.tma);
    // Past 256: no plan (the capability says why).
    assert!(plan(&decode(1, (4, 4, 264), 1), Mode::Fast, &caps, &t).is_err());
    assert!(head_dim_supported(264).is_err() && head_dim_supported(256).is_ok());
}

#[test]
fn exact_table() {
    let (dev, t) = (h100(), tuning("sm_90"));
    let caps = dev.caps();
    let ex = |rows, chunks| plan(&decode(rows, L8B, chunks), Mode::Exact, &caps, &t).unwrap();
    let par = |kernel, cluster| AttnPlan::ExactPar {
        kernel,
        threads: 256,
        cluster,
    };
    // B=1 (32 pairs): 20 chunks of 32 keys want 3 CTAs, 132 / 32 = 4 fit.
    assert_eq!(ex(1, 5), par("paged_attention_par", 3));
    // Long rows: 4 CTAs (132 SMs / 32 pairs).
    assert_eq!(ex(1, 32), par("paged_attention_par", 4));
    // Short rows of many pairs: one warp each.
    assert_eq!(ex(8, 1), AttnPlan::ExactWarp);
    // B=8 past one chunk: 256 pairs, no cluster, two CTAs per SM.
    assert_eq!(ex(8, 4), par("paged_attention_par2", 1));
    // B=4 (128 pairs): one CTA per (row, head), one wave.
    assert_eq!(ex(4, 4), par("paged_attention_par", 1));
    // Forced cluster sizes (gpu-check's parity steps).
    let forced = |c| AttentionTuning {
        exact_cluster: Some(c),
        ..tuning("sm_90")
    };
    let ex_t = |c| plan(&decode(1, L8B, 5), Mode::Exact, &caps, &forced(c)).unwrap();
    assert_eq!(ex_t(8), par("paged_attention_par", 8));
    assert_eq!(ex_t(2), par("paged_attention_par", 2));
    assert_eq!(ex_t(1), par("paged_attention_par", 1));
    // Before sm_90: no clusters.
    let a = a100();
    let p = plan(&decode(1, L8B, 5), Mode::Exact, &a.caps(), &t).unwrap();
    assert_eq!(p, par("paged_attention_par", 1));
}

#[test]
fn exact_cluster_spreads_batch_one_over_the_sms() {
    // 8B heads, batch 1, 20 chunks (~640 keys), 8 warps, 132 SMs.
    assert_eq!(exact_cluster_rule(32, 20, 8, 132), 3);
    // Long rows: capped by the SMs (4 CTAs per pair), then the limit.
    assert_eq!(exact_cluster_rule(32, 64, 8, 132), 4);
    assert_eq!(exact_cluster_rule(8, 64, 8, 132), 4);
    assert_eq!(exact_cluster_rule(2, 32, 4, 132), 8);
    // Enough pairs to fill the GPU: no cluster.
    assert_eq!(exact_cluster_rule(256, 20, 8, 132), 1);
    assert_eq!(exact_cluster_rule(64, 20, 8, 132), 2);
    // Few chunks: one CTA's warps suffice.
    assert_eq!(exact_cluster_rule(32, 5, 8, 132), 1);
}

#[test]
fn deterministic_is_the_four_warp_split_of_every_chunk() {
    let (dev, t) = (h100(), tuning("sm_90"));
    // B=1, one chunk: one CTA per unit merges (the fusions' merging form);
    // B=1, 8 chunks: a cluster of 8 per unit; B=8 at 16 chunks (1,024
    // CTAs): the partials and the combine.
    let f = |s: AttnShape| brief(&split(&s, Mode::Deterministic, &dev, &t));
    assert_eq!(f(decode(1, L8B, 1)), ("att_pipe_m_d4_g4", 32, 1, true));
    assert_eq!(f(decode(1, SMOL, 8)), ("att_pipe_c_d2_g3", 32, 8, true));
    // Beside the read-ahead branch the combine merges instead (the same
    // bits).
    let ra = AttnShape {
        read_ahead: true,
        ..decode(1, SMOL, 8)
    };
    assert_eq!(f(ra), ("att_pipe_d2_g3", 32, 8, true));
    assert_eq!(f(decode(8, L8B, 16)), ("att_pipe_d4_g4", 32, 16, true));
    // Without the fusions (check-exact's reference): the partials and the
    // combine even for one CTA per unit.
    let unfused = AttnShape {
        fusions: false,
        ..decode(1, L8B, 1)
    };
    assert_eq!(f(unfused), ("att_pipe_d4_g4", 32, 1, true));
}

/// Every tuning table a test may set: none may change a bit of
/// `deterministic` or `exact`.
fn tunings() -> Vec<AttentionTuning> {
    let base = tuning("sm_90");
    let mut v = vec![base.clone()];
    for sw in [Switch::On, Switch::Off] {
        v.push(AttentionTuning {
            rmma: sw,
            rmma_cluster: sw,
            row: sw,
            wide: sw,
            deep: sw,
            eight: sw,
            tma: sw,
            cluster: sw == Switch::On,
            exact_cluster: Some(if sw == Switch::On { 3 } else { 1 }),
            rmma_cluster_ctas: Some(3),
            ..base.clone()
        });
    }
    for family in [AttnFamily::Canonical, AttnFamily::Split, AttnFamily::Mma] {
        v.push(AttentionTuning {
            family,
            ..base.clone()
        });
    }
    v.push(AttentionTuning {
        cluster_ctas_max: 10_000,
        row_chunks_max: 32,
        ..base
    });
    v
}

#[test]
fn deterministic_and_exact_ignore_the_attention_family() {
    let dev = h100();
    let caps = dev.caps();
    for mode in [Mode::Deterministic, Mode::Exact] {
        for h in [SMOL, L8B, (8, 8, 80), (4, 4, 20)] {
            for (rows, chunks, tiles) in [(1, 1, false), (8, 4, false), (64, 2, true)] {
                let s = AttnShape {
                    prefill_tiles: tiles,
                    one_row_per_seq: !tiles,
                    ..decode(rows, h, chunks)
                };
                let base = plan(&s, mode, &caps, &tuning("sm_90")).unwrap();
                for family in [AttnFamily::Canonical, AttnFamily::Split, AttnFamily::Mma] {
                    let t = AttentionTuning {
                        family,
                        ..tuning("sm_90")
                    };
                    let p = plan(&s, mode, &caps, &t).unwrap();
                    assert_eq!(p, base, "{mode:?} {s:?} {family:?}");
                    // Asked for another family: one note says what ran.
                    let note = family_note(&s, mode, &t, &p);
                    assert_eq!(note.is_some(), p.family() != family, "{note:?}");
                }
            }
        }
    }
}

#[test]
fn fast_takes_the_attention_family_asked_for_where_it_has_one() {
    let dev = h100();
    let caps = dev.caps();
    let with = |family| AttentionTuning {
        family,
        ..tuning("sm_90")
    };
    let prefill = |h| AttnShape {
        prefill_tiles: true,
        one_row_per_seq: false,
        ..decode(128, h, 2)
    };
    // (shape, family asked for, family that runs)
    let table = [
        (
            decode(1, L8B, 4),
            AttnFamily::Canonical,
            AttnFamily::Canonical,
        ),
        (decode(1, L8B, 4), AttnFamily::Split, AttnFamily::Split),
        (decode(1, L8B, 4), AttnFamily::Mma, AttnFamily::Mma),
        (decode(32, L1B, 2), AttnFamily::Mma, AttnFamily::Mma),
        (decode(32, L1B, 2), AttnFamily::Split, AttnFamily::Split),
        // head_dim 80: no tensor-core decode form; 20: no split form.
        (decode(4, (8, 8, 80), 2), AttnFamily::Mma, AttnFamily::Split),
        (
            decode(4, (4, 4, 20), 2),
            AttnFamily::Split,
            AttnFamily::Split,
        ),
        (
            decode(4, (4, 4, 20), 2),
            AttnFamily::Canonical,
            AttnFamily::Canonical,
        ),
        (prefill(L8B), AttnFamily::Mma, AttnFamily::Mma),
        (prefill(L8B), AttnFamily::Split, AttnFamily::Split),
        (prefill(L8B), AttnFamily::Canonical, AttnFamily::Canonical),
        (prefill((8, 8, 256)), AttnFamily::Mma, AttnFamily::Split),
    ];
    for (s, want, runs) in table {
        let t = with(want);
        let p = plan(&s, Mode::Fast, &caps, &t).unwrap();
        assert_eq!(p.family(), runs, "{s:?} asked {want:?}: {p:?}");
        let note = family_note(&s, Mode::Fast, &t, &p);
        assert_eq!(note.is_some(), runs != want, "{note:?}");
        if let Some(n) = note {
            assert!(
                n.contains(&format!("{want:?}")) && n.contains(&format!("{runs:?}")),
                "{n}"
            );
        }
    }
    // Launches with options take the canonical kernel in every mode.
    let scored = AttnShape {
        scored: true,
        ..decode(8, L8B, 3)
    };
    for mode in [Mode::Fast, Mode::Deterministic, Mode::Exact] {
        for family in [AttnFamily::Auto, AttnFamily::Mma, AttnFamily::Split] {
            let p = plan(&scored, mode, &caps, &with(family)).unwrap();
            assert_eq!(p, AttnPlan::Scored);
            assert_eq!(p.reduction_order(), ReductionOrder::Canonical);
        }
    }
}

#[test]
fn deterministic_and_exact_orders_do_not_follow_the_batch() {
    let devs = [h100(), a100(), Dev::new(9, 78)];
    let heads = [
        SMOL,
        L1B,
        L8B,
        (8, 8, 80),
        (12, 1, 64),
        (4, 4, 20),
        (8, 8, 256),
        (16, 2, 96),
    ];
    for mode in [Mode::Deterministic, Mode::Exact] {
        for t in tunings() {
            for dev in &devs {
                let caps = dev.caps();
                for h in heads {
                    // The order of a row alone, decoded.
                    let one = plan(&decode(1, h, 1), mode, &caps, &t)
                        .unwrap()
                        .reduction_order();
                    if mode == Mode::Exact {
                        assert_eq!(one, ReductionOrder::Canonical);
                    } else {
                        assert_ne!(one, ReductionOrder::Prefill);
                    }
                    if let ReductionOrder::Split { parts, warps, .. } = one {
                        // The KV split: ATT_PARTS partials of 128-key
                        // chunks aligned to position 0; four warps.
                        assert_eq!((parts, warps), (ATT_PARTS, 4), "{h:?}");
                    }
                    for rows in 1..=80 {
                        for chunks in [1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32] {
                            for (prefill_tiles, one_row_per_seq) in
                                [(false, true), (true, false), (false, false)]
                            {
                                for (fusions, read_ahead) in
                                    [(true, false), (true, true), (false, false)]
                                {
                                    let s = AttnShape {
                                        prefill_tiles,
                                        one_row_per_seq,
                                        fusions,
                                        read_ahead,
                                        ..decode(rows, h, chunks)
                                    };
                                    let o = plan(&s, mode, &caps, &t).unwrap().reduction_order();
                                    assert_eq!(o, one, "{mode:?} {s:?} {t:?}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fast_plans_are_functions_of_the_batch_shape() {
    // A captured graph replays its plan: the same shape gives the same
    // plan, and a plan's geometry stays within its kernel's bounds.
    let (dev, t) = (h100(), tuning("sm_90"));
    for h in [SMOL, L1B, L8B] {
        for rows in 1..=64 {
            for chunks in 1..=32 {
                let s = decode(rows, h, chunks);
                let p = split(&s, Mode::Fast, &dev, &t);
                assert_eq!(p, split(&s, Mode::Fast, &dev, &t));
                assert!((1..=ATT_PARTS).contains(&p.parts));
                assert!(p.ctas_y >= 1 && p.ctas_y <= p.parts.max(p.ctas_y));
                if p.clustered() {
                    assert!((2..=16).contains(&p.ctas_y), "{s:?} {p:?}");
                } else if p.merges() {
                    assert_eq!(p.ctas_y, 1, "{s:?} {p:?}");
                }
                assert!(p.smem <= 227 * 1024);
            }
        }
    }
}
