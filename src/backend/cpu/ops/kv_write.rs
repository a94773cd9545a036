//! Store f32 K/V rows into paged cells: f16 (round to nearest even), or
//! a head's row as Q8_0 / Q4_0 blocks (ggml's reference quantizers).

use crate::backend::{KvLayerMut, KvType};
use anyhow::Result;
use half::f16;

/// k, v: (n, n_kv_heads, head_dim); slots: (n,) physical cell ids.
pub fn run(k: &[f32], v: &[f32], slots: &[u32], cache: KvLayerMut<'_>) -> Result<()> {
    let (nkv, hd, ty) = (cache.n_kv_heads, cache.head_dim, cache.ty);
    let row = nkv * hd;
    let n_cells = crate::backend::validate::kv_write(
        (cache.block_size, cache.n_kv_heads, cache.head_dim),
        cache.ty,
        cache.k.len(),
        cache.v.len(),
        k.len(),
        v.len(),
        slots.len(),
    )?;
    crate::backend::validate::kv_slots(slots, n_cells)?;
    let units = ty.row_units(hd);
    for (i, &s) in slots.iter().enumerate() {
        for h in 0..nkv {
            let src = i * row + h * hd;
            let dst = (s as usize * nkv + h) * units;
            store(ty, &k[src..src + hd], &mut cache.k[dst..dst + units])?;
            store(ty, &v[src..src + hd], &mut cache.v[dst..dst + units])?;
        }
    }
    Ok(())
}

/// One head's row x (hd,) into its `ty.row_units(hd)` units.
pub fn store(ty: KvType, x: &[f32], out: &mut [f16]) -> Result<()> {
    match ty {
        KvType::F16 => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f16::from_f32(v);
            }
        }
        KvType::Q8_0 | KvType::Q4_0 => {
            let bytes = crate::quant::quantize(ty.ggml(), x)?;
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
            }
        }
    }
    Ok(())
}

/// One head's row from its units into out (hd,): f16 converted exactly,
/// or a block type's `scale * q` (exact in f32).
pub fn load(ty: KvType, units: &[f16], out: &mut [f32]) {
    match ty {
        KvType::F16 => {
            for (o, u) in out.iter_mut().zip(units) {
                *o = u.to_f32();
            }
        }
        KvType::Q8_0 | KvType::Q4_0 => {
            let mut stack = [0u8; 2 * 17 * 8];
            let mut heap;
            let n = 2 * units.len();
            let bytes = if n <= stack.len() {
                &mut stack[..n]
            } else {
                heap = vec![0u8; n];
                &mut heap[..]
            };
            for (b, u) in bytes.chunks_exact_mut(2).zip(units) {
                b.copy_from_slice(&u.to_bits().to_le_bytes());
            }
            // validate::kv_write / attention checked the row's size.
            crate::quant::dequantize(ty.ggml(), bytes, out)
                .expect("a validated KV row holds whole blocks of its head_dim");
        }
    }
}
