//! The int8 tensor-core decode kernels' instantiations (mq_kernel in
//! kernels/matmul_mma_fast.cu) and their pure rules: which one a row count
//! takes, its shared memory, its split-K.

use super::split_k;
use crate::backend::cuda::tuning::MatmulTuning;
use crate::quant::GgmlType;

/// One instantiation of mq_kernel (matmul_mma_fast.cu): its name, warps
/// along the activation rows (4 wn warps), activation rows per CTA and
/// chunk buffers in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MqKernel {
    pub name: &'static str,
    pub wn: usize,
    pub tok: usize,
    pub stages: usize,
    /// CTAs per SM its launch bounds promise registers for (its shared
    /// memory must allow as many).
    pub ctas: usize,
    /// Groups of 4 wn warps that split each chunk's blocks (KS).
    pub ks: usize,
}

/// 4 warps of 32 weight rows x 64 activation rows, up to 255 registers.
pub(crate) const MQ_BASE: MqKernel = MqKernel {
    name: "mm_q8_mma",
    wn: 1,
    tok: 64,
    stages: 2,
    ctas: 2,
    ks: 1,
};
/// 8 warps of 32 x 32, 128 registers: twice the warps in flight.
pub(crate) const MQ_W2: MqKernel = MqKernel {
    name: "mm_q8_mma_w2",
    wn: 2,
    tok: 64,
    stages: 2,
    ctas: 2,
    ks: 1,
};
/// Up to 16 rows: 16-row tiles and four chunk buffers (three chunks of
/// weights in flight while one is computed; TOK 64 keeps one), 8 warps in
/// two k groups, two CTAs per SM (128 registers): the 4-bit types.
pub(crate) const MQ_T16_K2B: MqKernel = MqKernel {
    name: "mm_q8_mma_t16_k2b",
    wn: 1,
    tok: 16,
    stages: 4,
    ctas: 2,
    ks: 2,
};
/// The same at one CTA per SM, for Q8_0 (whose four buffers take 161 KiB).
pub(crate) const MQ_T16_K2: MqKernel = MqKernel {
    name: "mm_q8_mma_t16_k2",
    ctas: 1,
    ..MQ_T16_K2B
};
/// Up to 8 rows: 8-row tiles and three chunk buffers, so that even Q8_0's
/// fit twice per SM; two k groups.
pub(crate) const MQ_T8_K2B: MqKernel = MqKernel {
    name: "mm_q8_mma_t8_k2b",
    tok: 8,
    stages: 3,
    ..MQ_T16_K2B
};
/// Up to 16 rows in one k group (`deterministic`: every kernel of one k
/// group gives a row the same bits, see `mq_det_kernel`), three chunk
/// buffers, two CTAs per SM.
pub(crate) const MQ_T16: MqKernel = MqKernel {
    name: "mm_q8_mma_t16",
    wn: 1,
    tok: 16,
    stages: 3,
    ctas: 2,
    ks: 1,
};
/// Up to 8 rows in one k group (`deterministic`, down to one row).
pub(crate) const MQ_T8: MqKernel = MqKernel {
    name: "mm_q8_mma_t8",
    tok: 8,
    ..MQ_T16
};
/// Every instantiation (the kernel table, ops/kernels.rs, loads these names).
pub(crate) const MQ_KERNELS: [MqKernel; 7] = [
    MQ_BASE, MQ_W2, MQ_T16_K2B, MQ_T16_K2, MQ_T8_K2B, MQ_T16, MQ_T8,
];

/// Weight rows of one mq CTA (MQ_ROWS), its k chunk in 32-blocks (MQ_KB)
/// and the activation row stride in shared memory (MQ_XLD), as in the
/// kernel.
pub(crate) const MQ_ROWS: usize = 128;
pub(crate) const MQ_KB: usize = 8;
const MQ_XLD: usize = 32 * MQ_KB + 16;

