//! The wgmma prefill GEMM's pure rules (kernels/matmul_wgmma_fast.cu,
//! sm_90): which ops it takes by default, its CTA shape and k splits, the
//! wave tail, its pipeline stages and shared memory.

use crate::backend::cuda::ops::kernels::WG_KERNELS;
use crate::backend::cuda::tuning::{MatmulTuning, WrShape};
use crate::backend::cuda::ty_code;
use crate::quant::GgmlType;

/// Tokens per tile of to_f16_wr's layout (WR_BN); a CTA takes one or two.
pub(crate) const WR_BN: usize = 128;

/// The weight type of each WG_KERNELS row (its kernel type code is the row
/// index: `wg_type_index`), for the shared memory of an entry by name.
pub(crate) const WG_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// The opt-in shared memory limit of an sm_90 CTA (WG_SMEM_MAX).
pub(crate) const WG_SMEM_MAX: usize = 232_448;

/// The CTA shapes of a WG_KERNELS row, in its order: (MT, tokens), 128 MT
/// weight rows (2 MT consumer warpgroups) by that many tokens.
pub(crate) const WR_SHAPES: [(usize, usize); 3] = [(1, 128), (2, 128), (1, 256)];

/// Threads per CTA (WR_THREADS) with 128 `mt` weight rows: one producer and
/// 2 `mt` consumer warpgroups.
pub(crate) const fn wr_threads(mt: usize) -> u32 {
    128 + 256 * mt as u32
}

/// Dynamic shared memory of a CTA (wr_smem_bytes): 1,024 bytes of
/// alignment slack, `sx` activation chunks of `bn` tokens x 128 bytes, `sr`
/// raw superchunks of 128 `mt` rows x 8 blocks of `bs` bytes, mbarriers.
const fn wr_smem_bytes(bs: usize, mt: usize, sr: usize, sx: usize, bn: usize) -> usize {
    1024 + sx * bn * 128 + sr * 128 * mt * 8 * bs + 256
}

/// Stage counts (raw superchunks, activation chunks), as wr_stages: the
/// first of (3, 6), (3, 5), (2, 6), (2, 5), (2, 4) that fits.
pub(crate) const fn wr_stages(bs: usize, mt: usize, bn: usize) -> (usize, usize) {
    const C: [(usize, usize); 5] = [(3, 6), (3, 5), (2, 6), (2, 5), (2, 4)];
    let mut i = 0;
    while i < C.len() {
        if wr_smem_bytes(bs, mt, C[i].0, C[i].1, bn) <= WG_SMEM_MAX {
            return C[i];
        }
        i += 1;
    }
    (2, 4)
}

/// Dynamic shared memory of the entry for block size `bs` and CTA shape
/// `WR_SHAPES[v]`.
pub(crate) const fn wr_smem_of(bs: usize, v: usize) -> usize {
    let (mt, bn) = WR_SHAPES[v];
    let (sr, sx) = wr_stages(bs, mt, bn);
    wr_smem_bytes(bs, mt, sr, sx, bn)
}

/// The dynamic shared memory of a `mm_wr_*` entry, None for other names.
pub(crate) fn wg_smem(name: &str) -> Option<usize> {
    WG_KERNELS.iter().enumerate().find_map(|(t, row)| {
        row.iter()
            .position(|n| *n == name)
            .map(|v| wr_smem_of(WG_TYPES[t].type_size(), v))
    })
}

/// The row of WG_KERNELS for a weight type: its kernel type code (TY_Q4_0
/// .. TY_Q8_0 are 0..4, the rows' order), None for types the kernel does
/// not decode (K-quants, float types).
pub(crate) fn wg_type_index(ty: GgmlType) -> Option<usize> {
    ty_code(ty)
        .and_then(|c| usize::try_from(c).ok())
        .filter(|&c| c < WG_KERNELS.len())
}

