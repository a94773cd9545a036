//! The host-slice path of the `cuda` backend (`Backend<Host>`): each op
//! uploads its inputs, runs the device launcher of `ops/` and
//! downloads its outputs. This is what the parity harness drives, and what
//! `--gpu auto` uses for single ops when a model cannot run wholly on the
//! device. A model step on the GPU uses the device space instead
//! (`dispatch::cuda`), which keeps activations and the KV cache resident.
//!
//! Weights (`QMatrix.data`, which lives in the model's mmap for the whole
//! run) are uploaded once and cached, keyed by (address, length, content
//! fingerprint). KV ops upload only the blocks their slots or block tables
//! touch, remapped onto a compact buffer.

use super::device::memory::{Dev, DevAttnBatch, DevKv, DevKvMut, DevMatrix};
use super::ops::gdn;
use super::{enter, supports};
use super::{fingerprint, CudaBackend};
use crate::backend::Backend;
use crate::backend::{
    validate, AttnBatch, AttnOpts, KvLayer, KvLayerMut, MatJob, Mode, Op, QMatrix,
};
use anyhow::{anyhow, Result};
use anyhow::{bail, Context};
use cudarc::driver::{CudaSlice, CudaView};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use std::collections::HashMap;
use std::sync::Arc;

impl CudaBackend {
    fn weight(&self, w: &QMatrix<'_>) -> Result<Arc<CudaSlice<u8>>> {
        let key = (w.data.as_ptr() as usize, w.data.len(), fingerprint(w.data));
        let mut cache = self
            .weights
            .lock()
            .map_err(|_| anyhow!("cuda backend: weight cache lock poisoned"))?;
        if let Some(s) = cache.get(&key) {
            return Ok(s.clone());
        }
        let s = Arc::new(self.up_weight(w.data, "uploading a weight matrix")?);
        cache.insert(key, s.clone());
        Ok(s)
    }