/// The mq kernel for `n` activation rows of `ty` weights: the first of the
/// small-batch kernels (in order of preference) whose tile holds `n` rows
/// and whose shared memory for `ty` allows its CTAs per SM (so the 4-bit
/// types take t16_k2b up to 16 rows, Q8_0 t8_k2b up to 8 and t16_k2 up to
/// 16), else by `mq_wn`. Measured on an H100 (8B, tokens/s at B2 / B4 / B8
/// / B16): Q4_0 t16 556 / 1,090 / 2,063 / 3,604, t16_k2b 589 / 1,142 /
/// 2,107 / 3,703 (mm_q8_mma 1,974 at B8); Q8_0 mm_q8_mma 379 / 742 / 1,406
/// / 2,481, t16_k2 412 / 810 / 1,547 / 2,882, t8_k2b 424 / 830 / 1,578.
pub(crate) fn mq_kernel(ty: GgmlType, n: usize, t: &MatmulTuning) -> MqKernel {
    const MQ_SMALL: [MqKernel; 3] = [MQ_T16_K2B, MQ_T8_K2B, MQ_T16_K2];
    let fits = |k: &&MqKernel| n <= k.tok && mq_smem(ty, **k).is_some_and(|b| ctas_fit(b, k.ctas));
    if let Some(&k) = MQ_SMALL.iter().find(fits) {
        k
    } else if mq_wn(n, t) == 2 {
        MQ_W2
    } else {
        MQ_BASE
    }
}

/// `deterministic`'s mq kernel for `n` activation rows of `ty` weights:
/// one k group (KS 1), so that each output adds its blocks' terms in k
/// order in one chain, whatever the kernel's tile of activation rows or
/// warps along them: every choice here gives a row the same bits, so
/// the choice may follow `n` (t8 up to 8 rows, t16 up to 16, then 64-row
/// tiles, two warps along them past 16), where its shared memory allows
/// the kernel's CTAs per SM. The tuning table is not read.
pub(crate) fn mq_det_kernel(ty: GgmlType, n: usize) -> MqKernel {
    let fits = |k: &&MqKernel| n <= k.tok && mq_smem(ty, **k).is_some_and(|b| ctas_fit(b, k.ctas));
    if let Some(&k) = [MQ_T8, MQ_T16].iter().find(fits) {
        k
    } else if n > 16 {
        MQ_W2
    } else {
        MQ_BASE
    }
}

/// `deterministic`'s split-K for mq jobs of `m` weight rows in all (the
/// job table's row tiles) and `blocks` 32-blocks of k: `mq_splits` as if
/// one tile of activation rows, aiming at two CTAs per SM, so that it
/// depends on the weights' shape and the device alone, never on the row
/// count (each output's partial sums, and their order, are the same for
/// any batch).
pub(crate) fn mq_det_splits(m: usize, blocks: usize, sms: usize) -> (usize, usize) {
    mq_splits(m, 1, 1, blocks, sms, 2)
}

/// Whether the mq kernels can take `ty` weights with rows of `k` values
/// at all (`mq_takes` without the table's switch).
pub(crate) fn mq_fits(ty: GgmlType, k: usize) -> bool {
    mq_smem(ty, MQ_BASE).is_some() && k > 0 && k.is_multiple_of(32 * MQ_KB)
}

/// Warps of mm_q8_mma along the activation rows for `n` of them: 1
/// (mm_q8_mma) or 2 (mm_q8_mma_w2), `mq_wn` of the table or 2 from more
/// than 16 rows.
fn mq_wn(n: usize, t: &MatmulTuning) -> usize {
    match t.mq_wn {
        Some(w @ (1 | 2)) => w,
        _ if n > 16 => 2,
        _ => 1,
    }
}

/// Whether `ctas` CTAs of `smem` bytes fit one SM (228 KiB on sm_80 /
/// sm_90, 1 KiB of it reserved per CTA), as a kernel's launch bounds
/// assume; one CTA may take at most 227 KiB.
pub(crate) fn ctas_fit(smem: usize, ctas: usize) -> bool {
    smem <= 227 * 1024 && ctas * (smem + 1024) <= 228 * 1024
}

/// The shared row stride of a chunk's raw weights (8 blocks) in the int8
/// MMA kernels (mq_wld in kernels/dequant.cuh: Q4_1 padded), or None for a
/// type they do not take.
pub(crate) fn mq_wld(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 => Some(8 * 18),
        GgmlType::Q4_1 => Some(176),
        GgmlType::Q8_0 => Some(8 * 34),
        _ => None,
    }
}