/// A shape's cost per wave in tenths of (1, 128)'s: 15 for MT = 2
/// (measured 1.49-1.58x on an H100: twice the work with four consumers,
/// 8B Q4_0 pp512 under ncu) and the table's `wr_n256_cost` for 256 tokens.
fn shape_costs(t: &MatmulTuning) -> [usize; 3] {
    [10, 15, t.wr_n256_cost]
}

/// The CTA shape (index into WR_SHAPES) and the k splits of one launch,
/// the pair with the shorter estimate (ties take the later).
///
/// Shapes: CTA-waves times a wave's time (`shape_costs`); the table's
/// `wr_shape` forces one.
///
/// Splits: with `split_ok` (the partials' reduction possible) also 2 or 4
/// where they divide k / 256, each CTA over k / splits, the partial sums
/// added in split order by split_sum_jobs. A split divides a wave's time
/// by the splits and multiplies the CTAs; its reduction costs
/// `wr_split_pen` tenths per wave of 128 x 128 output tiles at k = 4,096
/// and 2 splits, scaled by splits / 2 and 4,096 / k (the reduction's bytes
/// per output do not grow with k, the GEMM's time does). Why: the 8B's o
/// and down at 512 tokens fill one wave only with 128 x 128 CTAs, the
/// least efficient shape (ncu, H100: 63 and 152 us against cuBLAS's 29 and
/// 85 on f16 weights), while two k halves of 64 CTAs of 128 x 256 fill the
/// same wave: 32 + 12 and 95 + 12 us with split_sum_jobs, and 8B Q4_0
/// pp512 27.0k tokens/s against 24.1k unsplit. `wr_split` forces a count.
pub(crate) fn wr_plan(
    rows: &[usize],
    n: usize,
    k: usize,
    sms: usize,
    split_ok: bool,
    t: &MatmulTuning,
) -> (usize, usize) {
    let cost = shape_costs(t);
    let sms = sms.max(1);
    let out_tiles: usize = rows.iter().map(|r| r.div_ceil(128)).sum::<usize>() * n.div_ceil(128);
    let splits: &[usize] = match (split_ok, t.wr_split) {
        (false, _) => &[1],
        (true, Some(1)) => &[1],
        (true, Some(2)) => &[2],
        (true, Some(4)) => &[4],
        (true, _) => &[1, 2, 4],
    };
    let splits: Vec<usize> = splits
        .iter()
        .copied()
        .filter(|&sp| sp == 1 || (k / 256).is_multiple_of(sp) && k >= 256 * sp)
        .collect();
    let splits = if splits.is_empty() { vec![1] } else { splits };
    // Times 1,000 / splits: integers, ties decided as before.
    let time = |v: usize, sp: usize| -> usize {
        let (mt, bn) = WR_SHAPES[v];
        let tiles: usize = rows.iter().map(|r| r.div_ceil(128 * mt)).sum();
        let gemm = (tiles * n.div_ceil(bn) * sp).div_ceil(sms) * cost[v] * 1000 / sp;
        // The reduction reads sp partials: calibrated at 2.
        let reduce = if sp > 1 {
            t.wr_split_pen * 50 * sp * out_tiles * 4096 / (sms * k.max(1))
        } else {
            0
        };
        gemm + reduce
    };
    let shapes: Vec<usize> = match t.wr_shape {
        WrShape::Auto => (0..WR_SHAPES.len()).collect(),
        WrShape::M1 => vec![0],
        WrShape::M2 => vec![1],
        WrShape::N256 => vec![2],
    };
    let mut best = (shapes[0], splits[0]);
    for &sp in &splits {
        for &v in &shapes {
            if time(v, sp) <= time(best.0, best.1) {
                best = (v, sp);
            }
        }
    }
    best
}

