//! Every layer of a one-row `fast` decode step in one launch of one
//! thread-block cluster (kernels/decode_layers_fast.cu): the plan (which
//! models and steps it takes, its shared-memory layout, each matrix's row
//! granularity) and the launch.

use super::{dev_ptr, dev_ptr_mut, RawArgs};
use crate::backend::cuda::mem::DevAttnBatch;
use crate::backend::cuda::CudaBackend;
use crate::quant::GgmlType;
use anyhow::{bail, Result};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig};

/// The kernel's entries: Q4_0 weights, head_dim 64 (the form checked on
/// a device; the kernel body also takes the other 32-value block types
/// and head_dim 128, not yet checked).
pub const DL_ENTRIES: [&str; 1] = ["decode_layers_q4_0_h64"];

/// Consumer warps per CTA (the kernel's DL_NW); one more warp produces.
const DL_NW: usize = 16;
pub(crate) const DL_THREADS: usize = (DL_NW + 1) * 32;
/// Bytes of one ring slot (DL_SLOT) and the most slots (DL_MAX_SLOTS).
const DL_SLOT: usize = 16384;
const DL_MAX_SLOTS: usize = 16;
/// Shared bytes before the work area: mbarriers, counter, reduction words
/// and the gate rows of a chunk (decode_layers_body's layout).
const DL_HEAD: usize = 2 * DL_MAX_SLOTS * 8 + 16 + 32 * 4 + 512 * 4;
/// Dynamic shared memory the kernel is allowed (an H100 CTA's 227 KiB).
pub(crate) const DL_SMEM: usize = 227 * 1024;
/// The most layers the kernel's parameter block holds (DL_MAX_LAYERS).
pub const DL_MAX_LAYERS: usize = 96;
/// The cluster sizes tried, largest first: one CTA per SM, so the
/// cluster's SMs stream the weights.
pub(crate) const DL_CLUSTERS: [usize; 2] = [16, 8];

/// The kernel's DlShape, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct DlShape {
    n_layers: i32,
    dim: i32,
    n_heads: i32,
    n_kv: i32,
    hd: i32,
    ffn: i32,
    rope_dim: i32,
    neox: i32,
    block_size: i32,
    n_slots: i32,
    csize: i32,
    g_qkv: i32,
    g_o: i32,
    g_gu: i32,
    g_down: i32,
    eps: f32,
    scale: f32,
    n_cells: i64,
    work_bytes: i32,
}

impl DlShape {
    /// The C struct's bytes: 15 ints, 2 floats, 4 bytes of padding, the
    /// long long, the int, 4 bytes of padding (88, 8-byte aligned).
    fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(88 + DL_MAX_LAYERS * 88);
        for v in [
            self.n_layers,
            self.dim,
            self.n_heads,
            self.n_kv,
            self.hd,
            self.ffn,
            self.rope_dim,
            self.neox,
            self.block_size,
            self.n_slots,
            self.csize,
            self.g_qkv,
            self.g_o,
            self.g_gu,
            self.g_down,
        ] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&self.eps.to_ne_bytes());
        b.extend_from_slice(&self.scale.to_ne_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b.extend_from_slice(&self.n_cells.to_ne_bytes());
        b.extend_from_slice(&self.work_bytes.to_ne_bytes());
        b.extend_from_slice(&[0u8; 4]);
        b
    }
}

/// One layer's device addresses, in DlLayer's order: wq, wk, wv, wo,
/// w_gate, w_up, w_down, attn_norm, ffn_norm, K cache, V cache.
pub struct DlLayerPtrs(pub [u64; 11]);

/// A model's shape as the fused step needs it.
#[derive(Clone, Copy, Debug)]
pub struct DlModel {
    pub ty: GgmlType,
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub rope_dim: usize,
    pub neox: bool,
    pub eps: f32,
}

/// What the fused step was planned with: entry, shape (with the cluster
/// size), shared bytes.
pub struct DlPlan {
    name: &'static str,
    shape: DlShape,
    smem: usize,
    /// f32 scratch the step needs: q, k, v, act and the attention partials.
    pub scratch_len: usize,
}

fn entry(ty: GgmlType, hd: usize) -> Option<&'static str> {
    match (ty, hd) {
        (GgmlType::Q4_0, 64) => Some(DL_ENTRIES[0]),
        _ => None,
    }
}