/// Shared memory of one CTA of kernel `kern` for weights of type `ty`
/// (mq_wld and mq_stage_bytes in the kernel), or None for a type it does
/// not take.
pub(crate) fn mq_smem(ty: GgmlType, kern: MqKernel) -> Option<usize> {
    let wld = mq_wld(ty)?;
    // The stages, then one mbarrier per stage (the bulk tensor copies).
    Some(kern.stages * (MQ_ROWS * wld + kern.tok * MQ_XLD + MQ_KB * kern.tok * 8 + 8))
}

/// The most shared memory a launch of the kernel called `name` asks for
/// (set on the function once, at load): over the types it runs.
pub(crate) fn mq_smem_max(name: &str) -> usize {
    let Some(&kern) = MQ_KERNELS.iter().find(|k| k.name == name) else {
        return 0;
    };
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]
        .into_iter()
        .filter_map(|ty| mq_smem(ty, kern))
        .filter(|&b| ctas_fit(b, kern.ctas))
        .max()
        .unwrap_or(0)
}

/// Whether mm_q8_mma can take `ty` weights with rows of `k` values (and
/// the table has it on): Q4_0, Q4_1 and Q8_0 with k a multiple of 256
/// (whole chunks; row bytes then multiples of 16 for the 16-byte copies).
pub(crate) fn mq_takes(ty: GgmlType, k: usize, t: &MatmulTuning) -> bool {
    t.mq && mq_fits(ty, k)
}

/// Split-K for an mq kernel with `tok` activation rows per CTA: (splits,
/// blocks per split), `split_k` over its MQ_ROWS x tok tiles (`m` rows in
/// all: the job table's row tiles) and MQ_KB-block chunks, aiming at
/// `ctas_per_sm * sms` CTAs.
pub(crate) fn mq_splits(
    m: usize,
    n: usize,
    tok: usize,
    blocks: usize,
    sms: usize,
    ctas_per_sm: usize,
) -> (usize, usize) {
    let tiles = m.div_ceil(MQ_ROWS) * n.div_ceil(tok);
    split_k(tiles, blocks, MQ_KB, ctas_per_sm * sms)
}

#[cfg(test)]
mod tests {
    use super::{
        ctas_fit, mq_kernel, mq_smem, mq_smem_max, mq_splits, MQ_BASE, MQ_KB, MQ_KERNELS,
        MQ_T16_K2, MQ_T16_K2B, MQ_T8_K2B, MQ_W2,
    };
    use crate::backend::cuda::tuning::MatmulTuning;
    use crate::quant::GgmlType;

    #[test]
    fn mq_split_k_grids() {
        // 8B shapes, 64 rows on a 132-SM H100 at two CTAs per SM: (splits,
        // blocks per split).
        assert_eq!(mq_splits(4096, 64, 64, 128, 132, 2), (8, 16));
        assert_eq!(mq_splits(14336, 64, 64, 128, 132, 2), (2, 64));
        assert_eq!(mq_splits(4096, 64, 64, 448, 132, 2), (8, 56));
        assert_eq!(mq_splits(4096, 512, 64, 128, 132, 2), (1, 128));
        assert_eq!(mq_splits(128256, 64, 64, 128, 132, 2), (1, 128));
        // 16 rows on the t16 kernel: one column of tiles, as TOK 64's.
        assert_eq!(mq_splits(4096, 16, 16, 128, 132, 2), (8, 16));
        // Whole chunks, none empty, covering every block exactly once.
        for blocks in [8, 16, 24, 128, 448] {
            for m in [1, 97, 4096, 14336] {
                for n in [1, 9, 64, 513] {
                    let (s, per) = mq_splits(m, n, 64, blocks, 132, 2);
                    assert!(per % MQ_KB == 0 && s >= 1);
                    assert!(
                        (s - 1) * per < blocks && s * per >= blocks,
                        "{m} {n} {blocks}"
                    );
                }
            }
        }
    }

