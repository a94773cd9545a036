//! The planner's table tests: shape x mode x arch -> plan, pinning the
//! default choices, and the invariant of `deterministic` and `exact`: a
//! row's reduction order does not depend on the batch's row count.

use super::mq::{MQ_BASE, MQ_T16_K2B, MQ_T8_K2B, MQ_W2};
use super::*;
use crate::backend::cuda::tuning::{GluForm, MatmulTuning, Switch, WrShape};
use crate::backend::Mode;
use crate::quant::GgmlType;

/// An H100-like sm_90 (132 SMs, cuBLAS, the wgmma kernels loaded) and an
/// A100-like sm_80 (108 SMs, cuBLAS).
const SM90: MmCaps = MmCaps {
    arch_major: 9,
    sms: 132,
    cublas: true,
    wgmma: true,
};
const SM80: MmCaps = MmCaps {
    arch_major: 8,
    sms: 108,
    cublas: true,
    wgmma: false,
};

const TYPES: [GgmlType; 9] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Job shapes (rows of each job, k): the 8B's q/k/v, o, gate/up, down and
/// head; the 1B's q/k/v and down; SmolLM2's head; a k not a multiple of 32.
const JOBS: [(&[usize], usize); 9] = [
    (&[4096, 1024, 1024], 4096),
    (&[4096], 4096),
    (&[14336, 14336], 4096),
    (&[4096], 14336),
    (&[128256], 4096),
    (&[2048, 512, 512], 2048),
    (&[2048], 8192),
    (&[49152], 576),
    (&[96], 48),
];

/// Row counts: every decode batch up to 64, then prefill sizes.
fn row_counts() -> impl Iterator<Item = usize> {
    (1..=64).chain([65, 96, 127, 128, 300, 512, 513, 2048])
}

fn shape(ty: GgmlType, rows: &[usize], k: usize, n: usize) -> MmShape<'_> {
    MmShape {
        ty,
        k,
        n,
        rows,
        aligned16: true,
        outs_vec4: true,
    }
}

fn plan_of(ty: GgmlType, rows: &[usize], k: usize, n: usize, mode: Mode, caps: &MmCaps) -> MmPlan {
    plan(
        &shape(ty, rows, k, n),
        mode,
        caps,
        &MatmulTuning::for_arch(caps.arch_major),
    )
}

