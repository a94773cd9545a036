//! Store f32 K/V rows into paged f16 cells (round to nearest even).

use crate::backend::KvLayerMut;
use anyhow::Result;
use half::f16;

/// k, v: (n, n_kv_heads, head_dim); slots: (n,) physical cell ids.
pub fn run(k: &[f32], v: &[f32], slots: &[u32], cache: KvLayerMut<'_>) -> Result<()> {
    let row = cache.n_kv_heads * cache.head_dim;
    let cell_elems = row;
    let n_cells = crate::backend::validate::kv_write(
        (cache.block_size, cache.n_kv_heads, cache.head_dim),
        cache.k.len(),
        cache.v.len(),
        k.len(),
        v.len(),
        slots.len(),
    )?;
    crate::backend::validate::kv_slots(slots, n_cells)?;
    for (i, &s) in slots.iter().enumerate() {
        let dst = s as usize * cell_elems;
        for (o, &x) in cache.k[dst..dst + row].iter_mut().zip(&k[i * row..]) {
            *o = f16::from_f32(x);
        }
        for (o, &x) in cache.v[dst..dst + row].iter_mut().zip(&v[i * row..]) {
            *o = f16::from_f32(x);
        }
    }
    Ok(())
}