/// The wave tail of an unsplit launch of `ctas_y` CTA rows by `tiles_x`
/// token tiles of shape `WR_SHAPES[v]`: Some((from, sp)) to run CTA rows
/// `from..` (the tiles past the last whole wave, in whole CTA rows) in
/// `sp` k ranges each, their partials added by wr_tail_sum, where that
/// estimate is shorter than the whole launch's waves.
///
/// Why: the 8B's gate/up at 512 tokens is 448 CTAs of 128 x 256 on an
/// H100's 132 SMs, 3.4 waves, the last 40% full (ncu: 217.5 us against
/// cuBLAS's 168 on f16 weights). Split in two k halves, the last 52 tiles
/// become 104 CTAs of half the time: 3.5 wave times plus their reduction
/// instead of 4. Estimate, in wr_plan's units: whole waves times the
/// shape's cost, plus the cost divided by sp, plus the reduction as
/// wr_plan counts it for the tail's output tiles; the tail's sp x tiles
/// must fit one wave. The table's `wr_tail` turns it off; `wr_tail_sms`
/// plans for that many SMs and takes any possible tail (the parity runs,
/// whose shapes fill no wave of a real GPU).
pub(crate) fn wr_tail(
    ctas_y: usize,
    tiles_x: usize,
    k: usize,
    v: usize,
    sms: usize,
    t: &MatmulTuning,
) -> Option<(usize, usize)> {
    if !t.wr_tail {
        return None;
    }
    let forced = t.wr_tail_sms.filter(|&s| s > 0);
    let sms = forced.unwrap_or(sms).max(1);
    let tiles = ctas_y * tiles_x;
    let full = tiles / sms;
    if full == 0 || tiles.is_multiple_of(sms) || tiles_x == 0 {
        return None;
    }
    let from = full * sms / tiles_x;
    let tail_tiles = (ctas_y - from) * tiles_x;
    let (mt, bn) = WR_SHAPES[v];
    let cost = shape_costs(t)[v];
    let out_tiles = tail_tiles * mt * bn.div_ceil(128);
    let whole = tiles.div_ceil(sms) * cost * 1000;
    let mut best: Option<(usize, usize)> = None;
    for sp in [2usize, 4] {
        if !(k / 256).is_multiple_of(sp) || k < 256 * sp || tail_tiles * sp > sms {
            continue;
        }
        let reduce = t.wr_split_pen * 50 * sp * out_tiles * 4096 / (sms * k.max(1));
        let tt = full * cost * 1000 + cost * 1000 / sp + reduce;
        if (forced.is_some() || tt < whole) && best.is_none_or(|(_, bt)| tt < bt) {
            best = Some((sp, tt));
        }
    }
    best.map(|(sp, _)| (from, sp))
}

/// Whether the wgmma GEMM takes an op by default (the table's `wgmma`
/// Auto): where it measured faster than the cuBLAS path on an H100: every
/// type it decodes (Q5_0 / Q5_1 8B pp512 27.9k / 24.9k against 20.8k /
/// 20.7k; Q8_0 22.0k against 20.1k), k of at least `wg_min_k` (2,048: the
/// 1B, the smallest measured) and at least `wg_min_fill` percent of a wave
/// of 128-row CTAs (90: taking also the 1B's o and down at 512 tokens, 64
/// CTAs on 132 SMs, ran its Q4_0 prefill at 0.97x the cuBLAS path; leaving
/// them out, 1.06x).
pub(crate) fn wg_default_takes(
    ty: GgmlType,
    k: usize,
    rows: &[usize],
    n: usize,
    sms: usize,
    t: &MatmulTuning,
) -> bool {
    let ctas: usize = rows.iter().map(|r| r.div_ceil(128)).sum::<usize>() * n.div_ceil(WR_BN);
    wg_type_index(ty).is_some() && k >= t.wg_min_k && 100 * ctas >= t.wg_min_fill * sms.max(1)
}

#[cfg(test)]
mod tests {
    use super::super::jobs::wr_map_geometry;
    use super::{
        wg_default_takes, wg_smem, wg_type_index, wr_plan, wr_smem_of, wr_stages, wr_tail,
        WG_SMEM_MAX, WG_TYPES, WR_SHAPES,
    };
    use crate::backend::cuda::tuning::MatmulTuning;
    use crate::quant::GgmlType;