    fn dev_matrix<'a>(w: &QMatrix<'_>, data: &'a CudaSlice<u8>) -> DevMatrix<'a> {
        DevMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            data: data.slice(0..w.data.len()),
        }
    }

    /// Runs one host-slice op on the device (the caller holds the lock).
    pub(super) fn run_host(&self, op: &mut Op<'_>, mode: Mode) -> Result<()> {
        match op {
            // The hybrid ops: the state-carrying two upload the whole state
            // array (their slots checked here, as the cpu checks them) and
            // download it back with their output.
            Op::Conv1dSilu {
                x,
                w,
                channels,
                kernel,
                row_slots,
                state,
                out,
            } => {
                let len = gdn::conv_state_len(*kernel, *channels);
                gdn::check_conv(
                    x.len(),
                    w.len(),
                    *channels,
                    *kernel,
                    row_slots.len(),
                    out.len(),
                )?;
                gdn::check_row_slots(row_slots, state.len(), len)?;
                let (xd, wd) = (self.up(x, "conv1d_silu: x")?, self.up(w, "conv1d_silu: w")?);
                let rd = self.up(row_slots, "conv1d_silu: row_slots")?;
                let mut sd = self.up(state, "conv1d_silu: state")?;
                let mut od = self.scratch::<f32>(out.len(), "conv1d_silu: out")?;
                self.d_conv1d_silu(
                    &xd.slice(0..x.len()),
                    &wd.slice(0..w.len()),
                    *channels,
                    *kernel,
                    &rd.slice(0..row_slots.len()),
                    &mut sd.slice_mut(0..state.len()),
                    &mut od.slice_mut(0..out.len()),
                )?;
                self.down(&od, out, "conv1d_silu: out")?;
                self.down(&sd, state, "conv1d_silu: state")
            }
            Op::DeltaRule {
                qkv,
                g,
                beta,
                h_k,
                h_v,
                d_k,
                d_v,
                row_slots,
                state,
                out,
            } => {
                let dims = (*h_k, *h_v, *d_k, *d_v);
                gdn::check_delta(
                    dims,
                    qkv.len(),
                    g.len(),
                    beta.len(),
                    row_slots.len(),
                    out.len(),
                )?;
                gdn::check_row_slots(row_slots, state.len(), *h_v * *d_k * *d_v)?;
                let qd = self.up(qkv, "delta_rule: qkv")?;
                let (gd, bd) = (
                    self.up(g, "delta_rule: g")?,
                    self.up(beta, "delta_rule: beta")?,
                );
                let rd = self.up(row_slots, "delta_rule: row_slots")?;
                let mut sd = self.up(state, "delta_rule: state")?;
                let mut od = self.scratch::<f32>(out.len(), "delta_rule: out")?;
                self.d_delta_rule(
                    &qd.slice(0..qkv.len()),
                    &gd.slice(0..g.len()),
                    &bd.slice(0..beta.len()),
                    dims,
                    &rd.slice(0..row_slots.len()),
                    &mut sd.slice_mut(0..state.len()),
                    &mut od.slice_mut(0..out.len()),
                )?;
                self.down(&od, out, "delta_rule: out")?;
                self.down(&sd, state, "delta_rule: state")
            }
            Op::L2NormHeads {
                x,
                row_len,
                n_heads,
                head_dim,
                eps,
            } => {
                let mut xd = self.up(x, "l2_norm_heads: x")?;
                let xl = x.len();
                self.d_l2_norm_heads(
                    &mut xd.slice_mut(0..xl),
                    *row_len,
                    *n_heads,
                    *head_dim,
                    *eps,
                )?;
                self.down(&xd, x, "l2_norm_heads: x")
            }
            Op::GdnGates {
                a,
                b,
                dt_bias,
                ssm_a,
                g,
                beta,
            } => {
                let (ad, bd) = (self.up(a, "gdn_gates: a")?, self.up(b, "gdn_gates: b")?);
                let dd = self.up(dt_bias, "gdn_gates: dt_bias")?;
                let sd = self.up(ssm_a, "gdn_gates: ssm_a")?;
                let mut gd = self.scratch::<f32>(g.len(), "gdn_gates: g")?;
                let mut betad = self.scratch::<f32>(beta.len(), "gdn_gates: beta")?;
                self.d_gdn_gates(
                    &ad.slice(0..a.len()),
                    &bd.slice(0..b.len()),
                    &dd.slice(0..dt_bias.len()),
                    &sd.slice(0..ssm_a.len()),
                    &mut gd.slice_mut(0..g.len()),
                    &mut betad.slice_mut(0..beta.len()),
                )?;
                self.down(&gd, g, "gdn_gates: g")?;
                self.down(&betad, beta, "gdn_gates: beta")
            }
            Op::GatedRmsNorm {
                x,
                z,
                w,
                head_dim,
                eps,
                out,
            } => {
                let (xd, zd) = (
                    self.up(x, "gated_rms_norm: x")?,
                    self.up(z, "gated_rms_norm: z")?,
                );
                let wd = self.up(w, "gated_rms_norm: w")?;
                let mut od = self.scratch::<f32>(out.len(), "gated_rms_norm: out")?;
                self.d_gated_rms_norm(
                    &xd.slice(0..x.len()),
                    &zd.slice(0..z.len()),
                    &wd.slice(0..w.len()),
                    *head_dim,
                    *eps,
                    &mut od.slice_mut(0..out.len()),
                )?;
                self.down(&od, out, "gated_rms_norm: out")
            }
            Op::SplitHeads { x, head_dim, a, b } => {
                let xd = self.up(x, "split_heads: x")?;
                let mut ad = self.scratch::<f32>(a.len(), "split_heads: a")?;
                let mut bd = self.scratch::<f32>(b.len(), "split_heads: b")?;
                self.d_split_heads(
                    &xd.slice(0..x.len()),
                    *head_dim,
                    &mut ad.slice_mut(0..a.len()),
                    &mut bd.slice_mut(0..b.len()),
                )?;
                self.down(&ad, a, "split_heads: a")?;
                self.down(&bd, b, "split_heads: b")
            }
            Op::SigmoidMul { x, gate } => {
                let mut xd = self.up(x, "sigmoid_mul: x")?;
                let gd = self.up(gate, "sigmoid_mul: gate")?;
                let xl = x.len();
                self.d_sigmoid_mul(&mut xd.slice_mut(0..xl), &gd.slice(0..gate.len()))?;
                self.down(&xd, x, "sigmoid_mul: x")
            }
            Op::AllGather { x, n, out, add } => {
                let xd = self.up(x, "all_gather: x")?;
                let mut od = self.up(out, "all_gather: out")?;
                let ol = out.len();
                self.d_all_gather(&xd.slice(0..x.len()), *n, &mut od.slice_mut(0..ol), *add)?;
                self.down(&od, out, "all_gather: out")
            }
            Op::AllReduce { x, out, order } => {
                let xd = self.up(x, "all_reduce: x")?;
                let mut od = self.up(out, "all_reduce: out")?;
                let ol = out.len();
                self.d_all_reduce(&xd.slice(0..x.len()), &mut od.slice_mut(0..ol), *order)?;
                self.down(&od, out, "all_reduce: out")
            }
            Op::MatMul { w, x, n, out } => {
                validate::mat_mul(w, w.data.len(), x.len(), *n, out.len())?;
                let wd = self.weight(w)?;
                let xd = self.up(x, "mat_mul: x")?;
                let mut od = self.scratch::<f32>(out.len(), "mat_mul: out")?;
                self.d_mat_mul(
                    &Self::dev_matrix(w, &wd),
                    &xd.slice(0..x.len()),
                    *n,
                    &mut od.slice_mut(0..out.len()),
                    mode,
                )?;
                self.down(&od, out, "mat_mul: out")
            }
            // Host ops upload each input afresh, so no hint can reach the
            // next op's input: `next_norm` is ignored.
            Op::MatMuls {
                x,
                n,
                jobs,
                norm,
                next_norm: _,
                glu,
            } => {
                let shapes: Vec<(&dyn crate::backend::WeightInfo, usize)> = jobs
                    .iter()
                    .map(|j| (&j.w as &dyn crate::backend::WeightInfo, j.out.len()))
                    .collect();
                validate::mat_muls(x.len(), *n, &shapes)?;
                let wds = jobs
                    .iter()
                    .map(|j| self.weight(&j.w))
                    .collect::<Result<Vec<_>>>()?;
                let xd = self.up(x, "mat_muls: x")?;
                // Outputs go up too: an adding job reads them.
                let mut ods = jobs
                    .iter()
                    .map(|j| self.up(j.out, "mat_muls: out"))
                    .collect::<Result<Vec<_>>>()?;
                let mut djobs: Vec<MatJob<'_, Dev>> = jobs
                    .iter()
                    .zip(&wds)
                    .zip(ods.iter_mut())
                    .map(|((j, wd), od)| MatJob {
                        w: Self::dev_matrix(&j.w, wd),
                        out: od.slice_mut(0..j.out.len()),
                        add: j.add,
                    })
                    .collect();
                Self::check_glu(&djobs, glu.as_ref().map(|h| h.len()))?;
                // The SwiGlu's output (written only).
                let glu_len = glu.as_ref().map_or(0, |h| h.len());
                let mut hd = match glu {
                    Some(_) => Some(self.scratch::<f32>(glu_len, "mat_muls: glu")?),
                    None => None,
                };
                let mut fused = false;
                match norm {
                    None => self.d_mat_muls(&xd.slice(0..x.len()), *n, &mut djobs, mode)?,
                    Some(nm) => {
                        // d_mat_muls_norm validates the norm's shapes.
                        let wd = self.up(nm.w, "mat_muls: norm w")?;
                        // The normalized rows' scratch: its contents
                        // afterwards are unspecified, so never read back.
                        let mut sd = self.scratch::<f32>(nm.out.len(), "mat_muls: norm out")?;
                        let (xv, wv) = (xd.slice(0..x.len()), wd.slice(0..nm.w.len()));
                        let mut sv = sd.slice_mut(0..nm.out.len());
                        if let Some(hd) = hd.as_mut() {
                            fused = self.mat_muls_glu_fused(
                                &xv,
                                &wv,
                                nm.eps,
                                &mut sv,
                                *n,
                                &mut djobs,
                                &mut hd.slice_mut(0..glu_len),
                                mode,
                                // Host-slice ops never take norm-ahead's
                                // blocks (no producer ran on the device).
                                None,
                            )?;
                        }
                        if !fused {
                            self.d_mat_muls_norm(&xv, &wv, nm.eps, &mut sv, *n, &mut djobs, mode)?;
                        }
                    }
                }
                if let (Some(hd), false) = (hd.as_mut(), fused) {
                    self.glu_after(&mut djobs, Some(hd.slice_mut(0..glu_len)), *n, mode)?;
                }
                drop(djobs);
                for (j, od) in jobs.iter_mut().zip(&ods) {
                    self.down(od, j.out, "mat_muls: out")?;
                }
                if let (Some(h), Some(hd)) = (glu, &hd) {
                    self.down(hd, h, "mat_muls: glu")?;
                }
                Ok(())
            }
            Op::RmsNorm {
                x,
                w,
                dim,
                eps,
                out,
            } => {
                let (xd, wd) = (self.up(x, "rms_norm: x")?, self.up(w, "rms_norm: w")?);
                let mut od = self.scratch::<f32>(out.len(), "rms_norm: out")?;
                self.d_rms_norm(
                    &xd.slice(0..x.len()),
                    &wd.slice(0..w.len()),
                    *dim,
                    *eps,
                    &mut od.slice_mut(0..out.len()),
                    mode,
                )?;
                self.down(&od, out, "rms_norm: out")
            }
            Op::Rope {
                x,
                n_heads,
                head_dim,
                rope_dim,
                positions,
                inv_freq,
                neox,
            } => {
                let mut xd = self.up(x, "rope: x")?;
                let pd = self.up(positions, "rope: positions")?;
                let fd = self.up(inv_freq, "rope: inv_freq")?;
                self.d_rope(
                    &mut xd.slice_mut(0..x.len()),
                    *n_heads,
                    *head_dim,
                    *rope_dim,
                    &pd.slice(0..positions.len()),
                    &fd.slice(0..inv_freq.len()),
                    *neox,
                )?;
                self.down(&xd, x, "rope: x")
            }
            Op::SwiGlu { gate, up, out } => {
                let (gd, ud) = (self.up(gate, "swiglu: gate")?, self.up(up, "swiglu: up")?);
                let mut od = self.scratch::<f32>(out.len(), "swiglu: out")?;
                self.d_swiglu(
                    &gd.slice(0..gate.len()),
                    &ud.slice(0..up.len()),
                    &mut od.slice_mut(0..out.len()),
                    // Rows 0: no quantized copy (no device matmul follows).
                    Some(0),
                    mode,
                )?;
                self.down(&od, out, "swiglu: out")
            }
            Op::GetRows { table, ids, out } => {
                validate::get_rows(table, table.data.len(), ids.len(), out.len())?;
                validate::indices("get_rows: id", ids, table.rows)?;
                let td = self.weight(table)?;
                let idd = self.up(ids, "get_rows: ids")?;
                let mut od = self.scratch::<f32>(out.len(), "get_rows: out")?;
                self.d_get_rows(
                    &Self::dev_matrix(table, &td),
                    &idd.slice(0..ids.len()),
                    &mut od.slice_mut(0..out.len()),
                )?;
                self.down(&od, out, "get_rows: out")
            }
            Op::SelectRows { x, dim, rows, out } => {
                let n = validate::select_rows(x.len(), *dim, rows.len(), out.len())?;
                validate::indices("select_rows: row", rows, n)?;
                let xd = self.up(x, "select_rows: x")?;
                let rd = self.up(rows, "select_rows: rows")?;
                let mut od = self.scratch::<f32>(out.len(), "select_rows: out")?;
                self.d_select_rows(
                    &xd.slice(0..x.len()),
                    *dim,
                    &rd.slice(0..rows.len()),
                    &mut od.slice_mut(0..out.len()),
                )?;
                self.down(&od, out, "select_rows: out")
            }
            Op::Add { x, y } => {
                let (mut xd, yd) = (self.up(x, "add: x")?, self.up(y, "add: y")?);
                self.d_add(&mut xd.slice_mut(0..x.len()), &yd.slice(0..y.len()))?;
                self.down(&xd, x, "add: x")
            }
            Op::AddBias { x, bias } => {
                let (mut xd, bd) = (self.up(x, "add_bias: x")?, self.up(bias, "add_bias: bias")?);
                self.d_add_bias(&mut xd.slice_mut(0..x.len()), &bd.slice(0..bias.len()))?;
                self.down(&xd, x, "add_bias: x")
            }
            Op::KvWrite { k, v, slots, cache } => self.host_kv_write(k, v, slots, cache),
            Op::RopeKvWrite {
                q,
                k,
                v,
                n_heads,
                rope_dim,
                positions,
                inv_freq,
                neox,
                slots,
                cache,
            } => self.host_rope_kv_write(
                q, k, v, *n_heads, *rope_dim, positions, inv_freq, *neox, slots, cache,
            ),
            Op::PagedAttention {
                q,
                n_heads,
                scale,
                cache,
                batch,
                opts,
                out,
            } => self.host_attention(q, *n_heads, *scale, *cache, *batch, *opts, out, mode),
        }?;
        self.sync("host op")
    }

    /// Uploads the blocks holding `slots`, writes on the device, and copies
    /// those blocks back.
    fn host_kv_write(
        &self,
        k: &[f32],
        v: &[f32],
        slots: &[u32],
        cache: &mut KvLayerMut<'_>,
    ) -> Result<()> {
        let geo = (cache.block_size, cache.n_kv_heads, cache.head_dim);
        let n_cells = validate::kv_write(
            geo,
            cache.ty,
            cache.k.len(),
            cache.v.len(),
            k.len(),
            v.len(),
            slots.len(),
        )?;
        validate::kv_slots(slots, n_cells)?;
        if k.is_empty() {
            return Ok(());
        }
        let (kx, vx) = (self.up(k, "kv_write: k")?, self.up(v, "kv_write: v")?);
        self.with_kv_blocks(slots, cache, |sd, dc| {
            self.d_kv_write(&kx.slice(0..k.len()), &vx.slice(0..v.len()), sd, dc)
        })
    }

    /// RopeKvWrite on the host slices: q, k up and back, the cache blocks
    /// holding `slots` as in host_kv_write.
    #[allow(clippy::too_many_arguments)] // the op's fields
    fn host_rope_kv_write(
        &self,
        q: &mut [f32],
        k: &mut [f32],
        v: &[f32],
        n_heads: usize,
        rope_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        neox: bool,
        slots: &[u32],
        cache: &mut KvLayerMut<'_>,
    ) -> Result<()> {
        let geo = (cache.block_size, cache.n_kv_heads, cache.head_dim);
        let n_cells = validate::kv_write(
            geo,
            cache.ty,
            cache.k.len(),
            cache.v.len(),
            k.len(),
            v.len(),
            slots.len(),
        )?;
        validate::kv_slots(slots, n_cells)?;
        let n = positions.len();
        let (nkv, hd) = (cache.n_kv_heads, cache.head_dim);
        validate::rope(q.len(), n_heads, hd, rope_dim, n, inv_freq.len())?;
        validate::rope(k.len(), nkv, hd, rope_dim, n, inv_freq.len())?;
        if n == 0 {
            return Ok(());
        }
        let mut qd = self.up(q, "rope_kv_write: q")?;
        let mut kd = self.up(k, "rope_kv_write: k")?;
        let vd = self.up(v, "rope_kv_write: v")?;
        let pd = self.up(positions, "rope_kv_write: positions")?;
        let fd = self.up(inv_freq, "rope_kv_write: inv_freq")?;
        self.with_kv_blocks(slots, cache, |sd, dc| {
            self.d_rope_kv_write(
                &mut qd.slice_mut(0..q.len()),
                &mut kd.slice_mut(0..k.len()),
                &vd.slice(0..v.len()),
                n_heads,
                rope_dim,
                &pd.slice(0..n),
                &fd.slice(0..inv_freq.len()),
                neox,
                sd,
                dc,
            )
        })?;
        self.down(&qd, q, "rope_kv_write: q")?;
        self.down(&kd, k, "rope_kv_write: k")
    }

    /// Uploads the cache blocks holding `slots` onto a compact device
    /// cache, runs `f` on it with the slots remapped, and copies the blocks
    /// back (validated slots).
    fn with_kv_blocks(
        &self,
        slots: &[u32],
        cache: &mut KvLayerMut<'_>,
        f: impl FnOnce(&CudaView<'_, u32>, &mut DevKvMut<'_>) -> Result<()>,
    ) -> Result<()> {
        let bs = cache.block_size;
        let block_elems = bs * cache.n_kv_heads * cache.head_dim;
        let mut blocks = BlockRemap::default();
        let local: Vec<u32> = slots
            .iter()
            .map(|&s| blocks.local(s / bs as u32) * bs as u32 + s % bs as u32)
            .collect();
        let order = blocks.order;
        let (kb, vb) = gather_blocks(cache.k, cache.v, &order, block_elems);
        let (mut kd, mut vd) = (
            self.up(&kb, "kv_write: k blocks")?,
            self.up(&vb, "kv_write: v blocks")?,
        );
        let sd = self.up(&local, "kv_write: slots")?;
        f(
            &sd.slice(0..local.len()),
            &mut DevKvMut {
                k: kd.slice_mut(0..kb.len()),
                v: vd.slice_mut(0..vb.len()),
                block_size: bs,
                n_kv_heads: cache.n_kv_heads,
                head_dim: cache.head_dim,
            },
        )?;
        let (mut kh, mut vh) = (vec![0u16; kb.len()], vec![0u16; vb.len()]);
        self.down(&kd, &mut kh, "kv_write: k blocks")?;
        self.down(&vd, &mut vh, "kv_write: v blocks")?;
        self.sync("kv_write")?;
        let (kh, vh): (&[half::f16], &[half::f16]) = (kh.reinterpret_cast(), vh.reinterpret_cast());
        for (i, &b) in order.iter().enumerate() {
            let (src, dst) = (i * block_elems, b as usize * block_elems);
            cache.k[dst..dst + block_elems].copy_from_slice(&kh[src..src + block_elems]);
            cache.v[dst..dst + block_elems].copy_from_slice(&vh[src..src + block_elems]);
        }
        Ok(())
    }

    /// Uploads the blocks the tables reference and runs the paged kernel on
    /// them through remapped tables.
    #[allow(clippy::too_many_arguments)] // the op's fields and the mode
    fn host_attention(
        &self,
        q: &[f32],
        n_heads: usize,
        scale: f32,
        cache: KvLayer<'_>,
        batch: AttnBatch<'_>,
        opts: AttnOpts<&[f32]>,
        out: &mut [f32],
        mode: Mode,
    ) -> Result<()> {
        let (bs, nkv, hd) = (cache.block_size, cache.n_kv_heads, cache.head_dim);
        let need = validate::host_attention(q.len(), n_heads, &cache, &batch, &opts, out.len())?;
        if batch.positions.is_empty() {
            return Ok(());
        }
        let mut blocks = BlockRemap::default();
        let tables: Vec<Vec<u32>> = need
            .iter()
            .enumerate()
            .map(|(s, &nb)| {
                batch.block_tables[s][..nb]
                    .iter()
                    .map(|&b| blocks.local(b))
                    .collect()
            })
            .collect();
        let order = blocks.order;
        let table_refs: Vec<&[u32]> = tables.iter().map(|t| &t[..]).collect();
        let local = AttnBatch {
            block_tables: &table_refs,
            row_seq: batch.row_seq,
            positions: batch.positions,
        };
        let block_elems = bs * nkv * hd;
        let (kb, vb) = gather_blocks(cache.k, cache.v, &order, block_elems);
        let db = DevAttnBatch::upload(self, &local, bs, order.len())?;
        let (kd, vd) = (
            self.up(&kb, "paged_attention: k blocks")?,
            self.up(&vb, "paged_attention: v blocks")?,
        );
        let qd = self.up(q, "paged_attention: q")?;
        let alibi = opts
            .alibi
            .map(|a| self.up(a, "paged_attention: alibi"))
            .transpose()?;
        let sinks = opts
            .sinks
            .map(|a| self.up(a, "paged_attention: sinks"))
            .transpose()?;
        let dopts = AttnOpts {
            window: opts.window,
            softcap: opts.softcap,
            alibi: alibi.as_ref().map(|a| a.slice(0..n_heads)),
            sinks: sinks.as_ref().map(|a| a.slice(0..n_heads)),
        };
        let mut od = self.scratch::<f32>(out.len(), "paged_attention: out")?;
        self.d_attention(
            &qd.slice(0..q.len()),
            n_heads,
            scale,
            &DevKv {
                k: kd.slice(0..kb.len()),
                v: vd.slice(0..vb.len()),
                block_size: bs,
                n_kv_heads: nkv,
                head_dim: hd,
            },
            &db,
            &dopts,
            &mut od.slice_mut(0..out.len()),
            mode,
        )?;
        self.down(&od, out, "paged_attention: out")
    }
}

