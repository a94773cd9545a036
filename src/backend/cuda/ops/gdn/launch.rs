//! The hybrid ops' launchers over device buffers (both memory spaces come
//! here: `run_dev.rs` directly, `host.rs` after uploading). Each checks its
//! shapes as the cpu does, then launches gdn.cu's kernel; the two
//! state-carrying ops follow the planner (`plan`): fused, or gather /
//! compute / scatter through per-row scratch.
//!
//! `row_slots` lives on the device, so its values are not checked here
//! (host.rs checks host ones); the kernels bound every slot by the state
//! array's slot count (`n_slots`): an out-of-range slot's rows give NaN and
//! write no state.

use super::{
    check_conv, check_delta, check_gated_rms, check_gates, check_l2, check_split, conv_state_len,
    n_slots, plan, Plan, StateOp, CONV_CH, CONV_RL, DR_ROW_LANES, DR_WARPS, ROW_WARPS,
};
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::validate;
use anyhow::{bail, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// A grid of `blocks` CTAs of `threads`.
fn blocks(blocks: usize, threads: usize) -> Result<LaunchConfig> {
    let b = u32::try_from(blocks)
        .ok()
        .filter(|&b| b < i32::MAX as u32)
        .ok_or_else(|| anyhow::anyhow!("{blocks} CTAs: grid too large"))?;
    Ok(LaunchConfig {
        grid_dim: (b.max(1), 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

impl CudaBackend {
    /// Per-row state scratch (n, len) of an unfused path: a plain
    /// allocation, so never inside a graph capture (the fused path is the
    /// one a captured step takes).
    fn gdn_scratch(&self, n: usize, len: usize, what: &str) -> Result<CudaSlice<f32>> {
        let capturing = drv(self.stream().capture_status(), "gdn: capture status")?;
        if capturing != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            bail!(
                "{what}: the unfused path (tuning gdn.fused = false) allocates per-row state \
                 scratch and cannot run inside a graph capture"
            );
        }
        let total = n
            .checked_mul(len)
            .ok_or_else(|| anyhow::anyhow!("{what}: {n} rows x {len} state values overflow"))?;
        self.scratch::<f32>(total, what)
    }

    /// scratch (n, len)[r] = state[slot(r)] for each row r that starts a run.
    fn gdn_gather(
        &self,
        state: &CudaView<'_, f32>,
        ns: i32,
        len: usize,
        row_slots: &CudaView<'_, u32>,
        scratch: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = row_slots.len();
        let (ni, l64) = (i32_of(n, "rows")?, i64::try_from(len)?);
        let mut b = self.stream().launch_builder(self.func("gdn_state_gather")?);
        b.arg(state)
            .arg(&ns)
            .arg(&l64)
            .arg(row_slots)
            .arg(&ni)
            .arg(scratch);
        // SAFETY: matches gdn_state_gather; state holds ns slots of len
        // (ns = its length / len), row_slots n, scratch n * len; slots are
        // bounded in the kernel.
        drv(
            unsafe { b.launch(grid_1d(n * len, 256)?) },
            "gdn_state_gather: launch",
        )?;
        Ok(())
    }

    /// state[slot(r)] = scratch (n, len)[r] for each row r that ends a run.
    fn gdn_scatter(
        &self,
        scratch: &CudaSlice<f32>,
        len: usize,
        row_slots: &CudaView<'_, u32>,
        state: &mut CudaViewMut<'_, f32>,
        ns: i32,
    ) -> Result<()> {
        let n = row_slots.len();
        let (ni, l64) = (i32_of(n, "rows")?, i64::try_from(len)?);
        let mut b = self
            .stream()
            .launch_builder(self.func("gdn_state_scatter")?);
        b.arg(scratch)
            .arg(&l64)
            .arg(row_slots)
            .arg(&ni)
            .arg(state)
            .arg(&ns);
        // SAFETY: matches gdn_state_scatter; as gdn_gather.
        drv(
            unsafe { b.launch(grid_1d(n * len, 256)?) },
            "gdn_state_scatter: launch",
        )?;
        Ok(())
    }

    /// Conv1dSilu. x, out: (n, channels); w: (channels * kernel,);
    /// state: (n_slots, (kernel - 1) * channels), updated; row_slots: (n,).
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn d_conv1d_silu(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        channels: usize,
        kernel: usize,
        row_slots: &CudaView<'_, u32>,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let n = row_slots.len();
        if !check_conv(x.len(), w.len(), channels, kernel, n, out.len())? {
            return Ok(());
        }
        let len = conv_state_len(kernel, channels);
        let ns = n_slots(state.len(), len);
        let (ci, ki, ni) = (
            i32_of(channels, "channels")?,
            i32_of(kernel, "kernel")?,
            i32_of(n, "rows")?,
        );
        match plan(StateOp::Conv, &self.tuning.gdn)? {
            Plan::ConvFused => {
                let mut b = self.stream().launch_builder(self.func("gdn_conv_fused")?);
                b.arg(x)
                    .arg(w)
                    .arg(&ci)
                    .arg(&ki)
                    .arg(row_slots)
                    .arg(&ni)
                    .arg(&mut *state)
                    .arg(&ns)
                    .arg(&mut *out);
                // SAFETY: matches gdn_conv_fused; x and out hold n * channels
                // values, w channels * kernel (checked), state ns slots of
                // len; slots >= ns are skipped in the kernel. A CTA per 32
                // channels over every row.
                let cfg = blocks(channels.div_ceil(CONV_CH), CONV_CH * CONV_RL)?;
                drv(unsafe { b.launch(cfg) }, "gdn_conv_fused: launch")?;
            }
            Plan::ConvUnfused => {
                let mut scratch = self.gdn_scratch(n, len, "conv1d_silu")?;
                let mut win = self.gdn_scratch(n, channels * kernel, "conv1d_silu window")?;
                if len > 0 {
                    self.gdn_gather(&state.as_view(), ns, len, row_slots, &mut scratch)?;
                }
                let mut b = self.stream().launch_builder(self.func("gdn_conv_window")?);
                b.arg(x)
                    .arg(&ci)
                    .arg(&ki)
                    .arg(row_slots)
                    .arg(&ni)
                    .arg(&scratch)
                    .arg(&ns)
                    .arg(&mut win);
                // SAFETY: matches gdn_conv_window; x holds n * channels,
                // scratch n * len, win n * channels * kernel values.
                drv(
                    unsafe { b.launch(grid_1d(n * channels, 256)?) },
                    "gdn_conv_window: launch",
                )?;
                let mut b = self
                    .stream()
                    .launch_builder(self.func("gdn_conv_unfolded")?);
                b.arg(&win)
                    .arg(w)
                    .arg(&ci)
                    .arg(&ki)
                    .arg(row_slots)
                    .arg(&ni)
                    .arg(&ns)
                    .arg(&mut *out)
                    .arg(&mut scratch);
                // SAFETY: matches gdn_conv_unfolded; win n * channels *
                // kernel, w channels * kernel, out n * channels, scratch
                // n * len values.
                drv(
                    unsafe { b.launch(grid_1d(n * channels, 256)?) },
                    "gdn_conv_unfolded: launch",
                )?;
                if len > 0 {
                    self.gdn_scatter(&scratch, len, row_slots, state, ns)?;
                }
            }
            p => bail!("conv1d_silu: planned {p:?}"),
        }
        Ok(())
    }

    /// DeltaRule. qkv: (n, 2 h_k d_k + h_v d_v); g, beta: (n, h_v);
    /// state: (n_slots, h_v d_k d_v), updated; out: (n, h_v d_v).
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn d_delta_rule(
        &self,
        qkv: &CudaView<'_, f32>,
        g: &CudaView<'_, f32>,
        beta: &CudaView<'_, f32>,
        (h_k, h_v, d_k, d_v): (usize, usize, usize, usize),
        row_slots: &CudaView<'_, u32>,
        state: &mut CudaViewMut<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let n = row_slots.len();
        let dims = (h_k, h_v, d_k, d_v);
        if !check_delta(dims, qkv.len(), g.len(), beta.len(), n, out.len())? {
            return Ok(());
        }
        let p = plan(StateOp::Delta { d_k }, &self.tuning.gdn)?;
        let len = h_v * d_k * d_v;
        let ns = n_slots(state.len(), len);
        let (hki, hvi, dki, dvi, ni) = (
            i32_of(h_k, "h_k")?,
            i32_of(h_v, "h_v")?,
            i32_of(d_k, "d_k")?,
            i32_of(d_v, "d_v")?,
            i32_of(n, "rows")?,
        );
        // A CTA per (row lane, head, DR_WARPS columns); row lane y takes
        // the runs starting at rows y, y + ry, ... (gdn.cu).
        let ry = n.min(DR_ROW_LANES);
        let ryi = i32_of(ry, "row lanes")?;
        let cfg = blocks(ry * h_v * d_v.div_ceil(DR_WARPS), 32 * DR_WARPS)?;
        let mut scratch = if p.unfused() {
            let mut s = self.gdn_scratch(n, len, "delta_rule")?;
            self.gdn_gather(&state.as_view(), ns, len, row_slots, &mut s)?;
            Some(s)
        } else {
            None
        };
        let mut b = self.stream().launch_builder(self.func(p.kernel())?);
        b.arg(qkv)
            .arg(g)
            .arg(beta)
            .arg(&hki)
            .arg(&hvi)
            .arg(&dki)
            .arg(&dvi)
            .arg(row_slots)
            .arg(&ni);
        match scratch.as_mut() {
            Some(s) => b.arg(s),
            None => b.arg(&mut *state),
        };
        b.arg(&ns).arg(&mut *out).arg(&ryi);
        // SAFETY: matches gdn_delta_{fused,scratch}{4,8}; qkv, g, beta and
        // out hold n rows of their widths (checked), the state ns slots of
        // len (the scratch n rows of len); d_k <= 32 x the kernel's
        // registers per lane (the plan); slots >= ns are skipped.
        drv(unsafe { b.launch(cfg) }, "delta_rule: launch")?;
        if let Some(s) = &scratch {
            self.gdn_scatter(s, len, row_slots, state, ns)?;
        }
        Ok(())
    }

    /// L2NormHeads in place: x (rows, row_len), its first n_heads heads of
    /// head_dim.
    pub(crate) fn d_l2_norm_heads(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        row_len: usize,
        n_heads: usize,
        head_dim: usize,
        eps: f32,
    ) -> Result<()> {
        if !check_l2(x.len(), row_len, n_heads, head_dim)? {
            return Ok(());
        }
        let rows = x.len() / row_len;
        let (ri, li, hi, di) = (
            i32_of(rows, "rows")?,
            i32_of(row_len, "row_len")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(head_dim, "head_dim")?,
        );
        let mut b = self.stream().launch_builder(self.func("gdn_l2_norm")?);
        b.arg(&mut *x).arg(&ri).arg(&li).arg(&hi).arg(&di).arg(&eps);
        // SAFETY: matches gdn_l2_norm; x holds rows * row_len values and
        // n_heads * head_dim <= row_len (checked); a warp per (row, head).
        let cfg = blocks((rows * n_heads).div_ceil(ROW_WARPS), 32 * ROW_WARPS)?;
        drv(unsafe { b.launch(cfg) }, "l2_norm_heads: launch")?;
        Ok(())
    }

    /// GdnGates: a, b, g, beta (n, h_v); dt_bias, ssm_a (h_v,).
    pub(crate) fn d_gdn_gates(
        &self,
        a: &CudaView<'_, f32>,
        b_in: &CudaView<'_, f32>,
        dt_bias: &CudaView<'_, f32>,
        ssm_a: &CudaView<'_, f32>,
        g: &mut CudaViewMut<'_, f32>,
        beta: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        check_gates(
            a.len(),
            b_in.len(),
            dt_bias.len(),
            ssm_a.len(),
            g.len(),
            beta.len(),
        )?;
        if a.is_empty() {
            return Ok(());
        }
        let (len, hi) = (a.len() as i64, i32_of(dt_bias.len(), "h_v")?);
        let mut b = self.stream().launch_builder(self.func("gdn_gates")?);
        b.arg(a)
            .arg(b_in)
            .arg(dt_bias)
            .arg(ssm_a)
            .arg(&len)
            .arg(&hi)
            .arg(&mut *g)
            .arg(&mut *beta);
        // SAFETY: matches gdn_gates; a, b, g, beta hold len values, dt_bias
        // and ssm_a h_v (checked).
        drv(
            unsafe { b.launch(grid_1d(a.len(), 256)?) },
            "gdn_gates: launch",
        )?;
        Ok(())
    }

    /// GatedRmsNorm: x, z, out (rows, head_dim); w (head_dim,).
    pub(crate) fn d_gated_rms_norm(
        &self,
        x: &CudaView<'_, f32>,
        z: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        head_dim: usize,
        eps: f32,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        check_gated_rms(x.len(), z.len(), w.len(), head_dim, out.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let rows = x.len() / head_dim;
        let (r64, di) = (rows as i64, i32_of(head_dim, "head_dim")?);
        let mut b = self
            .stream()
            .launch_builder(self.func("gdn_gated_rms_norm")?);
        b.arg(x)
            .arg(z)
            .arg(w)
            .arg(&r64)
            .arg(&di)
            .arg(&eps)
            .arg(&mut *out);
        // SAFETY: matches gdn_gated_rms_norm; x, z, out hold rows *
        // head_dim values, w head_dim (checked); a warp per row.
        let cfg = blocks(rows.div_ceil(ROW_WARPS), 32 * ROW_WARPS)?;
        drv(unsafe { b.launch(cfg) }, "gated_rms_norm: launch")?;
        Ok(())
    }

    /// SplitHeads: x (rows, 2 head_dim) -> a, b (rows, head_dim).
    pub(crate) fn d_split_heads(
        &self,
        x: &CudaView<'_, f32>,
        head_dim: usize,
        a: &mut CudaViewMut<'_, f32>,
        b_out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        check_split(x.len(), head_dim, a.len(), b_out.len())?;
        if a.is_empty() {
            return Ok(());
        }
        let (len, di) = (a.len() as i64, i32_of(head_dim, "head_dim")?);
        let cfg = grid_1d(a.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("gdn_split_heads")?);
        b.arg(x).arg(&len).arg(&di).arg(&mut *a).arg(&mut *b_out);
        // SAFETY: matches gdn_split_heads; a and b hold len values, x 2 len
        // (checked).
        drv(unsafe { b.launch(cfg) }, "split_heads: launch")?;
        Ok(())
    }

    /// SigmoidMul: x *= sigmoid(gate), elementwise.
    pub(crate) fn d_sigmoid_mul(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        gate: &CudaView<'_, f32>,
    ) -> Result<()> {
        validate::same_len("sigmoid_mul", &[x.len(), gate.len()])?;
        if x.is_empty() {
            return Ok(());
        }
        let len = x.len() as i64;
        let cfg = grid_1d(x.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("gdn_sigmoid_mul")?);
        b.arg(&mut *x).arg(gate).arg(&len);
        // SAFETY: matches gdn_sigmoid_mul; both buffers hold len values.
        drv(unsafe { b.launch(cfg) }, "sigmoid_mul: launch")?;
        Ok(())
    }
}