    #[test]
    fn kernel_rows_follow_the_type_codes() {
        assert_eq!(wg_type_index(GgmlType::Q4_0), Some(0));
        assert_eq!(wg_type_index(GgmlType::Q5_1), Some(3));
        assert_eq!(wg_type_index(GgmlType::Q8_0), Some(4));
        assert_eq!(wg_type_index(GgmlType::Q4_K), None);
        assert_eq!(wg_type_index(GgmlType::F16), None);
    }

    #[test]
    fn weight_tensor_maps_fit_the_drivers_limits() {
        // Every type and CTA shape at the 8B's and 1B's k: the box is one
        // raw superchunk row (8 blocks) of 16-byte multiples, its sides at
        // most 256, the row stride a 16-byte multiple, and the box bytes
        // those of the kernel's raw stage (the mbarrier's expected bytes).
        for ty in WG_TYPES {
            let bs = ty.type_size();
            for (v, &(mt, _)) in WR_SHAPES.iter().enumerate() {
                for k in [2048, 4096, 14336] {
                    let (dims, stride, boxd) = wr_map_geometry(1000, k, bs, mt);
                    assert_eq!(stride, (k / 32 * bs) as u64, "{ty:?} k {k}");
                    assert_eq!(stride % 16, 0, "{ty:?} k {k}");
                    assert_eq!(dims, [stride / 8, 1000]);
                    assert_eq!(boxd[0] as usize * 8, 8 * bs, "{ty:?}");
                    assert_eq!((boxd[0] * 8) % 16, 0, "{ty:?}");
                    assert!(boxd[0] <= 256 && boxd[1] <= 256, "{ty:?} shape {v}");
                    assert_eq!(boxd[1] as usize, 128 * mt);
                    // k / 256 superchunks of boxd[0] u64 per row.
                    assert_eq!(dims[0], (k / 256) as u64 * boxd[0] as u64);
                }
            }
        }
    }

    #[test]
    fn shared_memory_fits_an_h100_cta() {
        // 227 KiB is the opt-in limit per CTA on sm_90.
        for (t, ty) in WG_TYPES.iter().enumerate() {
            assert_eq!(wg_type_index(*ty), Some(t));
            for v in 0..3 {
                let bytes = wr_smem_of(ty.type_size(), v);
                assert!(bytes <= WG_SMEM_MAX && WG_SMEM_MAX <= 227 * 1024);
            }
        }
        // 128 rows x 128 tokens: three raw superchunks and six activation
        // chunks for every type; 256 rows: the same for Q4_0 (3 x 36 KiB),
        // two raw stages and five chunks for Q8_0 (2 x 68 KiB); 256 tokens
        // (32 KiB chunks): (3, 5) for Q4_0, (2, 5) for Q5_0, (2, 4) for Q8_0.
        assert_eq!(wr_stages(18, 1, 128), (3, 6));
        assert_eq!(wr_stages(34, 1, 128), (3, 6));
        assert_eq!(wr_stages(18, 2, 128), (3, 6));
        assert_eq!(wr_stages(20, 2, 128), (3, 6));
        assert_eq!(wr_stages(34, 2, 128), (2, 5));
        assert_eq!(wr_stages(18, 1, 256), (3, 5));
        assert_eq!(wr_stages(22, 1, 256), (2, 5));
        assert_eq!(wr_stages(34, 1, 256), (2, 4));
        assert_eq!(wg_smem("mm_wr_q8_0_m2"), Some(wr_smem_of(34, 1)));
        assert_eq!(wg_smem("mm_wr_q4_0_m1"), Some(wr_smem_of(18, 0)));
        assert_eq!(wg_smem("mm_wr_q4_1_n256"), Some(wr_smem_of(20, 2)));
        assert_eq!(wg_smem("mm_q8_mma"), None);
    }

