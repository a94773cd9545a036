//! Decode fusions that need the op after a launch (matmul_fused_fast.cu):
//!
//! - the one-row q/k/v matvec and the RopeKvWrite after it become
//!   `mv_q8_r1_rope`;
//! - a SwiGlu and the one-row matmul of its output become
//!   `mv_q8_r1{,_w2}_swiglu` (FFN rows of at most QUIRE_FUSE_SWIGLU_MAX
//!   values, default 8,192: every CTA quantizes the whole row).
//!
//! The first op of a pair is not launched but kept as a [`Pending`] launch
//! (raw device addresses: the graph's buffers outlive the next op). The
//! next op either takes it (the fused kernel) or, like every other op,
//! first launches it as it would have run alone. Only device-space runs
//! defer (the host path downloads after each op); the stream order and the
//! bits are those of the unfused ops. On with the other device fusions
//! (QUIRE_PREQUANT), in `fast` and `deterministic`; QUIRE_FUSE_ROPE=0 /
//! QUIRE_FUSE_SWIGLU_MAX=0 turn one off; QUIRE_PROFILE_OPS (per-op times)
//! turns both off.

use super::act_cache::ActKey;
use super::matmul::{MmDims, MmJobs};
use super::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::mem::DevKvMut;
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::Mode;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};
use std::sync::OnceLock;

/// A launch held for the op after it.
pub(crate) enum Pending {
    Qkv(QkvLaunch),
    SwiGlu(SwiGluLaunch),
}

/// mv_q8_r1 over the q, k, v jobs (no job adds), activations already
/// quantized at (xq, xds); `key` / `outs` for the activation cache.
pub(crate) struct QkvLaunch {
    pub(super) table: MmJobs,
    pub(super) ki: i32,
    pub(super) rb: i64,
    pub(super) tc: i32,
    pub(super) cfg: LaunchConfig,
    pub(super) xq: u64,
    pub(super) xds: u64,
    pub(super) key: ActKey,
    pub(super) outs: Vec<(u64, usize)>,
}

/// swiglu of `len` values: out = silu(gate) * up.
pub(crate) struct SwiGluLaunch {
    gate: u64,
    up: u64,
    out: u64,
    len: usize,
}

/// The rope half of RopeKvWrite, as mv_q8_r1_rope takes it.
pub(crate) struct RopeArgs<'a, 'b> {
    pub n_heads: usize,
    pub rope_dim: usize,
    pub neox: bool,
    pub positions: &'a CudaView<'b, u32>,
    pub inv_freq: &'a CudaView<'b, f32>,
    pub slots: &'a CudaView<'b, u32>,
    pub n_cells: usize,
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}

/// QUIRE_FUSE_TRIGGER (experiment): when the fused kernels let their
/// dependents be scheduled: 0 at the start, 1 after the row loop (rope) /
/// the prologue (swiglu), 2 at exit.
fn trigger() -> i32 {
    static T: OnceLock<i32> = OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("QUIRE_FUSE_TRIGGER")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2)
    })
}

fn profiling() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    *P.get_or_init(|| std::env::var("QUIRE_PROFILE_OPS").is_ok_and(|v| v == "1"))
}

