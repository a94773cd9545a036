//! The reference CPU backend: deterministic, batch-invariant, multi-threaded.
//!
//! Threads only ever split output rows/columns; every reduction follows the
//! canonical arithmetic in [`canon`], identically on the AVX2 and portable
//! paths, so results are bitwise equal for any thread count, any batch
//! composition and any instruction set.

pub mod canon;
pub mod ops;
pub mod simd;

use crate::backend::{Backend, Mode, Op};
use anyhow::{Context, Result};
pub use simd::Isa;

/// The `cpu` backend. Owns its rayon thread pool; all work runs inside it.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    n_threads: usize,
    isa: Isa,
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
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("quire-cpu-{i}"))
            .build()
            .with_context(|| format!("cpu backend: building a thread pool of {n} threads"))?;
        Ok(CpuBackend {
            pool,
            n_threads: n,
            isa: Isa::detect(force_portable),
        })
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
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
            | Op::RmsNorm { .. }
            | Op::Rope { .. }
            | Op::SwiGlu { .. }
            | Op::GetRows { .. }
            | Op::Add { .. }
            | Op::AddBias { .. }
            | Op::KvWrite { .. }
            | Op::PagedAttention { .. } => true,
        }
    }

    fn run(&self, op: Op<'_>, _mode: Mode) -> Result<()> {
        // The cpu kernels are already exact (hence deterministic); every mode
        // runs the same code.
        let isa = self.isa;
        let nt = self.n_threads;
        self.pool.install(|| match op {
            Op::MatMul { w, x, n, out } => ops::matmul::run(isa, nt, w, x, n, out),
            Op::RmsNorm {
                x,
                w,
                dim,
                eps,
                out,
            } => ops::rms_norm::run(isa, x, w, dim, eps, out),
            Op::Rope {
                x,
                n_heads,
                head_dim,
                rope_dim,
                positions,
                inv_freq,
                neox,
            } => ops::rope::run(x, n_heads, head_dim, rope_dim, positions, inv_freq, neox),
            Op::SwiGlu { gate, up, out } => ops::swiglu::run(gate, up, out),
            Op::GetRows { table, ids, out } => ops::get_rows::run(table, ids, out),
            Op::Add { x, y } => ops::add::add(x, y),
            Op::AddBias { x, bias } => ops::add::add_bias(x, bias),
            Op::KvWrite { k, v, slots, cache } => ops::kv_write::run(k, v, slots, cache),
            Op::PagedAttention {
                q,
                n_heads,
                scale,
                cache,
                batch,
                out,
            } => ops::attention::run(isa, q, n_heads, scale, cache, batch, out),
        })
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