    #[test]
    fn cta_shape_and_splits_by_waves() {
        let t = MatmulTuning::for_arch(9);
        // 8B gate and up at 512 tokens: 224 x 4 = 896 CTAs of 128 x 128 (7
        // waves on 132 SMs: 70) vs 112 x 4 = 448 of 256 rows (4 waves: 60)
        // vs 224 x 2 = 448 of 256 tokens (4 waves: 56); two splits: 49 plus
        // the reduction of 896 output tiles (17).
        assert_eq!(wr_plan(&[14336, 14336], 512, 4096, 132, true, &t), (2, 1));
        // 8B down at 512 tokens: 32 x 4 = 128 CTAs of 128 x 128 fit one
        // wave (10); two k halves of 64 CTAs of 128 x 256 too (7 + 0.7).
        assert_eq!(wr_plan(&[4096], 512, 14336, 132, true, &t), (2, 2));
        assert_eq!(wr_plan(&[4096], 512, 14336, 132, false, &t), (0, 1));
        // 8B o: the same at k = 4,096 (7 + 2.4).
        assert_eq!(wr_plan(&[4096], 512, 4096, 132, true, &t), (2, 2));
        // 8B q/k/v: 48 x 4 = 192 CTAs (2 waves: 20) vs 96 (1 wave: 15 or
        // 14); two splits: 2 waves of 7 plus 3.6.
        assert_eq!(
            wr_plan(&[4096, 1024, 1024], 512, 4096, 132, true, &t),
            (2, 1)
        );
        // 1B gate and up at 512 tokens: 512 CTAs (4 waves: 40) vs 256 (2
        // waves: 30 or 28).
        assert_eq!(wr_plan(&[8192, 8192], 512, 2048, 132, true, &t), (2, 1));
        // 1B q/k/v: 96 CTAs of 128 x 128 (10) vs two k halves of 48 x 2 of
        // 128 x 256 (7 + 3.6).
        assert_eq!(wr_plan(&[2048, 512, 512], 512, 2048, 132, true, &t), (0, 1));
        // Splits must divide k / 256: k = 768 takes none.
        assert_eq!(wr_plan(&[4096], 512, 768, 132, true, &t).1, 1);
    }

    #[test]
    fn wave_tail_split_where_the_last_wave_is_thin() {
        let t = MatmulTuning::for_arch(9);
        // 8B gate/up at 512 tokens, 128 x 256 CTAs (shape 2): 224 CTA rows x
        // 2 token tiles = 448 on 132 SMs: 3 waves (198 rows), the last 26
        // rows (52 tiles) in two k halves: 104 CTAs. 3 x 14 + 7 + 2.0
        // against 4 x 14; four ranges would be 208 CTAs, past one wave.
        assert_eq!(wr_tail(224, 2, 4096, 2, 132, &t), Some((198, 2)));
        // Less than a wave, or whole waves: no tail.
        assert_eq!(wr_tail(48, 2, 4096, 2, 132, &t), None);
        assert_eq!(wr_tail(66, 2, 4096, 2, 132, &t), None);
        // 1B gate/up at 512 tokens: 128 rows x 2 = 256 CTAs, a tail of 124
        // tiles: two ranges would be 248 CTAs.
        assert_eq!(wr_tail(128, 2, 2048, 2, 132, &t), None);
        // A thin tail at k = 4,096 in four ranges: 140 tiles of 128 x 128
        // on 132 SMs leave 8 (rows 132..), 32 CTAs of a quarter's time.
        assert_eq!(wr_tail(140, 1, 4096, 0, 132, &t), Some((132, 4)));
        // k / 256 must divide: k = 768 (three superchunks) takes none.
        assert_eq!(wr_tail(140, 1, 768, 0, 132, &t), None);
    }