/// The fewest rows whose bytes are a multiple of 16 (every bulk copy
/// starts and ends 16-byte aligned).
fn granularity(rb: usize) -> usize {
    (1..=16).find(|g| (g * rb).is_multiple_of(16)).unwrap_or(16)
}

/// The plan of entry `name` in clusters of `csize` CTAs for model `m`
/// (the device-independent part of `dl_plan`).
fn plan_for(
    m: &DlModel,
    name: &'static str,
    csize: usize,
    block_size: usize,
    n_cells: usize,
) -> std::result::Result<DlPlan, String> {
    if m.n_layers == 0 || m.n_layers > DL_MAX_LAYERS {
        return Err(format!("{} layers", m.n_layers));
    }
    let hd = m.head_dim;
    let (qd, kvd) = (m.n_heads * hd, m.n_kv * hd);
    if m.n_kv == 0 || !m.n_heads.is_multiple_of(m.n_kv) || m.n_heads / m.n_kv > 8 {
        return Err(format!("{} heads over {} KV heads", m.n_heads, m.n_kv));
    }
    if !m.rope_dim.is_multiple_of(2) || m.rope_dim > hd {
        return Err(format!("rope_dim {}", m.rope_dim));
    }
    for k in [m.dim, qd, m.ffn] {
        if !k.is_multiple_of(32) || k == 0 {
            return Err(format!("a row of {k} values"));
        }
    }
    let rb = |k: usize| {
        m.ty.row_bytes(k)
            .map_err(|e| format!("{:?} rows of {k}: {e}", m.ty))
    };
    let (rb_d, rb_q, rb_f) = (rb(m.dim)?, rb(qd)?, rb(m.ffn)?);
    let (g_d, g_q, g_f) = (granularity(rb_d), granularity(rb_q), granularity(rb_f));
    for (rows, g, rbytes) in [
        (qd, g_d, rb_d),
        (kvd, g_d, rb_d),
        (m.dim, g_q, rb_q),
        (m.ffn, g_d, rb_d),
        (m.dim, g_f, rb_f),
    ] {
        if !rows.is_multiple_of(g) || g * rbytes > DL_SLOT {
            return Err(format!("{rows} rows of {rbytes} bytes in groups of {g}"));
        }
    }
    if DL_SLOT / rb_d > 512 {
        return Err(format!("rows of {} values are too short", m.dim));
    }
    let g = m.n_heads / m.n_kv;
    let kmax = m.dim.max(qd).max(m.ffn);
    let act_bytes = kmax.next_multiple_of(16) + kmax / 32 * 8;
    let att_bytes = (g * hd + hd + DL_NW * g * (hd + 2)) * 4;
    // The ring starts 128-byte aligned (bulk copies into shared memory
    // that is only 16-byte aligned measured several times slower).
    let work = (DL_HEAD + act_bytes.max(att_bytes)).next_multiple_of(128) - DL_HEAD;
    let room = DL_SMEM.saturating_sub(DL_HEAD + work + 16);
    let n_slots = (room / DL_SLOT).min(DL_MAX_SLOTS);
    if n_slots < 4 {
        return Err(format!(
            "{work} bytes of work area leave {n_slots} ring slots"
        ));
    }
    let splits = (csize / m.n_kv).max(1);
    let shape = DlShape {
        n_layers: m.n_layers as i32,
        dim: m.dim as i32,
        n_heads: m.n_heads as i32,
        n_kv: m.n_kv as i32,
        hd: hd as i32,
        ffn: m.ffn as i32,
        rope_dim: m.rope_dim as i32,
        neox: i32::from(m.neox),
        block_size: block_size as i32,
        n_slots: n_slots as i32,
        csize: csize as i32,
        g_qkv: g_d as i32,
        g_o: g_q as i32,
        g_gu: g_d as i32,
        g_down: g_f as i32,
        eps: m.eps,
        scale: 1.0 / (hd as f32).sqrt(),
        n_cells: n_cells as i64,
        work_bytes: work as i32,
    };
    Ok(DlPlan {
        name,
        shape,
        smem: DL_HEAD + work + n_slots * DL_SLOT + 16,
        scratch_len: qd + 2 * kvd + m.ffn + m.n_heads * splits * (hd + 2),
    })
}

