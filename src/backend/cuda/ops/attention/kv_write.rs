//! The K/V cache writes: RoPE of q and k with the K/V store in one kernel,
//! and the plain store, both through the rows' slots in the paged cache.

use crate::backend::cuda::device::memory::DevKvMut;
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::{validate, KvInfo};
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl CudaBackend {
    /// Stores k, v rows into cells `slots` of the cache. The slot values
    /// must have been checked distinct and in range where they were
    /// uploaded; the kernel skips any slot out of range regardless.
    /// Rope of q and k and the K/V store in one kernel (rope_kv_write.cu),
    /// the bits of d_rope, d_rope, d_kv_write.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn d_rope_kv_write(
        &self,
        q: &mut CudaViewMut<'_, f32>,
        k: &mut CudaViewMut<'_, f32>,
        v: &CudaView<'_, f32>,
        n_heads: usize,
        rope_dim: usize,
        positions: &CudaView<'_, u32>,
        inv_freq: &CudaView<'_, f32>,
        neox: bool,
        slots: &CudaView<'_, u32>,
        cache: &mut DevKvMut<'_>,
    ) -> Result<()> {
        let (nkv, hd) = (cache.n_kv_heads, cache.head_dim);
        let n = positions.len();
        validate::rope(q.len(), n_heads, hd, rope_dim, n, inv_freq.len())?;
        validate::rope(k.len(), nkv, hd, rope_dim, n, inv_freq.len())?;
        let n_cells = validate::kv_write(
            cache.geometry(),
            cache.kv_type(),
            cache.k.len(),
            cache.v.len(),
            k.len(),
            v.len(),
            slots.len(),
        )?;
        let per_row = (n_heads + nkv) * (rope_dim / 2) + nkv * (hd - rope_dim) + nkv * hd;
        if n == 0 {
            return Ok(());
        }
        let nx = neox as i32;
        let nc = n_cells as i64;
        let dims = [
            i32_of(n, "n")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(nkv, "n_kv_heads")?,
            i32_of(hd, "head_dim")?,
            i32_of(rope_dim, "rope_dim")?,
        ];
        let mut b = self.stream().launch_builder(self.func("rope_kv_write")?);
        b.arg(&mut *q)
            .arg(&mut *k)
            .arg(v)
            .arg(&dims[0])
            .arg(&dims[1])
            .arg(&dims[2])
            .arg(&dims[3])
            .arg(&dims[4])
            .arg(positions)
            .arg(inv_freq)
            .arg(&nx)
            .arg(slots)
            .arg(&nc)
            .arg(&mut cache.k)
            .arg(&mut cache.v);
        // SAFETY: matches rope_kv_write; q holds n*n_heads*head_dim, k and
        // v n*n_kv*head_dim, positions and slots n, inv_freq rope_dim/2
        // (validated); the kernel skips slots >= n_cells.
        drv(
            unsafe { b.launch(grid_1d(n * per_row, 256)?) },
            "rope_kv_write: launch",
        )?;
        Ok(())
    }

    pub(crate) fn d_kv_write(
        &self,
        k: &CudaView<'_, f32>,
        v: &CudaView<'_, f32>,
        slots: &CudaView<'_, u32>,
        cache: &mut DevKvMut<'_>,
    ) -> Result<()> {
        let n_cells = validate::kv_write(
            cache.geometry(),
            cache.kv_type(),
            cache.k.len(),
            cache.v.len(),
            k.len(),
            v.len(),
            slots.len(),
        )?;
        if k.is_empty() {
            return Ok(());
        }
        let row = cache.n_kv_heads * cache.head_dim;
        let (ni, ri) = (i32_of(slots.len(), "n")?, i32_of(row, "row")?);
        let nc = n_cells as i64;
        let cfg = grid_1d(k.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("kv_write")?);
        b.arg(k)
            .arg(v)
            .arg(slots)
            .arg(&ni)
            .arg(&ri)
            .arg(&nc)
            .arg(&mut cache.k)
            .arg(&mut cache.v);
        // SAFETY: matches kv_write; k, v hold n*row; the kernel skips slots
        // >= n_cells, so every write is inside the cache.
        drv(unsafe { b.launch(cfg) }, "kv_write: launch")?;
        Ok(())
    }
}
