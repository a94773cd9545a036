//! Host storage of the paged KV cache (the CPU backend reads it in place).
//!
//! Layout per layer: k, v: (n_blocks, block_size, n_kv_heads, head_dim), f16.
//! Block ids and tables are owned by `kv::KvManager`; this is only memory.

use crate::backend::{KvLayer, KvLayerMut};
use anyhow::{bail, Result};
use half::f16;

pub struct KvStorage {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    n_blocks: usize,
    block_size: usize,
    n_kv_heads: usize,
    head_dim: usize,
    cell_elems: usize,
}

impl KvStorage {
    pub fn new(
        n_layers: usize,
        n_blocks: usize,
        block_size: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let cell_elems = n_kv_heads * head_dim;
        let Some(per_layer) = n_blocks
            .checked_mul(block_size)
            .and_then(|c| c.checked_mul(cell_elems))
        else {
            bail!("KV cache of {n_blocks} blocks x {block_size} cells x {cell_elems} elements overflows");
        };
        // Filled with NaN so a read of a cell that was never written shows up
        // as NaN in the output instead of passing silently.
        let fill = f16::NAN;
        Ok(KvStorage {
            k: (0..n_layers).map(|_| vec![fill; per_layer]).collect(),
            v: (0..n_layers).map(|_| vec![fill; per_layer]).collect(),
            n_blocks,
            block_size,
            n_kv_heads,
            head_dim,
            cell_elems,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Bytes of K and V over all layers.
    pub fn bytes(&self) -> usize {
        2 * self.k.len() * self.n_blocks * self.block_size * self.cell_elems * 2
    }

    pub fn layer(&self, i: usize) -> Result<KvLayer<'_>> {
        match (self.k.get(i), self.v.get(i)) {
            (Some(k), Some(v)) => Ok(KvLayer {
                k,
                v,
                block_size: self.block_size,
                n_kv_heads: self.n_kv_heads,
                head_dim: self.head_dim,
            }),
            _ => bail!("KV layer {i} out of range ({} layers)", self.k.len()),
        }
    }

    pub fn layer_mut(&mut self, i: usize) -> Result<KvLayerMut<'_>> {
        let n = self.k.len();
        match (self.k.get_mut(i), self.v.get_mut(i)) {
            (Some(k), Some(v)) => Ok(KvLayerMut {
                k,
                v,
                block_size: self.block_size,
                n_kv_heads: self.n_kv_heads,
                head_dim: self.head_dim,
            }),
            _ => bail!("KV layer {i} out of range ({n} layers)"),
        }
    }

    /// Copies physical block `src` to `dst` in every layer (copy-on-write).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        let (s, d) = (src as usize, dst as usize);
        if s >= self.n_blocks || d >= self.n_blocks {
            bail!(
                "copy_block {src} -> {dst}: out of range ({} blocks)",
                self.n_blocks
            );
        }
        let n = self.block_size * self.cell_elems;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.copy_within(s * n..(s + 1) * n, d * n);
        }
        Ok(())
    }
}
