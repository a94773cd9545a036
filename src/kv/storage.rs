//! The paged KV cache's storage: its layout ([`KvGeometry`], the one
//! definition every memory space allocates and indexes by) and its host
//! memory ([`KvStorage`], which the CPU backend reads in place; the device
//! executor allocates the same geometry in device memory).
//!
//! Layout per layer: k, v: (n_blocks, block_size, n_kv_heads, row units),
//! 16-bit units (`KvType::row_units`: f16 values, or Q8_0 / Q4_0 blocks),
//! every unit f16 NaN until written (a block type's scale included) (a read of a never-written cell shows up as
//! NaN in the output instead of passing silently). Block ids and tables are
//! owned by `kv::KvManager`; this is only memory.

use crate::backend::{KvLayer, KvLayerMut, KvType};
use anyhow::{bail, Result};
use half::f16;

/// The shape of a paged KV cache, checked once: every product fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    pub n_layers: usize,
    pub n_blocks: usize,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// How a row is stored (f16 unless [`KvGeometry::with_type`]).
    pub ty: KvType,
}

impl KvGeometry {
    /// The value every cell holds until written: f16 quiet NaN.
    pub const FILL: f16 = f16::NAN;

    /// A geometry whose per-layer and total sizes fit in `usize` (bytes
    /// included), else an error naming the sizes.
    pub fn new(
        n_layers: usize,
        n_blocks: usize,
        block_size: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let cell = n_kv_heads.checked_mul(head_dim);
        let fits = cell
            .and_then(|c| c.checked_mul(block_size))
            .and_then(|b| b.checked_mul(n_blocks))
            .and_then(|l| l.checked_mul(n_layers))
            .and_then(|t| t.checked_mul(2 * 2));
        if fits.is_none() {
            bail!(
                "KV cache of {n_layers} layers x {n_blocks} blocks x {block_size} cells x \
                 {n_kv_heads} x {head_dim} elements overflows"
            );
        }
        Ok(KvGeometry {
            n_layers,
            n_blocks,
            block_size,
            n_kv_heads,
            head_dim,
            ty: KvType::F16,
        })
    }

    /// The geometry with rows stored as `ty` (its blocks are no larger
    /// than f16 rows, so every size still fits); an error if `head_dim`
    /// does not fit the type.
    pub fn with_type(mut self, ty: KvType) -> Result<Self> {
        ty.check(self.head_dim)?;
        self.ty = ty;
        Ok(self)
    }

    /// 16-bit units of one cell (all KV heads of one position).
    pub fn cell_elems(&self) -> usize {
        self.n_kv_heads * self.ty.row_units(self.head_dim)
    }

    /// f16 elements of one block of one layer's K (or V).
    pub fn block_elems(&self) -> usize {
        self.block_size * self.cell_elems()
    }

    /// f16 elements of one layer's K (or V).
    pub fn layer_elems(&self) -> usize {
        self.n_blocks * self.block_elems()
    }

    /// Bytes of K and V over all layers.
    pub fn bytes(&self) -> usize {
        2 * self.n_layers * self.layer_elems() * 2
    }

    /// The element ranges of blocks `src` and `dst` in one layer's K (or
    /// V), for a copy-on-write copy; an error if either is out of range.
    pub fn copy_ranges(
        &self,
        src: u32,
        dst: u32,
    ) -> Result<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        let (s, d) = (src as usize, dst as usize);
        if s >= self.n_blocks || d >= self.n_blocks {
            bail!(
                "copy_block {src} -> {dst}: out of range ({} blocks)",
                self.n_blocks
            );
        }
        let n = self.block_elems();
        Ok((s * n..(s + 1) * n, d * n..(d + 1) * n))
    }
}

pub struct KvStorage {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    geo: KvGeometry,
    /// Hybrid models: the recurrent state of every slot, beside the
    /// attention layers' blocks.
    states: Option<Box<super::RecurrentStates>>,
}

impl KvStorage {
    pub fn new(
        n_layers: usize,
        n_blocks: usize,
        block_size: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        Self::of(KvGeometry::new(
            n_layers, n_blocks, block_size, n_kv_heads, head_dim,
        )?)
    }

