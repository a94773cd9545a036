//! One file per op. Each `run` validates every length first and returns an
//! error naming the op and the shapes; only then does it compute.

pub mod add;
pub mod attention;
#[cfg(target_arch = "x86_64")]
pub mod attention_avx2;
pub mod collective;
pub mod dequant;
pub mod dot;
pub mod gdn;
pub mod get_rows;
pub mod hybrid;
pub mod kv_write;
pub mod matmul;
pub mod rms_norm;
pub mod rope;
pub mod select_rows;
pub mod swiglu;

/// Elements per parallel task in elementwise ops (fixed, so the split does
/// not depend on the thread count; elementwise results never depend on it).
pub(crate) const ELEM_CHUNK: usize = 16 * 1024;

use crate::backend::cpu::pool::Par;

/// A raw pointer to elements that several threads write disjointly.
pub(crate) struct MutPtr<T>(*mut T);

impl<T> Clone for MutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MutPtr<T> {}

impl<T> MutPtr<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        MutPtr(s.as_mut_ptr())
    }
    /// `len` elements from `off`.
    ///
    /// # Safety
    /// `off + len` is within the slice this was made from, that slice is
    /// still mutably borrowed by the caller, and no other live reference
    /// overlaps `[off, off + len)`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, off: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(off), len)
    }
}
// SAFETY: only used to hand disjoint sub-slices to the pool's threads
// while the owning `&mut [T]` is borrowed (see each use); T: Send.
unsafe impl<T: Send> Send for MutPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for MutPtr<T> {}

/// Runs `f(i, chunk_i)` over `chunk`-sized pieces of `data`: on the pool
/// when `par` has one, else in order on the calling thread. Each chunk's
/// result never depends on which thread ran it.
pub(crate) fn for_chunks<T: Send>(
    par: Par<'_>,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    if par.is_par() && data.len() > chunk {
        let len = data.len();
        let p = MutPtr::new(data);
        par.for_tasks(len.div_ceil(chunk), |i| {
            let off = i * chunk;
            // SAFETY: task i alone gets [off, off + chunk) ∩ [0, len);
            // `data` stays borrowed until for_tasks returns.
            f(i, unsafe { p.slice(off, chunk.min(len - off)) });
        });
    } else {
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
    }
}

/// Fallible [`for_chunks`]; the first error (in chunk order when serial,
/// any when parallel) is returned.
pub(crate) fn try_for_chunks<T: Send>(
    par: Par<'_>,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    let chunk = chunk.max(1);
    if par.is_par() && data.len() > chunk {
        let err = std::sync::Mutex::new(None);
        for_chunks(par, data, chunk, |i, c| {
            if let Err(e) = f(i, c) {
                err.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(e);
            }
        });
        match err.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    } else {
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c)?;
        }
        Ok(())
    }
}