    #[test]
    fn mq_shared_memory_fits_two_ctas() {
        // The CTAs per SM of each kernel's launch bounds on 228 KiB SMs (1
        // KiB reserved per CTA), for every kernel and the types it runs.
        for k in MQ_KERNELS {
            assert!(ctas_fit(mq_smem_max(k.name), k.ctas), "{}", k.name);
        }
        assert_eq!(
            mq_smem(GgmlType::Q8_0, MQ_W2),
            Some(mq_smem_max("mm_q8_mma_w2"))
        );
        assert_eq!(mq_smem(GgmlType::Q4_K, MQ_BASE), None);
        assert_eq!(mq_smem_max("mm_f16_tile"), 0);
        // t16_k2b: four buffers of Q4_0 (95 KiB, and a barrier each) and
        // Q4_1 fit twice, Q8_0's only once (t16_k2); three Q8_0 buffers of
        // 8 rows fit twice.
        assert_eq!(
            mq_smem(GgmlType::Q4_0, MQ_T16_K2B),
            Some(4 * (128 * 144 + 16 * 272 + 1024 + 8))
        );
        assert!(!ctas_fit(mq_smem(GgmlType::Q8_0, MQ_T16_K2B).unwrap(), 2));
        assert_eq!(
            mq_smem(GgmlType::Q4_1, MQ_T16_K2B),
            Some(mq_smem_max("mm_q8_mma_t16_k2b"))
        );
        assert_eq!(
            mq_smem(GgmlType::Q8_0, MQ_T16_K2),
            Some(mq_smem_max("mm_q8_mma_t16_k2"))
        );
        assert!(ctas_fit(mq_smem(GgmlType::Q8_0, MQ_T8_K2B).unwrap(), 2));
    }

    #[test]
    fn mq_det_kernels_are_one_k_group() {
        use super::{mq_det_kernel, mq_det_splits, MQ_T16, MQ_T8};
        // Every row count and type: a kernel of one k group whose shared
        // memory allows its CTAs; the split depends on the weights alone.
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for n in [1, 2, 7, 8, 9, 16, 17, 33, 64, 65, 512, 2048] {
                let k = mq_det_kernel(ty, n);
                assert_eq!(k.ks, 1, "{ty:?} {n}");
                assert!(ctas_fit(mq_smem(ty, k).unwrap(), k.ctas), "{ty:?} {n}");
            }
        }
        assert_eq!(mq_det_kernel(GgmlType::Q4_0, 1), MQ_T8);
        assert_eq!(mq_det_kernel(GgmlType::Q8_0, 8), MQ_T8);
        assert_eq!(mq_det_kernel(GgmlType::Q4_0, 12), MQ_T16);
        // Q8_0's three 16-row buffers do not fit twice.
        assert_eq!(mq_det_kernel(GgmlType::Q8_0, 12), MQ_BASE);
        assert_eq!(mq_det_kernel(GgmlType::Q4_1, 17), MQ_W2);
        // 8B shapes on 132 SMs: q / o (4096 x 128 blocks), the fused
        // gate / up (2 x 14336), down (4096 x 448 blocks), the head.
        assert_eq!(mq_det_splits(4096, 128, 132), (8, 16));
        assert_eq!(mq_det_splits(2 * 14336, 128, 132), (1, 128));
        assert_eq!(mq_det_splits(4096, 448, 132), (8, 56));
        assert_eq!(mq_det_splits(128256, 128, 132), (1, 128));
    }

    #[test]
    fn mq_kernel_choice() {
        // No type is named in the rule: shared memory alone sends Q8_0
        // elsewhere.
        let t = MatmulTuning::for_arch(9);
        assert_eq!(mq_kernel(GgmlType::Q4_0, 8, &t), MQ_T16_K2B);
        assert_eq!(mq_kernel(GgmlType::Q4_1, 16, &t), MQ_T16_K2B);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 8, &t), MQ_T8_K2B);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 9, &t), MQ_T16_K2);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 16, &t), MQ_T16_K2);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 17, &t), MQ_W2);
        assert_eq!(mq_kernel(GgmlType::Q4_0, 17, &t), MQ_W2);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 64, &t), MQ_W2);
        // The kernel's per-warp tiles: TOK / 8 / WN of 8 rows, at least
        // one; its k groups split a chunk's 8 blocks into even halves.
        for k in MQ_KERNELS {
            assert!(
                k.tok / 8 / k.wn >= 1 && (8 / k.ks).is_multiple_of(2),
                "{}",
                k.name
            );
        }
    }
}