    /// Host memory for `geo` (its row type included).
    pub fn of(geo: KvGeometry) -> Result<Self> {
        let (n_layers, per_layer) = (geo.n_layers, geo.layer_elems());
        Ok(KvStorage {
            k: (0..n_layers)
                .map(|_| vec![KvGeometry::FILL; per_layer])
                .collect(),
            v: (0..n_layers)
                .map(|_| vec![KvGeometry::FILL; per_layer])
                .collect(),
            geo,
            states: None,
        })
    }

    /// The cache with recurrent states (hybrid models).
    pub fn with_states(mut self, states: super::RecurrentStates) -> Self {
        self.states = Some(Box::new(states));
        self
    }

    /// The recurrent states, for a hybrid model's cache.
    pub fn states_mut(&mut self) -> Result<&mut super::RecurrentStates> {
        self.states
            .as_deref_mut()
            .ok_or_else(|| anyhow::anyhow!("this KV cache holds no recurrent state"))
    }

    /// The cache's layout.
    pub fn geometry(&self) -> KvGeometry {
        self.geo
    }

    pub fn block_size(&self) -> usize {
        self.geo.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.geo.n_blocks
    }

    /// Bytes of K and V over all layers.
    pub fn bytes(&self) -> usize {
        self.geo.bytes()
    }

    pub fn layer(&self, i: usize) -> Result<KvLayer<'_>> {
        match (self.k.get(i), self.v.get(i)) {
            (Some(k), Some(v)) => Ok(KvLayer {
                k,
                v,
                block_size: self.geo.block_size,
                n_kv_heads: self.geo.n_kv_heads,
                head_dim: self.geo.head_dim,
                ty: self.geo.ty,
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
                block_size: self.geo.block_size,
                n_kv_heads: self.geo.n_kv_heads,
                head_dim: self.geo.head_dim,
                ty: self.geo.ty,
            }),
            _ => bail!("KV layer {i} out of range ({n} layers)"),
        }
    }

    /// Copies physical block `src` to `dst` in every layer (copy-on-write).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        let (s, d) = self.geo.copy_ranges(src, dst)?;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.copy_within(s.clone(), d.start);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{KvGeometry, KvStorage};

    #[test]
    fn geometry_sizes_and_block_ranges() {
        let g = KvGeometry::new(2, 5, 16, 8, 64).unwrap();
        assert_eq!(g.cell_elems(), 512);
        assert_eq!(g.block_elems(), 16 * 512);
        assert_eq!(g.layer_elems(), 5 * 16 * 512);
        assert_eq!(g.bytes(), 2 * 2 * 5 * 16 * 512 * 2);
        let (s, d) = g.copy_ranges(1, 4).unwrap();
        assert_eq!((s.start, s.end), (8192, 16384));
        assert_eq!((d.start, d.end), (32768, 40960));
        let e = g.copy_ranges(5, 0).unwrap_err();
        assert!(format!("{e}").contains("out of range (5 blocks)"), "{e}");
        assert!(g.copy_ranges(0, 5).is_err());
    }

    #[test]
    fn a_geometry_that_overflows_is_an_error() {
        assert!(KvGeometry::new(32, usize::MAX / 2, 16, 8, 128).is_err());
        assert!(KvGeometry::new(usize::MAX, 1, 1, 1, 1).is_err());
        assert!(KvStorage::new(1, usize::MAX, 16, 8, 128).is_err());
    }

    #[test]
    fn host_storage_is_nan_until_written_and_copies_whole_blocks() {
        let mut kv = KvStorage::new(1, 3, 2, 1, 4).unwrap();
        assert!(kv.layer(0).unwrap().k.iter().all(|x| x.is_nan()));
        {
            let l = kv.layer_mut(0).unwrap();
            for (i, x) in l.k.iter_mut().enumerate() {
                *x = half::f16::from_f32(i as f32);
            }
        }
        kv.copy_block(0, 2).unwrap();
        let k = kv.layer(0).unwrap().k.to_vec();
        assert_eq!(&k[16..24], &k[0..8]);
        assert_eq!(k[8], half::f16::from_f32(8.0));
        assert!(kv.copy_block(3, 0).is_err());
        assert!(kv.layer(1).is_err());
    }
}
