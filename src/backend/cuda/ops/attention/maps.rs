//! Tensor maps of one layer's paged KV cache, by which the split-attention
//! kernels (attention_pipe_fast.cu, att_pipe_*) copy a tile's K and V rows with
//! the copy engine (one bulk tensor copy per tile and half row) instead of
//! each lane's 16-byte `cp.async` (sm_90+).

use crate::backend::cuda::device::memory::DevKv;
use anyhow::Result;
use cudarc::driver::sys;

/// The kernels' AttMaps (attention_pipe_fast.cu): the K map, then the V map.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AttMaps([sys::CUtensorMap; 2]);
// SAFETY: plain data (opaque 64-byte-aligned tensor maps that hold device
// addresses, none into host memory), laid out as the kernels' struct
// AttMaps (two maps of 128 bytes).
unsafe impl cudarc::driver::DeviceRepr for AttMaps {}

impl AttMaps {
    /// All zeros: for launches that copy by `cp.async` (the kernel's `tma`
    /// argument 0; it never reads the maps).
    pub(crate) fn none() -> Self {
        AttMaps([sys::CUtensorMap { opaque: [0; 16] }; 2])
    }

    /// The bytes of the struct, for a raw (clustered) launch.
    pub(crate) fn to_bytes(self) -> Vec<u8> {
        self.0
            .iter()
            .flat_map(|m| m.opaque.iter().flat_map(|w| w.to_ne_bytes()))
            .collect()
    }
}

/// The cells (block_size-cell pages x pages) of one layer's cache.
pub(super) fn kv_cells(cache: &DevKv<'_>) -> usize {
    cache.k.len() / (cache.n_kv_heads * cache.head_dim).max(1)
}

/// The maps' L2 promotion: 256 bytes (a K or V row of the 8B's heads is
/// 256 contiguous bytes).
const ATT_L2_PROMOTION: sys::CUtensorMapL2promotion =
    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B;

/// One map's geometry over `cells` cells of `nkv` heads of `hd` u16: dims
/// (head_dim, kv heads, cells), strides in bytes of a head and a cell, the
/// box (`box_x` u16 of one head, `kt` cells). The driver's limits: strides
/// multiples of 16, box sides at most 256, a swizzled box's row at most
/// the swizzle span (128 bytes).
fn att_map_geometry(
    cells: usize,
    nkv: usize,
    hd: usize,
    box_x: usize,
    kt: usize,
) -> ([u64; 3], [u64; 2], [u32; 3]) {
    (
        [hd as u64, nkv as u64, cells as u64],
        [(hd * 2) as u64, (nkv * hd * 2) as u64],
        [box_x as u32, 1, kt as u32],
    )
}

/// The K and V maps of `cache` for tiles of `kt` keys: K in boxes of 64
/// u16 (half a 128-wide row) with the 128-byte swizzle, V in whole rows
/// unswizzled (attention_pipe_fast.cu, att_k_at and the V stages).
pub(crate) fn att_maps(
    cache: &DevKv<'_>,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    kt: usize,
) -> Result<AttMaps> {
    use cudarc::driver::DevicePtr;
    let (bs, nkv, hd) = (cache.block_size, cache.n_kv_heads, cache.head_dim);
    let cells = kv_cells(cache);
    let (k_addr, v_addr) = (cache.k.device_ptr(s).0, cache.v.device_ptr(s).0);
    let mut maps = AttMaps::none();
    let sides = [
        (
            k_addr,
            64,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        ),
        (
            v_addr,
            hd,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        ),
    ];
    for (i, (addr, box_x, swizzle)) in sides.into_iter().enumerate() {
        let (dims, strides, boxd) = att_map_geometry(cells, nkv, hd, box_x, kt);
        crate::backend::cuda::device::launch::encode_tiled_map(
            &mut maps.0[i],
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            addr,
            (&dims, &strides, &boxd),
            swizzle,
            ATT_L2_PROMOTION,
            &|| {
                let side = if i == 0 { "K" } else { "V" };
                format!(
                    "paged_attention: the {side} cache's tensor map ({cells} cells of {nkv} x \
                     {hd}, {bs}-cell pages, {kt}-key tiles)"
                )
            },
        )?;
    }
    Ok(maps)
}

#[cfg(test)]
mod tests {
    use super::att_map_geometry;

    #[test]
    fn kv_maps_fit_the_drivers_limits() {
        // The 8B's and SmolLM2's heads, tiles of 16 and 8 keys.
        for (nkv, hd) in [(8, 128), (3, 64), (8, 64)] {
            for kt in [8, 16] {
                for box_x in [64, hd] {
                    let (dims, strides, boxd) = att_map_geometry(1 << 20, nkv, hd, box_x, kt);
                    assert_eq!(dims, [hd as u64, nkv as u64, 1 << 20]);
                    assert!(strides.iter().all(|s| s % 16 == 0));
                    // Strides grow with the dimension (a head inside a cell).
                    assert!(strides[0] < strides[1]);
                    assert!(boxd.iter().all(|&b| (1..=256).contains(&b)));
                    assert_eq!(boxd, [box_x as u32, 1, kt as u32]);
                    // A box's row bytes: a multiple of 16; the swizzled K
                    // box's exactly the 128-byte span.
                    assert_eq!((boxd[0] * 2) % 16, 0);
                }
            }
        }
        assert_eq!(att_map_geometry(64, 8, 128, 64, 16).2[0] * 2, 128);
    }
}