impl CudaBackend {
    /// The fused step's plan for model `m` with a KV cache of `n_cells`
    /// cells in pages of `block_size`, or why it does not apply (the caller
    /// then runs the layers op by op; it checks `fused_layers` first).
    pub(crate) fn dl_plan(
        &self,
        m: &DlModel,
        block_size: usize,
        n_cells: usize,
    ) -> std::result::Result<DlPlan, String> {
        let name = entry(m.ty, m.head_dim)
            .ok_or_else(|| format!("type {:?} / head_dim {}", m.ty, m.head_dim))?;
        if self.func(name).is_err() {
            return Err(format!("{name} not loaded"));
        }
        let csize = DL_CLUSTERS
            .into_iter()
            .find(|&c| self.att_clusters(name, c) > 0)
            .ok_or_else(|| "no cluster of 8 or 16 CTAs fits".to_string())?;
        plan_for(m, name, csize, block_size, n_cells)
    }

    /// Runs every layer of a one-row decode step: x (dim,) in place, the
    /// row's K/V written into each layer's cache. `layers` holds one entry
    /// per layer (DlLayerPtrs: weights of the plan's type and the model's
    /// shape, caches of the plan's cells); `batch` is a one-row batch;
    /// `slots` its one cell; `inv_freq` (rope_dim / 2,).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode_layers(
        &self,
        plan: &DlPlan,
        layers: &[DlLayerPtrs],
        x: &mut CudaViewMut<'_, f32>,
        scratch: &mut CudaViewMut<'_, f32>,
        batch: &DevAttnBatch,
        slots: &CudaView<'_, u32>,
        inv_freq: &CudaView<'_, f32>,
    ) -> Result<()> {
        let sh = &plan.shape;
        if layers.len() != sh.n_layers as usize {
            bail!(
                "decode_layers: {} layer pointer sets for {} layers",
                layers.len(),
                sh.n_layers
            );
        }
        if batch.n_rows != 1 || slots.len() != 1 {
            bail!("decode_layers: a batch of {} rows", batch.n_rows);
        }
        if x.len() != sh.dim as usize || scratch.len() < plan.scratch_len {
            bail!(
                "decode_layers: x of {} (dim {}), scratch of {} (needs {})",
                x.len(),
                sh.dim,
                scratch.len(),
                plan.scratch_len
            );
        }
        // The parameter block: DlShape, then DL_MAX_LAYERS DlLayer.
        let mut blob = sh.to_bytes();
        for i in 0..DL_MAX_LAYERS {
            let p = layers.get(i).map_or([0u64; 11], |l| l.0);
            for v in p {
                blob.extend_from_slice(&v.to_ne_bytes());
            }
        }
        let s = self.stream();
        let mut a = RawArgs::new()
            .bytes(&blob)
            .ptr(dev_ptr_mut(x, s))
            .ptr(dev_ptr_mut(scratch, s))
            .ptr(dev_ptr(&batch.tables.slice(..), s))
            .ptr(dev_ptr(&batch.table_off.slice(..), s))
            .ptr(dev_ptr(&batch.row_seq.slice(..), s))
            .ptr(dev_ptr(&batch.positions.slice(..), s))
            .ptr(dev_ptr(slots, s))
            .ptr(dev_ptr(inv_freq, s));
        let cs = u32::try_from(sh.csize)?;
        let cfg = LaunchConfig {
            grid_dim: (1, cs, 1),
            block_dim: (DL_THREADS as u32, 1, 1),
            shared_mem_bytes: u32::try_from(plan.smem)?,
        };
        // SAFETY: the kernel takes (DlParams by value, x, scratch, tables,
        // table_off, row_seq, positions, slots, inv_freq) in this order;
        // dl_plan checked the shapes the kernel relies on (row groups,
        // slot sizes, work area) and the cluster size fits the device
        // (att_clusters > 0, counted at load after the opt-in); the
        // pointers are live device buffers of the sizes checked above and
        // in DevAttnBatch::upload (one row, its table and position).
        unsafe { self.launch_clustered(plan.name, cfg, (1, cs, 1), &mut a.params()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granularity_makes_16_byte_runs() {
        // SmolLM2's dim 576 in Q4_0: 324-byte rows, groups of 4.
        assert_eq!(granularity(GgmlType::Q4_0.row_bytes(576).unwrap()), 4);
        assert_eq!(granularity(GgmlType::Q4_0.row_bytes(2048).unwrap()), 1);
        assert_eq!(granularity(GgmlType::Q4_1.row_bytes(576).unwrap()), 2);
        assert_eq!(granularity(GgmlType::Q8_0.row_bytes(576).unwrap()), 4);
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            for k in (32..4096).step_by(32) {
                let rb = ty.row_bytes(k).unwrap();
                assert_eq!((granularity(rb) * rb) % 16, 0, "{ty:?} k {k}");
            }
        }
    }

    fn model(ty: GgmlType, dim: usize, heads: usize, kv: usize, hd: usize, ffn: usize) -> DlModel {
        DlModel {
            ty,
            n_layers: 30,
            dim,
            n_heads: heads,
            n_kv: kv,
            head_dim: hd,
            ffn,
            rope_dim: hd,
            neox: false,
            eps: 1e-5,
        }
    }

    #[test]
    fn plans_of_the_issue_shapes() {
        // SmolLM2-135M: 9 heads over 3 KV heads, 5 splits of 16 CTAs.
        let s = model(GgmlType::Q4_0, 576, 9, 3, 64, 1536);
        let p = plan_for(&s, DL_ENTRIES[0], 16, 16, 4096).unwrap();
        assert_eq!((p.shape.g_qkv, p.shape.g_o, p.shape.g_down), (4, 4, 1));
        assert_eq!(p.scratch_len, 576 + 2 * 192 + 1536 + 9 * 5 * 66);
        // The ring starts 128-byte aligned and everything fits.
        assert_eq!((DL_HEAD + p.shape.work_bytes as usize) % 128, 0);
        assert!(p.smem <= DL_SMEM);
        assert_eq!(
            p.smem,
            DL_HEAD + p.shape.work_bytes as usize + p.shape.n_slots as usize * DL_SLOT + 16
        );
        assert!(p.shape.n_slots >= 12);
        // Llama-3.2-1B and the 8B (head_dim 64 / 128, 4 heads per KV head).
        let b1 = model(GgmlType::Q4_0, 2048, 32, 8, 64, 8192);
        assert!(plan_for(&b1, DL_ENTRIES[0], 16, 16, 4096).is_ok());
        let b8 = model(GgmlType::Q8_0, 4096, 32, 8, 128, 14336);
        let p8 = plan_for(&b8, "x", 8, 16, 4096).unwrap();
        assert!(p8.smem <= DL_SMEM && p8.shape.n_slots >= 4);
    }

    #[test]
    fn plans_refuse_what_the_kernel_cannot_run() {
        let ok = model(GgmlType::Q4_0, 576, 9, 3, 64, 1536);
        // More than 8 query heads per KV head, uneven groups, odd rope.
        assert!(plan_for(
            &model(GgmlType::Q4_0, 576, 18, 1, 64, 1536),
            "x",
            16,
            16,
            64
        )
        .is_err());
        assert!(plan_for(&model(GgmlType::Q4_0, 576, 9, 2, 64, 1536), "x", 16, 16, 64).is_err());
        let odd = DlModel { rope_dim: 63, ..ok };
        assert!(plan_for(&odd, "x", 16, 16, 64).is_err());
        let many = DlModel {
            n_layers: DL_MAX_LAYERS + 1,
            ..ok
        };
        assert!(plan_for(&many, "x", 16, 16, 64).is_err());
        // Rows too short for the gate buffer of a slot.
        assert!(plan_for(&model(GgmlType::Q4_0, 32, 1, 1, 32, 256), "x", 16, 16, 64).is_err());
        assert!(entry(GgmlType::Q4_K, 64).is_none());
        assert!(entry(GgmlType::Q4_0, 96).is_none());
        // Forms not yet checked on a device are not taken.
        assert!(entry(GgmlType::Q4_1, 64).is_none());
        assert!(entry(GgmlType::Q4_0, 128).is_none());
    }

    #[test]
    fn shape_block_matches_the_kernel_struct() {
        // 15 ints, 2 floats, pad, a long long, an int, pad: 88 bytes,
        // the long long at 72 (the C layout of DlShape).
        assert_eq!(std::mem::size_of::<DlShape>(), 88);
        let s = DlShape {
            n_cells: 0x0102_0304_0506_0708,
            work_bytes: 7,
            ..Default::default()
        };
        let b = s.to_bytes();
        assert_eq!(b.len(), 88);
        assert_eq!(&b[72..80], &0x0102_0304_0506_0708i64.to_ne_bytes());
        assert_eq!(&b[80..84], &7i32.to_ne_bytes());
    }
}
