//! The fused decode layers on the device executor: whether a step takes
//! them (launch/decode_layers.rs plans the kernel), and the launch on the
//! step's buffers.

use super::{CudaExec, DevBuf, DevKvCache, DevStore};
use crate::backend::cuda::{DlLayerPtrs, DlModel};
use crate::backend::Mode;
use crate::dispatch::{Exec, StepBufs};
use crate::model::arch::llama::LlamaWeights;
use crate::model::config::ModelConfig;
use anyhow::{Context, Result};
use cudarc::driver::{CudaSlice, DevicePtr};

fn addr<T>(s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(s.stream());
    p
}

impl CudaExec {
    /// Runs every layer of a one-row `fast` step in one launch
    /// (`Exec::fused_layers`): false when the mode, the step or the model
    /// is not one the kernel takes (then nothing ran).
    pub(super) fn run_fused_layers(
        &self,
        c: &ModelConfig,
        w: &LlamaWeights<DevStore>,
        kv: &mut DevKvCache,
        b: &StepBufs<<Self as Exec>::IdxBuf<'_>, <Self as Exec>::BatchBuf<'_>>,
        x: &mut DevBuf,
    ) -> Result<bool> {
        // The switch first: off (the default), a step pays no other check.
        if !self.be.fused_layers || self.mode != Mode::Fast || b.n != 1 || self.profile {
            return Ok(false);
        }
        let Some(l0) = w.layers.first() else {
            return Ok(false);
        };
        let ty = l0.wq.ty;
        let plain = w.layers.iter().all(|l| {
            l.bq.is_none()
                && l.bk.is_none()
                && l.bv.is_none()
                && l.q_norm.is_none()
                && l.k_norm.is_none()
                && [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                    .iter()
                    .all(|m| m.ty == ty)
        });
        if !plain || kv.k.len() != w.layers.len() {
            return Ok(false);
        }
        let model = DlModel {
            ty,
            n_layers: c.n_layers,
            dim: c.dim,
            n_heads: c.n_heads,
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            ffn: c.ffn_dim,
            rope_dim: c.rope_dim,
            neox: c.arch.neox_rope(),
            eps: c.rms_eps,
        };
        let plan = match self
            .be
            .dl_plan(&model, kv.block_size, kv.n_blocks * kv.block_size)
        {
            Ok(p) => p,
            Err(why) => {
                tracing::debug!("fused decode layers not taken: {why}");
                return Ok(false);
            }
        };
        let ptrs: Vec<DlLayerPtrs> = w
            .layers
            .iter()
            .zip(kv.k.iter().zip(&kv.v))
            .map(|(l, (k, v))| {
                DlLayerPtrs([
                    addr(&l.wq.data),
                    addr(&l.wk.data),
                    addr(&l.wv.data),
                    addr(&l.wo.data),
                    addr(&l.w_gate.data),
                    addr(&l.w_up.data),
                    addr(&l.w_down.data),
                    addr(&l.attn_norm.data),
                    addr(&l.ffn_norm.data),
                    addr(k),
                    addr(v),
                ])
            })
            .collect();
        let mut scratch = self.zeros(plan.scratch_len)?;
        self.be
            .decode_layers(
                &plan,
                &ptrs,
                &mut Self::wr(x),
                &mut Self::wr(&mut scratch),
                Self::batch_view(&b.batch),
                &Self::idx_view(&b.slots),
                &Self::param(&w.inv_freq),
            )
            .context("op decode_layers on backend cuda")?;
        if let Ok(mut cnt) = self.counts.lock() {
            cnt.entry("decode_layers").or_insert((0, 0.0)).0 += 1;
        }
        Ok(true)
    }
}
