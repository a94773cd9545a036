//! The device memory space's op dispatch (`Backend<Dev>`): each op over
//! device buffers (`device/memory.rs`) goes to its launcher, on the
//! backend's stream and unsynchronized. `host.rs` is the same for host
//! slices (`Backend<Host>`).

use super::device::memory::Dev;
use super::fusion::OpFusion;
use super::CudaBackend;
use super::{enter, supports};
use crate::backend::{Backend, MatNorm, Mode, OpT};
use anyhow::{bail, Context, Result};

/// Device-space ops: launched on the backend's stream, not synchronized
/// (the executor synchronizes once per step, when it reads the logits).
impl Backend<Dev> for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn supports_op(&self, op: &OpT<'_, Dev>, mode: Mode) -> bool {
        supports(self, &op.info(), mode)
    }

    fn run(&self, op: OpT<'_, Dev>, mode: Mode) -> Result<()> {
        self.run_fused(op, mode, None)
    }
}

impl CudaBackend {
    /// Runs `op` with its annotation from the step's fusion pass
    /// (`fusion::plan`; None: an op outside a planned step, whose fusions
    /// follow the backend's rules alone, as `run`).
    pub fn run_fused(&self, op: OpT<'_, Dev>, mode: Mode, fusion: Option<OpFusion>) -> Result<()> {
        // Norm-ahead's blocks serve only the op right after their producer
        // (taken first: an op that fails below drops them too), and only
        // one the fusion pass planned as their consumer.
        let ahead = self
            .take_norm_ahead()
            .filter(|_| fusion.is_some_and(|f| f.ahead_consumer));
        let kind = op.kind();
        if let Err(why) = self.capability(&op.info(), mode) {
            bail!("op {kind} cannot run on the cuda backend ({mode:?}): {why}");
        }
        let _g = enter(self)?;
        // The annotation holds for this op only (cleared however it ends).
        let _scope = self.fusion_scope(fusion)?;
        match op {
            // The hybrid ops (ops/gdn): one canonical kernel each in every
            // mode; the state-carrying two as the tuning table's gdn.fused.
            OpT::Conv1dSilu {
                x,
                w,
                channels,
                kernel,
                row_slots,
                mut state,
                mut out,
            } => self.d_conv1d_silu(&x, &w, channels, kernel, &row_slots, &mut state, &mut out),
            OpT::L2NormHeads {
                mut x,
                row_len,
                n_heads,
                head_dim,
                eps,
            } => self.d_l2_norm_heads(&mut x, row_len, n_heads, head_dim, eps),
            OpT::GdnGates {
                a,
                b,
                dt_bias,
                ssm_a,
                mut g,
                mut beta,
            } => self.d_gdn_gates(&a, &b, &dt_bias, &ssm_a, &mut g, &mut beta),
            OpT::DeltaRule {
                qkv,
                g,
                beta,
                h_k,
                h_v,
                d_k,
                d_v,
                row_slots,
                mut state,
                mut out,
            } => self.d_delta_rule(
                &qkv,
                &g,
                &beta,
                (h_k, h_v, d_k, d_v),
                &row_slots,
                &mut state,
                &mut out,
            ),
            OpT::GatedRmsNorm {
                x,
                z,
                w,
                head_dim,
                eps,
                mut out,
            } => self.d_gated_rms_norm(&x, &z, &w, head_dim, eps, &mut out),
            OpT::SplitHeads {
                x,
                head_dim,
                mut a,
                mut b,
            } => self.d_split_heads(&x, head_dim, &mut a, &mut b),
            OpT::SigmoidMul { mut x, gate } => self.d_sigmoid_mul(&mut x, &gate),
            OpT::AllGather { x, n, mut out, add } => self.d_all_gather(&x, n, &mut out, add),
            OpT::AllReduce { x, mut out, order } => self.d_all_reduce(&x, &mut out, order),
            OpT::MatMul { w, x, n, mut out } => self.d_mat_mul(&w, &x, n, &mut out, mode),
            OpT::MatMuls {
                x,
                n,
                mut jobs,
                norm: None,
                next_norm,
                glu,
            } => {
                Self::check_glu(&jobs, glu.as_ref().map(|h| h.len()))?;
                let mut done = false;
                if let Some((g, _eps)) = next_norm {
                    done = self.mat_muls_ahead(&x, n, &mut jobs, &g, mode)?;
                }
                if !done {
                    self.d_mat_muls(&x, n, &mut jobs, mode)?;
                }
                self.glu_after(&mut jobs, glu, n, mode)
            }
            OpT::MatMuls {
                x,
                n,
                mut jobs,
                norm: Some(MatNorm { w, eps, mut out }),
                // A norm-carrying op is never a residual producer in the
                // model graphs; the hint is not used here.
                next_norm: _,
                mut glu,
            } => {
                Self::check_glu(&jobs, glu.as_ref().map(|h| h.len()))?;
                if let Some(h) = glu.as_mut() {
                    if self
                        .mat_muls_glu_fused(&x, &w, eps, &mut out, n, &mut jobs, h, mode, ahead)?
                    {
                        return Ok(());
                    }
                }
                if !self.mat_muls_norm_ahead(&x, eps, n, &mut jobs, mode, ahead)? {
                    self.d_mat_muls_norm(&x, &w, eps, &mut out, n, &mut jobs, mode)?;
                }
                self.glu_after(&mut jobs, glu, n, mode)
            }
            OpT::RmsNorm {
                x,
                w,
                dim,
                eps,
                mut out,
            } => self.d_rms_norm(&x, &w, dim, eps, &mut out, mode),
            OpT::Rope {
                mut x,
                n_heads,
                head_dim,
                rope_dim,
                positions,
                inv_freq,
                neox,
            } => self.d_rope(
                &mut x, n_heads, head_dim, rope_dim, &positions, &inv_freq, neox,
            ),
            OpT::RopeKvWrite {
                mut q,
                mut k,
                v,
                n_heads,
                rope_dim,
                positions,
                inv_freq,
                neox,
                slots,
                mut cache,
            } => self.d_rope_kv_write(
                &mut q, &mut k, &v, n_heads, rope_dim, &positions, &inv_freq, neox, &slots,
                &mut cache,
            ),
            OpT::SwiGlu { gate, up, mut out } => self.d_swiglu(&gate, &up, &mut out, None, mode),
            OpT::GetRows {
                table,
                ids,
                mut out,
            } => self.d_get_rows(&table, &ids, &mut out),
            OpT::SelectRows {
                x,
                dim,
                rows,
                mut out,
            } => self.d_select_rows(&x, dim, &rows, &mut out),
            OpT::Add { mut x, y } => self.d_add(&mut x, &y),
            OpT::AddBias { mut x, bias } => self.d_add_bias(&mut x, &bias),
            OpT::KvWrite {
                k,
                v,
                slots,
                mut cache,
            } => self.d_kv_write(&k, &v, &slots, &mut cache),
            OpT::PagedAttention {
                q,
                n_heads,
                scale,
                cache,
                batch,
                opts,
                mut out,
            } => {
                let rows = batch.n_rows;
                self.d_attention(&q, n_heads, scale, &cache, batch, &opts, &mut out, mode)?;
                // The attention's forms without the annotated epilogue:
                // the standalone conversion (ops/matmul/prepared.rs).
                self.finish_out_for_next(&out.as_view(), Some(rows), mode)
            }
        }
        .with_context(|| format!("op {kind} on cuda (device)"))
    }
}
