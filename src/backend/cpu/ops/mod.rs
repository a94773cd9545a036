//! One file per op. Each `run` validates every length first and returns an
//! error naming the op and the shapes; only then does it compute.

pub mod add;
pub mod attention;
#[cfg(target_arch = "x86_64")]
pub mod attention_avx2;
pub mod dequant;
pub mod dot;
pub mod get_rows;
pub mod kv_write;
pub mod matmul;
pub mod rms_norm;
pub mod rope;
pub mod swiglu;

/// Elements per parallel task in elementwise ops (fixed, so the split does
/// not depend on the thread count; elementwise results never depend on it).
pub(crate) const ELEM_CHUNK: usize = 16 * 1024;

use rayon::prelude::*;

/// Runs `f(i, chunk_i)` over `chunk`-sized pieces of `data`: in parallel in
/// the current pool when `par`, else in order on the calling thread. Each
/// chunk's result never depends on which thread ran it.
pub(crate) fn for_chunks<T: Send>(
    par: bool,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    if par {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
    }
}

/// Fallible [`for_chunks`]; the first error (in chunk order when serial,
/// any when parallel) is returned.
pub(crate) fn try_for_chunks<T: Send>(
    par: bool,
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> anyhow::Result<()> + Sync + Send,
) -> anyhow::Result<()> {
    let chunk = chunk.max(1);
    if par {
        data.par_chunks_mut(chunk)
            .enumerate()
            .try_for_each(|(i, c)| f(i, c))
    } else {
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c)?;
        }
        Ok(())
    }
}
