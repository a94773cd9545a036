//! The reference CPU backend: deterministic, batch-invariant, multi-threaded.
//!
//! Threads only ever split output rows/columns; every reduction follows the
//! canonical arithmetic in [`canon`], identically on the AVX2 and portable
//! paths, so results are bitwise equal for any thread count, any batch
//! composition and any instruction set.

pub mod canon;
pub mod ops;
pub mod pool;
pub mod simd;

use crate::backend::tp::Communicator;
use crate::backend::{Backend, MatNorm, Mode, Op};
use anyhow::{Context, Result};
pub use simd::Isa;
use std::sync::Arc;

/// The `cpu` backend. Owns its worker pool; parallel ops run on it.
pub struct CpuBackend {
    pool: pool::Pool,
    n_threads: usize,
    isa: Isa,
    par_min_work: usize,
    /// A tensor-parallel rank's link to the others (`backend::tp`): the collectives
    /// run through it. None: a backend of its own, without collectives.
    comm: Option<Arc<dyn Communicator>>,
}

impl CpuBackend {
    /// `n_threads`: `None` = all available cores.
    pub fn new(n_threads: Option<usize>) -> Result<Self> {
        Self::with_options(n_threads, false)
    }

    /// Like [`CpuBackend::new`]; `force_portable` disables the SIMD kernels
    /// (results are bitwise identical either way; used by tests).
    pub fn with_options(n_threads: Option<usize>, force_portable: bool) -> Result<Self> {
        let n = match n_threads {
            Some(0) => anyhow::bail!("cpu backend: n_threads must be >= 1, got 0"),
            Some(n) => n,
            None => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        };
        let pool = pool::Pool::new(n)
            .with_context(|| format!("cpu backend: building a thread pool of {n} threads"))?;
        Ok(CpuBackend {
            pool,
            n_threads: n,
            isa: Isa::detect(force_portable),
            par_min_work: PAR_MIN_WORK,
            comm: None,
        })
    }

    /// This backend as one rank of a tensor-parallel group: it runs the
    /// collectives through `comm`.
    pub fn with_comm(mut self, comm: Arc<dyn Communicator>) -> Self {
        self.comm = Some(comm);
        self
    }

    /// Sets the operation count below which an op runs serially on the
    /// calling thread (default 65536; 0 = always use the pool). Results are
    /// identical either way; tests use 0 to exercise the parallel paths.
    pub fn with_par_min_work(mut self, work: usize) -> Self {
        self.par_min_work = work;
        self
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    fn comm(&self) -> Result<&dyn Communicator> {
        self.comm
            .as_deref()
            .context("cpu backend: a tensor-parallel collective on a backend that is no rank")
    }

    /// The instruction set the kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn supports_op(&self, op: &Op<'_>, _mode: Mode) -> bool {
        // Every op, every mode: the cpu backend is the reference.
        match op {
            Op::MatMul { .. }
            | Op::MatMuls { .. }
            | Op::RmsNorm { .. }
            | Op::Rope { .. }
            | Op::RopeKvWrite { .. }
            | Op::SwiGlu { .. }
            | Op::GetRows { .. }
            | Op::SelectRows { .. }
            | Op::Add { .. }
            | Op::AddBias { .. }
            | Op::KvWrite { .. }
            | Op::PagedAttention { .. }
            | Op::Conv1dSilu { .. }
            | Op::L2NormHeads { .. }
            | Op::GdnGates { .. }
            | Op::DeltaRule { .. }
            | Op::GatedRmsNorm { .. }
            | Op::SplitHeads { .. }
            | Op::SigmoidMul { .. } => true,
            Op::AllGather { .. } | Op::AllReduce { .. } => self.comm.is_some(),
        }
    }

