//! The element-wise ops: RoPE, SwiGlu (and its fused outputs for the next
//! matmul), row gathers and selection, residual and bias adds. One kernel
//! each, no planner: their only choices are the fused output forms the
//! fusion pass annotates.

use super::super::{drv, grid_1d, i32_of, ty_code, CudaBackend};
use crate::backend::cuda::device::launch::dev_ptr;
use crate::backend::cuda::device::memory::DevMatrix;
use crate::backend::{validate, Mode};
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl CudaBackend {
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn d_rope(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        positions: &CudaView<'_, u32>,
        inv_freq: &CudaView<'_, f32>,
        neox: bool,
    ) -> Result<()> {
        let n = positions.len();
        validate::rope(x.len(), n_heads, head_dim, rope_dim, n, inv_freq.len())?;
        let total = n * n_heads * (rope_dim / 2);
        if total == 0 {
            return Ok(());
        }
        let (ni, hi, hdi, rdi) = (
            i32_of(n, "n")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(head_dim, "head_dim")?,
            i32_of(rope_dim, "rope_dim")?,
        );
        let nx = neox as i32;
        let mut b = self.stream().launch_builder(self.func("rope")?);
        b.arg(x)
            .arg(&ni)
            .arg(&hi)
            .arg(&hdi)
            .arg(&rdi)
            .arg(positions)
            .arg(inv_freq)
            .arg(&nx);
        // SAFETY: matches rope; x holds n*n_heads*head_dim, positions n,
        // inv_freq rope_dim/2 (validated).
        drv(unsafe { b.launch(grid_1d(total, 256)?) }, "rope: launch")?;
        Ok(())
    }

    /// swiglu. Where the op's annotation says the next matmul reads the
    /// output quantized (q8_out), swiglu_q8 does it in the same pass; where
    /// it reads the wgmma GEMM's tiles (with `rows` known), swiglu_f16wr;
    /// where neither kernel could (buffers unaligned), the plain kernel and
    /// the standalone conversion (`finish_out_for_next`).
    pub(crate) fn d_swiglu(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        rows: Option<usize>,
        mode: Mode,
    ) -> Result<()> {
        validate::same_len("swiglu", &[gate.len(), up.len(), out.len()])?;
        if out.is_empty() {
            return Ok(());
        }
        let pre = match rows {
            Some(r) if r > 0 && out.len().is_multiple_of(r) => {
                self.q8_out(out, Some(r), out.len() / r, mode)?
            }
            Some(_) => None,
            None => self.q8_out(out, None, 32, mode)?,
        };
        // A `SwiGlu` op has no row count: no wgmma tiles then (they need
        // the rows); q8 blocks need none.
        let r = rows.unwrap_or(0);
        let f16 = if pre.is_none()
            && r > 0
            && out.len().is_multiple_of(r)
            && dev_ptr(gate, self.stream()).is_multiple_of(16)
            && dev_ptr(up, self.stream()).is_multiple_of(16)
        {
            self.f16wr_out(out, r, out.len() / r, mode)?
                .map(|(key, p)| (key, p, r))
        } else {
            None
        };
        if let Some((key, x16, n)) = f16 {
            let k = out.len() / n;
            let pieces = n.div_ceil(256) * 256 * k / 8;
            let (ni, ki, p64) = (i32_of(n, "rows")?, i32_of(k, "k")?, i64::try_from(pieces)?);
            let mut b = self.stream().launch_builder(self.func("swiglu_f16wr")?);
            b.arg(gate)
                .arg(up)
                .arg(&ni)
                .arg(&ki)
                .arg(&p64)
                .arg(&mut *out)
                .arg(&x16);
            // SAFETY: matches swiglu_f16wr; the three buffers hold n * k
            // elements, 16-byte aligned (checked here and by f16wr_out), k
            // a multiple of 256; x16 an arena region of `pieces` 16-byte
            // pieces (whole tiles up to 256-row multiples: f16wr_out).
            drv(unsafe { b.launch(grid_1d(pieces, 256)?) }, "swiglu: launch")?;
            self.q8_done(key);
            return Ok(());
        }
        if let Some((key, xq, xds)) = pre {
            let len = out.len() as i64;
            let cfg = grid_1d(out.len(), 256)?;
            let mut b = self.stream().launch_builder(self.func("swiglu_q8")?);
            b.arg(gate)
                .arg(up)
                .arg(&len)
                .arg(&mut *out)
                .arg(&xq)
                .arg(&xds);
            // SAFETY: matches swiglu_q8; the three buffers hold len elements
            // (a multiple of 32: rows of k, k a multiple of 32); xq / xds
            // arena regions of len bytes and len / 32 float2 (q8_out).
            drv(unsafe { b.launch(cfg) }, "swiglu: launch")?;
            self.q8_done(key);
            return Ok(());
        }
        let len = out.len() as i64;
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("swiglu")?);
        b.arg(gate).arg(up).arg(&len).arg(&mut *out);
        // SAFETY: matches swiglu; all three buffers hold len elements.
        drv(unsafe { b.launch(cfg) }, "swiglu: launch")?;
        self.finish_out_for_next(&out.as_view(), rows, mode)
    }

    pub(crate) fn d_get_rows(
        &self,
        table: &DevMatrix<'_>,
        ids: &CudaView<'_, u32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let tc = ty_code(table.ty)
            .ok_or_else(|| anyhow!("get_rows: {:?} is not a weight type", table.ty))?;
        let rb = validate::get_rows(table, table.data.len(), ids.len(), out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let (ri, ci, ni) = (
            i32_of(table.rows, "rows")?,
            i32_of(table.cols, "cols")?,
            i32_of(ids.len(), "ids")?,
        );
        let rbl = rb as i64;
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("get_rows")?);
        b.arg(&table.data)
            .arg(&ri)
            .arg(&ci)
            .arg(&rbl)
            .arg(&tc)
            .arg(ids)
            .arg(&ni)
            .arg(out);
        // SAFETY: matches get_rows; the kernel bounds-checks every id
        // against table_rows; out holds n_ids*cols (validated).
        drv(unsafe { b.launch(cfg) }, "get_rows: launch")?;
        Ok(())
    }

    pub(crate) fn d_select_rows(
        &self,
        x: &CudaView<'_, f32>,
        dim: usize,
        rows: &CudaView<'_, u32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let n = validate::select_rows(x.len(), dim, rows.len(), out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let (ni, di, mi) = (
            i32_of(n, "n")?,
            i32_of(dim, "dim")?,
            i32_of(rows.len(), "rows")?,
        );
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("select_rows")?);
        b.arg(x).arg(&ni).arg(&di).arg(rows).arg(&mi).arg(out);
        // SAFETY: matches select_rows; the kernel bounds-checks every row
        // against n; out holds m*dim (validated).
        drv(unsafe { b.launch(cfg) }, "select_rows: launch")?;
        Ok(())
    }

    pub(crate) fn d_add(&self, x: &mut CudaViewMut<'_, f32>, y: &CudaView<'_, f32>) -> Result<()> {
        validate::same_len("add", &[x.len(), y.len()])?;
        if x.is_empty() {
            return Ok(());
        }
        let len = x.len() as i64;
        let cfg = grid_1d(x.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("add")?);
        b.arg(x).arg(y).arg(&len);
        // SAFETY: matches add; both buffers hold len elements.
        drv(unsafe { b.launch(cfg) }, "add: launch")?;
        Ok(())
    }

    pub(crate) fn d_add_bias(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        bias: &CudaView<'_, f32>,
    ) -> Result<()> {
        let dim = bias.len();
        validate::add_bias(x.len(), dim)?;
        if x.is_empty() {
            return Ok(());
        }
        let len = x.len() as i64;
        let di = i32_of(dim, "dim")?;
        let cfg = grid_1d(x.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("add_bias")?);
        b.arg(x).arg(bias).arg(&len).arg(&di);
        // SAFETY: matches add_bias; x holds len, bias dim elements.
        drv(unsafe { b.launch(cfg) }, "add_bias: launch")?;
        Ok(())
    }
}