/// QUIRE_FUSE_SWIGLU_MAX: the longest FFN row the swiglu fusion takes.
/// Default 8,192 (SmolLM2's 1,536 and Llama-3.2-1B's 8,192; the 8B's
/// 14,336 would quantize 448 blocks per CTA).
fn swiglu_max() -> usize {
    static M: OnceLock<usize> = OnceLock::new();
    *M.get_or_init(|| {
        std::env::var("QUIRE_FUSE_SWIGLU_MAX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8192)
    })
}

impl CudaBackend {
    /// Whether this op may be held for the next one (device-space runs of
    /// the non-exact modes, fusions on).
    fn may_defer(&self, mode: Mode) -> bool {
        mode != Mode::Exact
            && self.prequant
            && !profiling()
            && self.deferring.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn fuse_rope_on(&self, mode: Mode) -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        self.may_defer(mode) && *ON.get_or_init(|| env_flag("QUIRE_FUSE_ROPE"))
    }

    /// Whether a swiglu of `len` values whose gate came from a one-row
    /// matmul is held for the down matmul.
    pub(super) fn fuse_swiglu_on(&self, mode: Mode, len: usize) -> bool {
        self.may_defer(mode)
            && len.is_multiple_of(32)
            && len <= swiglu_max()
            && self.last_mm_rows.load(std::sync::atomic::Ordering::Relaxed) == 1
    }

    pub(super) fn defer(&self, p: Pending) -> Result<()> {
        let mut g = self
            .pending
            .lock()
            .map_err(|_| anyhow!("cuda backend: pending lock poisoned"))?;
        if g.is_some() {
            // Programmer error: every op takes or flushes the one before.
            return Err(anyhow!("cuda backend: a deferred launch is already pending"));
        }
        *g = Some(p);
        Ok(())
    }

    pub(super) fn take_pending(&self) -> Option<Pending> {
        self.pending.lock().ok().and_then(|mut g| g.take())
    }

    /// Drops a held launch without running it (the step failed).
    pub(crate) fn discard_pending(&self) {
        let _ = self.take_pending();
    }

    /// Launches a held launch as its op alone would have.
    pub(crate) fn flush_pending(&self) -> Result<()> {
        match self.take_pending() {
            None => Ok(()),
            Some(p) => self.launch_unfused(p),
        }
    }

    pub(super) fn launch_unfused(&self, p: Pending) -> Result<()> {
        let s = self.stream();
        match p {
            Pending::Qkv(q) => {
                let mut b = s.launch_builder(self.func("mv_q8_r1")?);
                let ni = 1i32;
                b.arg(&q.table)
                    .arg(&q.ki)
                    .arg(&q.rb)
                    .arg(&q.tc)
                    .arg(&q.xq)
                    .arg(&q.xds)
                    .arg(&ni);
                // SAFETY: as mat_vec_q8's launch of mv_q8_r1, whose
                // validated table, dimensions and arena addresses these are
                // (nothing has run on the stream since).
                drv(unsafe { b.launch(q.cfg) }, "mat_mul: launching mv_q8_r1")?;
                self.act_remember(q.key, &q.outs);
                Ok(())
            }
            Pending::SwiGlu(w) => {
                let len = w.len as i64;
                let mut b = s.launch_builder(self.func("swiglu")?);
                b.arg(&w.gate).arg(&w.up).arg(&len).arg(&w.out);
                // SAFETY: matches swiglu; the three buffers (validated by
                // d_swiglu, still alive: the step's) hold len floats.
                drv(
                    unsafe { b.launch(grid_1d(w.len, 256)?) },
                    "swiglu: launch",
                )?;
                self.forget_activations();
                Ok(())
            }
        }
    }

    /// d_swiglu's deferral: holds the swiglu when the down matmul may take it.
    pub(super) fn defer_swiglu(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<bool> {
        if !self.fuse_swiglu_on(mode, out.len()) {
            return Ok(false);
        }
        let s = self.stream();
        self.defer(Pending::SwiGlu(SwiGluLaunch {
            gate: dev_ptr(gate, s),
            up: dev_ptr(up, s),
            out: dev_ptr_mut(out, s),
            len: out.len(),
        }))?;
        Ok(true)
    }

    /// The down matmul of a held swiglu: `w` is the one job's table, `d`
    /// its dimensions (k = the swiglu's length), `warps` 1 or 2 per row.
    /// Returns the swiglu back when `x` is not its output.
    pub(super) fn take_swiglu(
        &self,
        p: Pending,
        x: &CudaView<'_, f32>,
        fusable: bool,
    ) -> std::result::Result<SwiGluLaunch, Pending> {
        match p {
            Pending::SwiGlu(w)
                if fusable && w.out == dev_ptr(x, self.stream()) && w.len == x.len() =>
            {
                Ok(w)
            }
            p => Err(p),
        }
    }

    pub(super) fn launch_down_swiglu(
        &self,
        w: &SwiGluLaunch,
        table: &MmJobs,
        d: &MmDims,
        ctas: u32,
        warps: usize,
    ) -> Result<()> {
        let name = if warps == 2 {
            "mv_q8_r1_w2_swiglu"
        } else {
            "mv_q8_r1_swiglu"
        };
        let cfg = LaunchConfig {
            grid_dim: (1, ctas, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: u32::try_from(w.len + w.len / 32 * 8)?,
        };
        let tr = trigger();
        let mut b = self.stream().launch_builder(self.func(name)?);
        b.arg(table)
            .arg(&d.ki)
            .arg(&d.rb)
            .arg(&d.tc)
            .arg(&w.gate)
            .arg(&w.up)
            .arg(&w.out)
            .arg(&tr);
        // SAFETY: matches mv_q8_r1{,_w2}_swiglu; the table's one job has
        // m rows of rb bytes and its output m floats (validated), gate, up
        // and act hold k = len floats (len a multiple of 32), and the
        // dynamic shared memory holds k int8 and k / 32 float2.
        drv(unsafe { b.launch(cfg) }, "mat_mul: launching mv_q8_r1_swiglu")?;
        // The arena does not hold act's int8 rows (they stayed on chip).
        self.forget_activations();
        Ok(())
    }

    /// RopeKvWrite's half of the q/k/v fusion: launches mv_q8_r1_rope when
    /// `p` is the matvec of exactly these q, k, v (one row, adjacent-pair
    /// rope, cache rows of the k / v jobs' length); else gives `p` back.
    pub(super) fn take_qkv_rope(
        &self,
        p: Pending,
        (q, k, v): (&CudaViewMut<'_, f32>, &CudaViewMut<'_, f32>, &CudaView<'_, f32>),
        r: &RopeArgs<'_, '_>,
        cache: &mut DevKvMut<'_>,
    ) -> std::result::Result<Result<()>, Pending> {
        let Pending::Qkv(m) = p else { return Err(p) };
        let s = self.stream();
        let hd = cache.head_dim;
        let row = cache.n_kv_heads * hd;
        let t = &m.table;
        let fits = r.positions.len() == 1
            && !r.neox
            && hd.is_multiple_of(2)
            && r.rope_dim.is_multiple_of(2)
            && t.count == 3
            && t.add == 0
            && t.out[0] == dev_ptr_mut(q, s)
            && t.out[1] == dev_ptr_mut(k, s)
            && t.out[2] == dev_ptr(v, s)
            && t.m[0] as usize == q.len()
            && q.len() == r.n_heads * hd
            && t.m[1] as usize == row
            && t.m[2] as usize == row
            && k.len() == row
            && v.len() == row;
        if !fits {
            return Err(Pending::Qkv(m));
        }
        Ok(self.launch_qkv_rope(&m, hd, r, cache))
    }

    fn launch_qkv_rope(
        &self,
        m: &QkvLaunch,
        hd: usize,
        r: &RopeArgs<'_, '_>,
        cache: &mut DevKvMut<'_>,
    ) -> Result<()> {
        let (hdi, rdi) = (i32_of(hd, "head_dim")?, i32_of(r.rope_dim, "rope_dim")?);
        let nc = r.n_cells as i64;
        let tr = trigger();
        let mut b = self.stream().launch_builder(self.func("mv_q8_r1_rope")?);
        b.arg(&m.table)
            .arg(&m.ki)
            .arg(&m.rb)
            .arg(&m.tc)
            .arg(&m.xq)
            .arg(&m.xds)
            .arg(&hdi)
            .arg(&rdi)
            .arg(r.positions)
            .arg(r.inv_freq)
            .arg(r.slots)
            .arg(&nc)
            .arg(&mut cache.k)
            .arg(&mut cache.v)
            .arg(&tr);
        // SAFETY: matches mv_q8_r1_rope; the table, dimensions and arena
        // addresses are mat_vec_q8's for mv_q8_r1 (nothing has run since);
        // q / k / v are its three jobs' outputs (checked by take_qkv_rope),
        // positions and slots hold one value, inv_freq rope_dim / 2
        // (validated by d_rope_kv_write), the cache n_cells rows of the k
        // and v jobs' length; the kernel skips a slot >= n_cells.
        drv(unsafe { b.launch(m.cfg) }, "rope_kv_write: launching mv_q8_r1_rope")?;
        // The activation cache stays empty, as after RopeKvWrite alone.
        Ok(())
    }
}