    #[test]
    fn parity_shapes_plan_their_jobs_alike_together_and_alone() {
        let t = MatmulTuning::for_arch(9);
        // The opcheck's fused-vs-unfused bit check of MatMuls relies on it
        // (docs/DETERMINISM.md); 114 / 132 / 144 SMs: an H100 PCIe, SXM
        // and a larger part.
        for &(ms, k, n, _) in crate::opcheck::mat_muls::WIDE_SHAPES {
            if k % 256 != 0 {
                continue;
            }
            for sms in [114, 132, 144] {
                let joint = wr_plan(ms, n, k, sms, true, &t).1;
                for &m in ms {
                    assert_eq!(
                        wr_plan(&[m], n, k, sms, true, &t).1,
                        joint,
                        "rows {ms:?} k {k} n {n} on {sms} SMs: job {m} alone"
                    );
                }
                // No wave tail either (it depends on the launch's CTAs).
                for (v, &(mt, bn)) in WR_SHAPES.iter().enumerate() {
                    let rows = |ms: &[usize]| ms.iter().map(|m| m.div_ceil(128 * mt)).sum();
                    assert_eq!(wr_tail(rows(ms), n.div_ceil(bn), k, v, sms, &t), None);
                    for &m in ms {
                        assert_eq!(wr_tail(rows(&[m]), n.div_ceil(bn), k, v, sms, &t), None);
                    }
                }
            }
        }
        // Where they do not (why the doc names the exception): the 8B's
        // q/k/v at 512 tokens run unsplit together, q alone in two splits.
        assert_eq!(wr_plan(&[4096, 1024, 1024], 512, 4096, 132, true, &t).1, 1);
        assert_eq!(wr_plan(&[4096], 512, 4096, 132, true, &t).1, 2);
    }

    #[test]
    fn default_takes_the_measured_winners() {
        let t = MatmulTuning::for_arch(9);
        let q4 = GgmlType::Q4_0;
        // 8B at 512 tokens: q/k/v 48 x 4 CTAs, o and down 32 x 4 = 128
        // (0.97 of 132 SMs).
        assert!(wg_default_takes(
            q4,
            4096,
            &[4096, 1024, 1024],
            512,
            132,
            &t
        ));
        assert!(wg_default_takes(q4, 4096, &[4096], 512, 132, &t));
        assert!(wg_default_takes(
            GgmlType::Q4_1,
            14336,
            &[4096],
            512,
            132,
            &t
        ));
        // Q8_0 too (8B gate/up), and Q5_0 / Q5_1 since 2026-11-26.
        assert!(wg_default_takes(
            GgmlType::Q8_0,
            4096,
            &[14336, 14336],
            512,
            132,
            &t
        ));
        assert!(!wg_default_takes(
            GgmlType::Q8_0,
            2048,
            &[2048],
            512,
            132,
            &t
        ));
        assert!(wg_default_takes(
            GgmlType::Q5_0,
            4096,
            &[4096],
            512,
            132,
            &t
        ));
        assert!(wg_default_takes(
            GgmlType::Q5_1,
            4096,
            &[4096],
            512,
            132,
            &t
        ));
        assert!(!wg_default_takes(
            GgmlType::Q5_1,
            2048,
            &[2048],
            512,
            132,
            &t
        ));
        // Types the kernel does not decode: never.
        assert!(!wg_default_takes(
            GgmlType::Q4_K,
            4096,
            &[4096],
            512,
            132,
            &t
        ));
        assert!(!wg_default_takes(
            GgmlType::F16,
            4096,
            &[4096],
            512,
            132,
            &t
        ));
        // 1B at 512 tokens: gate/up (128 x 4 CTAs) yes, o and down (16 x
        // 4 = 64) no; at 2,048 tokens down too (256).
        assert!(wg_default_takes(q4, 2048, &[8192, 8192], 512, 132, &t));
        assert!(!wg_default_takes(q4, 2048, &[2048], 512, 132, &t));
        assert!(!wg_default_takes(q4, 8192, &[2048], 512, 132, &t));
        assert!(wg_default_takes(q4, 8192, &[2048], 2048, 132, &t));
        // Shorter rows than any measured: the cuBLAS path.
        assert!(!wg_default_takes(q4, 1024, &[8192], 2048, 132, &t));
    }
}