/// Physical block ids renumbered 0, 1, ... in order of first use, so only
/// the blocks an op touches are uploaded.
#[derive(Default)]
struct BlockRemap {
    index: HashMap<u32, u32>,
    /// Physical id of each local block.
    order: Vec<u32>,
}

impl BlockRemap {
    fn local(&mut self, b: u32) -> u32 {
        let order = &mut self.order;
        *self.index.entry(b).or_insert_with(|| {
            order.push(b);
            (order.len() - 1) as u32
        })
    }
}

/// The f16 bits of blocks `order` of k and v, concatenated.
fn gather_blocks(
    k: &[half::f16],
    v: &[half::f16],
    order: &[u32],
    block_elems: usize,
) -> (Vec<u16>, Vec<u16>) {
    let (kb, vb): (&[u16], &[u16]) = (k.reinterpret_cast(), v.reinterpret_cast());
    let mut kc = Vec::with_capacity(order.len() * block_elems);
    let mut vc = Vec::with_capacity(order.len() * block_elems);
    for &b in order {
        let o = b as usize * block_elems;
        kc.extend_from_slice(&kb[o..o + block_elems]);
        vc.extend_from_slice(&vb[o..o + block_elems]);
    }
    (kc, vc)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn supports_op(&self, op: &Op<'_>, mode: Mode) -> bool {
        supports(self, &op.info(), mode)
    }

    fn run(&self, mut op: Op<'_>, mode: Mode) -> Result<()> {
        let kind = op.kind();
        if let Err(why) = self.capability(&op.info(), mode) {
            bail!("op {kind} cannot run on the cuda backend ({mode:?}): {why}");
        }
        let disabled = self
            .disabled
            .lock()
            .map_err(|_| anyhow!("cuda backend: state lock poisoned"))?
            .clone();
        if let Some(why) = disabled {
            return match &self.fallback {
                Some(cpu) => cpu.run(op, mode),
                None => bail!("op {kind}: cuda backend disabled: {why}"),
            };
        }
        let res = enter(self).and_then(|_g| self.run_host(&mut op, mode));
        match res {
            Ok(()) => Ok(()),
            Err(e) => {
                // Device failures (not bad input) disable the backend in auto.
                let device_err = format!("{e:#}").contains("CUDA driver error");
                match (&self.fallback, device_err) {
                    (Some(cpu), true) => {
                        let why = format!("{e:#}");
                        tracing::warn!(
                            "cuda backend failed on op {kind}: {why}; running this and every later op on the cpu"
                        );
                        eprintln!("warning: cuda backend failed on op {kind}: {why}; falling back to the cpu");
                        if let Ok(mut d) = self.disabled.lock() {
                            *d = Some(why);
                        }
                        cpu.run(op, mode)
                            .with_context(|| format!("op {kind}: cpu fallback after a cuda error"))
                    }
                    _ => Err(e.context(format!("op {kind} on cuda"))),
                }
            }
        }
    }
}