    fn run(&self, op: Op<'_>, _mode: Mode) -> Result<()> {
        // The cpu kernels are already exact (hence deterministic); every mode
        // runs the same code. Small ops run serially on the calling thread:
        // handing them to the pool costs more than they do, and no result
        // depends on which thread computes it.
        let par = if self.n_threads > 1 && work(&op) >= self.par_min_work {
            pool::Par::pool(&self.pool)
        } else {
            pool::Par::SERIAL
        };
        let isa = self.isa;
        let nt = self.n_threads;
        match op {
            Op::MatMul { w, x, n, out } => ops::matmul::run(par, isa, nt, w, x, n, out),
            Op::MatMuls {
                x,
                n,
                mut jobs,
                norm,
                // A hint for backends that prepare the next op's input.
                next_norm: _,
                glu,
            } => {
                // A bad SwiGlu fails before any output is written.
                if let Some(h) = &glu {
                    let lens: Vec<(usize, bool)> =
                        jobs.iter().map(|j| (j.out.len(), j.add)).collect();
                    crate::backend::validate::mat_muls_glu(&lens, h.len())?;
                }
                match norm {
                    None => ops::matmul::run_jobs(par, isa, nt, x, n, &mut jobs)?,
                    Some(MatNorm { w, eps, out }) => {
                        // RmsNorm then MatMuls: the op's defined bits
                        // (rms_norm validates the norm's shapes with dim = k).
                        let k = jobs.first().map_or(0, |j| j.w.cols);
                        ops::rms_norm::run(par, isa, x, w, k, eps, &mut *out)
                            .context("mat_muls norm")?;
                        ops::matmul::run_jobs(par, isa, nt, out, n, &mut jobs)?
                    }
                }
                // Then SwiGlu: the op's defined bits.
                if let Some(h) = glu {
                    ops::swiglu::run(par, isa, &*jobs[0].out, &*jobs[1].out, h)
                        .context("mat_muls glu")?;
                }
                Ok(())
            }
            Op::RmsNorm {
                x,
                w,
                dim,
                eps,
                out,
            } => ops::rms_norm::run(par, isa, x, w, dim, eps, out),
            Op::Rope {
                x,
                n_heads,
                head_dim,
                rope_dim,
                positions,
                inv_freq,
                neox,
            } => ops::rope::run(
                par, x, n_heads, head_dim, rope_dim, positions, inv_freq, neox,
            ),
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
            } => {
                let (nkv, hd) = (cache.n_kv_heads, cache.head_dim);
                ops::rope::run(par, q, n_heads, hd, rope_dim, positions, inv_freq, neox)?;
                ops::rope::run(par, k, nkv, hd, rope_dim, positions, inv_freq, neox)?;
                ops::kv_write::run(k, v, slots, cache)
            }
            Op::SwiGlu { gate, up, out } => ops::swiglu::run(par, isa, gate, up, out),
            Op::GetRows { table, ids, out } => ops::get_rows::run(par, table, ids, out),
            Op::SelectRows { x, dim, rows, out } => ops::select_rows::run(x, dim, rows, out),
            Op::Add { x, y } => ops::add::add(par, x, y),
            Op::AddBias { x, bias } => ops::add::add_bias(par, x, bias),
            Op::KvWrite { k, v, slots, cache } => ops::kv_write::run(k, v, slots, cache),
            Op::PagedAttention {
                q,
                n_heads,
                scale,
                cache,
                batch,
                opts,
                out,
            } => ops::attention::run(par, isa, q, n_heads, scale, cache, batch, opts, out),
            Op::Conv1dSilu {
                x,
                w,
                channels,
                kernel,
                row_slots,
                state,
                out,
            } => ops::hybrid::conv1d_silu(x, w, channels, kernel, row_slots, state, out),
            Op::L2NormHeads {
                x,
                row_len,
                n_heads,
                head_dim,
                eps,
            } => ops::hybrid::l2_norm_heads(x, row_len, n_heads, head_dim, eps),
            Op::GdnGates {
                a,
                b,
                dt_bias,
                ssm_a,
                g,
                beta,
            } => ops::gdn::gdn_gates(a, b, dt_bias, ssm_a, g, beta),
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
            } => ops::hybrid::delta_rule(
                qkv,
                g,
                beta,
                ops::gdn::DeltaShape { h_k, h_v, d_k, d_v },
                row_slots,
                state,
                out,
            ),
            Op::GatedRmsNorm {
                x,
                z,
                w,
                head_dim,
                eps,
                out,
            } => ops::gdn::gated_rms_norm(x, z, w, head_dim, eps, out),
            Op::SplitHeads { x, head_dim, a, b } => ops::hybrid::split_heads(x, head_dim, a, b),
            Op::SigmoidMul { x, gate } => ops::hybrid::sigmoid_mul(x, gate),
            Op::AllGather { x, n, out, add } => {
                ops::collective::all_gather(self.comm()?, x, n, out, add)
            }
            Op::AllReduce { x, out, order } => {
                ops::collective::all_reduce(self.comm()?, x, out, order)
            }
        }
    }
}

/// Below this many (multiply-add-equivalent) operations an op runs on the
/// calling thread: a pool hand-off costs several microseconds.
const PAR_MIN_WORK: usize = 1 << 16;

/// Rough operation count of an op (only used to choose serial vs parallel,
/// which never changes results).
fn work(op: &Op<'_>) -> usize {
    match op {
        Op::MatMul { w, n, .. } => w.rows.saturating_mul(w.cols).saturating_mul(*n),
        Op::MatMuls { jobs, n, x, .. } => jobs
            .iter()
            .map(|j| j.w.rows.saturating_mul(j.w.cols).saturating_mul(*n))
            .sum::<usize>()
            .saturating_add(x.len() * 2),
        Op::RmsNorm { x, .. } => x.len() * 2,
        Op::Rope { x, .. } => x.len() * 4,
        Op::RopeKvWrite { q, k, .. } => (q.len() + k.len()) * 4,
        Op::SwiGlu { out, .. } => out.len() * 16,
        Op::GetRows { out, .. } => out.len() * 2,
        Op::SelectRows { .. } => 0,
        Op::Add { x, .. } => x.len() / 4,
        Op::AddBias { x, .. } => x.len() / 4,
        Op::KvWrite { .. } => 0,
        Op::PagedAttention { q, batch, .. } => {
            let ctx: usize = batch.positions.iter().map(|&p| p as usize + 1).sum();
            let rows = batch.positions.len().max(1);
            // q.len() / rows = n_heads * head_dim per row; x2 for QK and PV.
            (q.len() / rows).saturating_mul(ctx).saturating_mul(2)
        }
        // Serial by construction (state carried row by row).
        Op::Conv1dSilu { .. }
        | Op::L2NormHeads { .. }
        | Op::GdnGates { .. }
        | Op::DeltaRule { .. }
        | Op::GatedRmsNorm { .. }
        | Op::SplitHeads { .. }
        | Op::SigmoidMul { .. } => 0,
        // The communicator's own work.
        Op::AllGather { .. } | Op::AllReduce { .. } => 0,
    }
}

/// A raw pointer that may be shared across the pool's threads. Users must
/// guarantee that concurrent tasks write disjoint elements and that the
/// pointee outlives the parallel section.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);

impl SendPtr {
    /// The pointer. A method (not field access) so closures capture the
    /// whole `SendPtr`, which is `Send`, rather than the raw field.
    #[inline]
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: SendPtr is only used to write disjoint elements from tasks that
// all finish before the owning borrow ends (see each use).
unsafe impl Send for SendPtr {}
// SAFETY: as above; no two threads touch the same element.
unsafe impl Sync for SendPtr {}