#[test]
fn deterministic_and_exact_reduction_order_ignores_the_row_count() {
    for caps in [SM80, SM90] {
        for mode in [Mode::Exact, Mode::Deterministic] {
            for ty in TYPES {
                for (rows, k) in JOBS {
                    let one = plan_of(ty, rows, k, 1, mode, &caps).k_order();
                    for n in row_counts() {
                        let p = plan_of(ty, rows, k, n, mode, &caps);
                        assert_eq!(
                            p.k_order(),
                            one,
                            "{mode:?} {ty:?} rows {rows:?} k {k} n {n} on sm_{}0: {p:?}",
                            caps.arch_major
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn deterministic_and_exact_ignore_the_tuning_table() {
    // Every knob away from its default: still the same plans in those
    // modes (the table may only change `fast`).
    let mut t = MatmulTuning::for_arch(9);
    t.mma_min_rows = 0;
    t.mma_max_rows = 100_000;
    t.mq_min_rows = 0;
    t.mq_wn = Some(2);
    t.mv_warps = 4;
    t.mv_warps_float = 4;
    t.mv_warps_long = 4;
    t.mv_short = Switch::On;
    t.wgmma = Switch::On;
    t.wr_shape = WrShape::N256;
    t.wr_split = Some(4);
    t.wr_tail_sms = Some(4);
    for mode in [Mode::Exact, Mode::Deterministic] {
        for ty in TYPES {
            for (rows, k) in JOBS {
                for n in row_counts() {
                    let s = shape(ty, rows, k, n);
                    assert_eq!(
                        plan(&s, mode, &SM90, &t),
                        plan(&s, mode, &SM90, &MatmulTuning::for_arch(9)),
                        "{mode:?} {ty:?} {rows:?} k {k} n {n}"
                    );
                }
            }
        }
    }
}

#[test]
fn fast_reduction_order_follows_the_row_count() {
    // The negative control: `fast` is allowed to change a row's order
    // with the batch, and does (warp-per-row at one row, int8 tensor
    // cores with a split-K at 16, wgmma at 512).
    let (rows, k) = (&[4096usize][..], 4096);
    let orders: Vec<KOrder> = [1, 16, 512]
        .iter()
        .map(|&n| plan_of(GgmlType::Q4_0, rows, k, n, Mode::Fast, &SM90).k_order())
        .collect();
    assert_ne!(orders[0], orders[1]);
    assert_ne!(orders[1], orders[2]);
}

#[test]
fn exact_forms() {
    let c = SM90;
    let q4 = GgmlType::Q4_0;
    let e = |ty, n, k| plan_of(ty, &[4096], k, n, Mode::Exact, &c);
    assert_eq!(e(q4, 1, 4096), MmPlan::Exact(ExactForm::Matvec));
    assert_eq!(e(q4, 8, 4096), MmPlan::Exact(ExactForm::Matvec));
    // Past the decode matvec: the int8 tensor-core form of the canonical
    // kernel for Q4_0 / Q4_1 / Q8_0 with k a multiple of 256, mm_q32 for
    // the rest.
    for ty in [q4, GgmlType::Q4_1, GgmlType::Q8_0] {
        for n in [9, 33, 64, 512, 2048] {
            assert!(
                matches!(e(ty, n, 4096), MmPlan::Exact(ExactForm::Mma { .. })),
                "{ty:?} n {n}"
            );
        }
    }
    assert_eq!(e(GgmlType::Q5_0, 9, 4096), MmPlan::Exact(ExactForm::Q32));
    assert_eq!(e(GgmlType::Q5_1, 512, 4096), MmPlan::Exact(ExactForm::Q32));
    assert_eq!(e(q4, 512, 576), MmPlan::Exact(ExactForm::Q32));
    assert_eq!(e(q4, 512, 1312), MmPlan::Exact(ExactForm::Q32));
    let sm75 = MmCaps { arch_major: 7, ..c };
    assert_eq!(
        plan_of(q4, &[4096], 4096, 512, Mode::Exact, &sm75),
        MmPlan::Exact(ExactForm::Q32)
    );
    let mut unaligned = shape(q4, &[4096], 4096, 512);
    unaligned.aligned16 = false;
    let t = MatmulTuning::for_arch(9);
    assert_eq!(
        plan(&unaligned, Mode::Exact, &c, &t),
        MmPlan::Exact(ExactForm::Q32)
    );
    // The table: the one-k-group entry, and the form from two rows (the
    // decode matvec's rows otherwise); the same bits either way.
    let xm = |n, t: &MatmulTuning| plan(&shape(q4, &[4096], 4096, n), Mode::Exact, &c, t);
    assert_eq!((XM_FORMS[0].kg, XM_FORMS[1].kg), (2, 1));
    // By rows: two k groups for batched decode, one for prefill.
    assert_eq!(xm(64, &t), MmPlan::Exact(ExactForm::Mma { form: 0 }));
    assert_eq!(xm(65, &t), MmPlan::Exact(ExactForm::Mma { form: 1 }));
    let mut k1 = t.clone();
    k1.exact_mma_kg = Some(1);
    assert_eq!(xm(9, &k1), MmPlan::Exact(ExactForm::Mma { form: 1 }));
    k1.exact_mma_kg = Some(2);
    assert_eq!(xm(512, &k1), MmPlan::Exact(ExactForm::Mma { form: 0 }));
    let mut from2 = t.clone();
    from2.exact_mma_rows = 1;
    assert_eq!(
        plan(&shape(q4, &[4096], 4096, 2), Mode::Exact, &c, &from2),
        MmPlan::Exact(ExactForm::Mma { form: 0 })
    );
    assert_eq!(
        plan(&shape(q4, &[4096], 4096, 1), Mode::Exact, &c, &from2),
        MmPlan::Exact(ExactForm::Matvec)
    );
    // Every entry's shared memory fits an sm_90 CTA (227 KiB).
    for f in XM_FORMS {
        assert!(
            xm_smem_max(f.name).is_some_and(|b| b <= 227 * 1024),
            "{f:?}"
        );
    }
    let mut off = t.clone();
    off.exact_mma = false;
    assert_eq!(
        plan(&shape(q4, &[4096], 4096, 512), Mode::Exact, &c, &off),
        MmPlan::Exact(ExactForm::Q32)
    );
    assert_eq!(e(GgmlType::Q4_K, 1, 4096), MmPlan::Exact(ExactForm::KQuant));
    assert_eq!(e(GgmlType::F16, 512, 4096), MmPlan::Exact(ExactForm::Float));
    // k not a multiple of 32: the canonical kernels in every mode.
    for mode in [Mode::Deterministic, Mode::Fast] {
        assert_eq!(
            plan_of(GgmlType::F32, &[96], 48, 3, mode, &c),
            MmPlan::Exact(ExactForm::Float)
        );
    }
    // Nothing to compute.
    assert_eq!(plan_of(q4, &[4096], 4096, 0, Mode::Fast, &c), MmPlan::Empty);
    assert_eq!(plan_of(q4, &[0], 4096, 3, Mode::Fast, &c), MmPlan::Empty);
    assert_eq!(plan_of(q4, &[4096], 0, 3, Mode::Exact, &c), MmPlan::Zero);
}

#[test]
fn deterministic_is_one_k_group_mma_or_the_one_warp_matvec() {
    for caps in [SM80, SM90] {
        for n in row_counts() {
            // The int8 tensor cores for the types they take, one k group,
            // the 4096-row matrix's split (8 x 16 blocks on 132 SMs).
            let want = super::mq_det_splits(4096, 128, caps.sms);
            for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
                match plan_of(ty, &[4096], 4096, n, Mode::Deterministic, &caps) {
                    MmPlan::Mq {
                        kern,
                        splits,
                        per_split,
                        ..
                    } if kern.ks == 1 && (splits, per_split) == want => {}
                    p => panic!("{ty:?} n {n}: {p:?}"),
                }
            }
            // k not a multiple of 256, other types: the matvec.
            assert_eq!(
                plan_of(GgmlType::Q4_0, &[4096], 4000, n, Mode::Deterministic, &caps),
                MmPlan::Matvec {
                    float: false,
                    warps: 1
                }
            );
            assert_eq!(
                plan_of(GgmlType::Q4_K, &[4096], 4096, n, Mode::Deterministic, &caps),
                MmPlan::Matvec {
                    float: false,
                    warps: 1
                }
            );
            assert_eq!(
                plan_of(GgmlType::F16, &[4096], 4096, n, Mode::Deterministic, &caps),
                MmPlan::Matvec {
                    float: true,
                    warps: 1
                }
            );
        }
    }
}

#[test]
fn fast_by_rows_on_q4_0() {
    // The 8B's o projection (4096 x 4096) on an H100.
    let p = |n| plan_of(GgmlType::Q4_0, &[4096], 4096, n, Mode::Fast, &SM90);
    assert_eq!(
        p(1),
        MmPlan::Matvec {
            float: false,
            warps: 1
        }
    );
    let mq = |kern, splits, per_split| MmPlan::Mq {
        kern,
        splits,
        per_split,
        vec4: true,
    };
    // 2..=64 rows: the int8 tensor-core kernels (t8_k2b is for Q8_0 only:
    // the 4-bit types take t16_k2b up to 16 rows).
    assert_eq!(p(2), mq(MQ_T16_K2B, 8, 16));
    assert_eq!(p(16), mq(MQ_T16_K2B, 8, 16));
    assert_eq!(p(17), mq(MQ_W2, 8, 16));
    assert_eq!(p(64), mq(MQ_W2, 8, 16));
    // Past 64: the wgmma GEMM (one wave of 128 x 128 CTAs at 65 rows is
    // 32 CTAs: too few for the default rule, so cuBLAS), 512: wgmma in two
    // k halves of 128 x 256 CTAs.
    assert_eq!(p(65), MmPlan::Blas);
    assert_eq!(
        p(512),
        MmPlan::Wgmma {
            shape: 2,
            splits: 2,
            tail: None
        }
    );
    // sm_80 has no wgmma: cuBLAS.
    assert_eq!(
        plan_of(GgmlType::Q4_0, &[4096], 4096, 512, Mode::Fast, &SM80),
        MmPlan::Blas
    );
    // Q8_0 at 8 rows: t8_k2b.
    assert_eq!(
        plan_of(GgmlType::Q8_0, &[4096], 4096, 8, Mode::Fast, &SM90),
        mq(MQ_T8_K2B, 8, 16)
    );
}

#[test]
fn fast_by_rows_on_other_types() {
    // Q5_0 (no int8 MMA kernel): warp-per-row up to 7 rows, the f16 tile
    // kernel for 8..=64, then the prefill GEMMs.
    let p = |n| plan_of(GgmlType::Q5_0, &[4096], 4096, n, Mode::Fast, &SM90);
    assert_eq!(
        p(7),
        MmPlan::Matvec {
            float: false,
            warps: 1
        }
    );
    assert_eq!(
        p(8),
        MmPlan::Tile {
            splits: vec![(8, 16)]
        }
    );
    assert_eq!(
        p(64),
        MmPlan::Tile {
            splits: vec![(8, 16)]
        }
    );
    assert_eq!(
        p(512),
        MmPlan::Wgmma {
            shape: 2,
            splits: 2,
            tail: None
        }
    );
    // K-quants: the tile kernel, cuBLAS past 64 (no wgmma form).
    assert!(matches!(
        plan_of(GgmlType::Q4_K, &[4096], 4096, 8, Mode::Fast, &SM90),
        MmPlan::Tile { .. }
    ));
    assert_eq!(
        plan_of(GgmlType::Q4_K, &[4096], 4096, 512, Mode::Fast, &SM90),
        MmPlan::Blas
    );
    // Float weights: one row split over two warps, up to 8 rows grouped,
    // then cuBLAS.
    let f = |n| plan_of(GgmlType::F16, &[4096], 4096, n, Mode::Fast, &SM90);
    assert_eq!(
        f(1),
        MmPlan::Matvec {
            float: true,
            warps: 2
        }
    );
    assert_eq!(
        f(8),
        MmPlan::Matvec {
            float: true,
            warps: 1
        }
    );
    assert_eq!(f(9), MmPlan::Blas);
    // Without cuBLAS, the grouped matvec takes every row count.
    let no_blas = MmCaps {
        cublas: false,
        ..SM80
    };
    assert_eq!(
        plan_of(GgmlType::F16, &[4096], 4096, 512, Mode::Fast, &no_blas),
        MmPlan::Matvec {
            float: true,
            warps: 1
        }
    );
}

#[test]
fn fast_one_row_forms() {
    // Long rows (the 8B's down: k >= 3 m): two warps a row; SmolLM2's head
    // (49,152 rows of 18 units): the short-row form; the 1B's head (64
    // units): one warp a row.
    assert_eq!(
        plan_of(GgmlType::Q4_0, &[4096], 14336, 1, Mode::Fast, &SM90),
        MmPlan::Matvec {
            float: false,
            warps: 2
        }
    );
    assert_eq!(
        plan_of(GgmlType::Q4_0, &[49152], 576, 1, Mode::Fast, &SM90),
        MmPlan::Short
    );
    assert_eq!(
        plan_of(GgmlType::Q4_0, &[128256], 2048, 1, Mode::Fast, &SM90),
        MmPlan::Matvec {
            float: false,
            warps: 1
        }
    );
    // Not its q/k/v (960 rows), nor two rows.
    assert_eq!(
        plan_of(GgmlType::Q4_0, &[960], 576, 1, Mode::Fast, &SM90),
        MmPlan::Matvec {
            float: false,
            warps: 1
        }
    );
    assert!(matches!(
        plan_of(GgmlType::Q5_0, &[49152], 576, 2, Mode::Fast, &SM90),
        MmPlan::Matvec { warps: 1, .. }
    ));
}

#[test]
fn tuning_moves_the_fast_choices() {
    let q4 = GgmlType::Q4_0;
    let s = |n| shape(q4, &[4096], 4096, n);
    let mut t = MatmulTuning::for_arch(9);
    // The parity runs' ranges: every row count on the tensor-core kernels.
    t.mma_min_rows = 0;
    t.mma_max_rows = 100_000;
    assert!(matches!(
        plan(&s(1), Mode::Fast, &SM90, &t),
        MmPlan::Mq { .. }
    ));
    assert!(
        matches!(plan(&s(512), Mode::Fast, &SM90, &t), MmPlan::Mq { kern, .. } if kern == MQ_W2)
    );
    t.mq_wn = Some(1);
    assert!(
        matches!(plan(&s(512), Mode::Fast, &SM90, &t), MmPlan::Mq { kern, .. } if kern == MQ_BASE)
    );
    t.mq = false;
    assert!(matches!(
        plan(&s(1), Mode::Fast, &SM90, &t),
        MmPlan::Tile { .. }
    ));
    // The wgmma GEMM off, forced on for a shape the rule leaves to cuBLAS,
    // a forced shape and split.
    let mut t = MatmulTuning::for_arch(9);
    t.wgmma = Switch::Off;
    assert_eq!(plan(&s(512), Mode::Fast, &SM90, &t), MmPlan::Blas);
    t.wgmma = Switch::On;
    assert!(matches!(
        plan(&s(65), Mode::Fast, &SM90, &t),
        MmPlan::Wgmma { .. }
    ));
    t.wr_shape = WrShape::M2;
    t.wr_split = Some(1);
    assert!(matches!(
        plan(&s(512), Mode::Fast, &SM90, &t),
        MmPlan::Wgmma {
            shape: 1,
            splits: 1,
            ..
        }
    ));
    // Unaligned buffers never take it.
    let mut un = s(512);
    un.aligned16 = false;
    assert_eq!(plan(&un, Mode::Fast, &SM90, &t), MmPlan::Blas);
    // The short-row form everywhere, or nowhere.
    let mut t = MatmulTuning::for_arch(9);
    t.mv_short = Switch::On;
    assert_eq!(plan(&s(1), Mode::Fast, &SM90, &t), MmPlan::Short);
    t.mv_short = Switch::Off;
    let head = shape(q4, &[49152], 576, 1);
    assert!(matches!(
        plan(&head, Mode::Fast, &SM90, &t),
        MmPlan::Matvec { .. }
    ));
}

#[test]
fn fast_uses_blas_rows() {
    let t = MatmulTuning::for_arch(9);
    assert!(!fast_uses_blas_with(8, &t));
    assert!(!fast_uses_blas_with(64, &t));
    assert!(fast_uses_blas_with(65, &t));
    assert_eq!(fast_uses_blas(512), fast_uses_blas_with(512, &t));
}

#[test]
fn split_k_grids() {
    // 8B shapes on a 132-SM H100 at two CTAs per SM: (splits, units per
    // split).
    let ts = |m, n, units, sms: usize| tile_splits(m, n, units, 2 * sms);
    assert_eq!(ts(4096, 64, 128, 132), (8, 16));
    assert_eq!(ts(1024, 64, 128, 132), (32, 4));
    assert_eq!(ts(14336, 64, 128, 132), (2, 64));
    assert_eq!(ts(4096, 64, 448, 132), (8, 56));
    assert_eq!(ts(128256, 64, 128, 132), (1, 128));
    // Every split is non-empty and they cover the units exactly.
    for units in [1, 2, 3, 17, 18, 128, 449] {
        for m in [1, 97, 4096] {
            let (s, upc) = ts(m, 17, units, 132);
            assert!(upc % 2 == 0 && s >= 1);
            assert!((s - 1) * upc < units && s * upc >= units, "{m} {units}");
        }
    }
}

#[test]
fn matvec_kernel_choice() {
    // One row: the r1 variant, or the split-row ones; more rows: grouped.
    assert_eq!(mv_name(1, 1, MV_Q8), "mv_q8_r1");
    assert_eq!(mv_name(1, 2, MV_FLOAT), "mv_float_r1_w2");
    assert_eq!(mv_name(1, 4, MV_Q8), "mv_q8_r1_w4");
    assert_eq!(mv_name(2, 1, MV_Q8), "mv_q8");
    assert_eq!(mv_name(7, 2, MV_FLOAT), "mv_float");
    // Splitting a row changes its arithmetic: never outside `fast`, and
    // never for several rows (whatever the table says).
    let mut t = MatmulTuning::for_arch(9);
    t.mv_warps = 4;
    for float_w in [false, true] {
        for long in [false, true] {
            assert_eq!(mv_warps_of(&t, Mode::Deterministic, 1, float_w, long), 1);
            assert_eq!(mv_warps_of(&t, Mode::Exact, 1, float_w, long), 1);
            assert_eq!(mv_warps_of(&t, Mode::Fast, 3, float_w, long), 1);
            assert!([1, 2, 4].contains(&mv_warps_of(&t, Mode::Fast, 1, float_w, long)));
        }
    }
    // Every name the launches use is a kernel the backend loads.
    let loaded: Vec<&str> = crate::backend::cuda::ops::kernels::KERNELS
        .iter()
        .flat_map(|(_, _, e)| e.iter().copied())
        .collect();
    let names = MV_Q8
        .iter()
        .chain(MV_FLOAT.iter())
        .chain(MV_Q8_NC.iter().skip(1))
        .chain(super::exact::MV_EXACT.iter())
        .chain(std::iter::once(&"mv_q8_r1_s4"))
        .chain(super::glu::GLU_FORMS.iter().map(|f| &f.0))
        .chain(super::mq::MQ_KERNELS.iter().map(|k| &k.name));
    for name in names {
        assert!(loaded.contains(name), "{name} is not in KERNELS");
    }
}

#[test]
fn glu_form_rule() {
    let t = MatmulTuning::for_arch(9);
    // SmolLM2 (1,536 / 32 blocks) and the 8B (14,336 / 32) on 132 SMs stay
    // unfused; the 1B (8,192 / 32) takes 16 warps: 3 CTAs per SM, one wave.
    assert_eq!(glu_form(48, false, &SM90, &t), None);
    assert_eq!(glu_form(256, false, &SM90, &t), Some(glu::GLU_FORMS[1]));
    assert_eq!(glu_form(448, false, &SM90, &t), None);
    // On norm-ahead's blocks, a grid of at most one block per SM takes 32
    // warps a block (SmolLM2); larger grids as without.
    assert_eq!(glu_form(48, true, &SM90, &t), Some(glu::GLU_FORMS[2]));
    assert_eq!(glu_form(132, true, &SM90, &t), Some(glu::GLU_FORMS[2]));
    assert_eq!(glu_form(256, true, &SM90, &t), Some(glu::GLU_FORMS[1]));
    assert_eq!(glu_form(448, true, &SM90, &t), None);
    // A fixed form, clusters only where the device has them; off; and off
    // under the forced short-row matvec (other bits than mv_q8_r1's).
    let mut f = MatmulTuning::for_arch(9);
    f.mv_glu_form = GluForm::Glu8c4;
    assert_eq!(
        glu_form(48, false, &SM90, &f),
        Some(("mv_q8_r1_glu8c4", 8, 4))
    );
    assert_eq!(glu_form(48, false, &SM80, &f), None);
    f.mv_glu_form = GluForm::Off;
    assert_eq!(glu_form(256, false, &SM90, &f), None);
    let mut s = MatmulTuning::for_arch(9);
    s.mv_short = Switch::On;
    assert_eq!(glu_form(256, false, &SM90, &s), None);
}
