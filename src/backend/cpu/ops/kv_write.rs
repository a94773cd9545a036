//! Store f32 K/V rows into paged f16 cells (round to nearest even).

use crate::backend::KvLayerMut;
use anyhow::{ensure, Result};
use half::f16;

/// k, v: (n, n_kv_heads, head_dim); slots: (n,) physical cell ids.
pub fn run(k: &[f32], v: &[f32], slots: &[u32], cache: KvLayerMut<'_>) -> Result<()> {
    let row = cache.n_kv_heads * cache.head_dim;
    let cell_elems = row;
    ensure!(
        row > 0 && cache.block_size > 0,
        "kv_write: n_kv_heads {} / head_dim {} / block_size {} must be > 0",
        cache.n_kv_heads,
        cache.head_dim,
        cache.block_size
    );
    ensure!(
        cache.k.len() == cache.v.len() && cache.k.len().is_multiple_of(cache.block_size * cell_elems),
        "kv_write: cache k {} / v {} elements, not whole blocks of (block_size {} , n_kv_heads {}, head_dim {})",
        cache.k.len(),
        cache.v.len(),
        cache.block_size,
        cache.n_kv_heads,
        cache.head_dim
    );
    ensure!(
        k.len() == slots.len() * row && v.len() == k.len(),
        "kv_write: k {} / v {} elements, expected n {} * n_kv_heads {} * head_dim {}",
        k.len(),
        v.len(),
        slots.len(),
        cache.n_kv_heads,
        cache.head_dim
    );
    let n_cells = cache.k.len() / cell_elems;
    for (i, &s) in slots.iter().enumerate() {
        ensure!(
            (s as usize) < n_cells,
            "kv_write: slot {s} of row {i} out of range (cache has {n_cells} cells)"
        );
    }
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
