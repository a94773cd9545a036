//! Logits downloads straight into page-locked host memory.
//!
//! A batched decode step of a 128k vocabulary returns 32 MiB of logits
//! (64 rows). Copying them into a staging buffer and then into a vector
//! cost about as much host time as the copy itself (H100, 8B, batch 64:
//! 1.9 ms device-to-host plus ~3 ms of host memcpy per step), so the
//! caller reads the page-locked buffer the device wrote, and the buffer
//! goes back to a small pool when the caller drops it.

use cudarc::driver::PinnedHostSlice;
use std::sync::{Arc, Mutex};

/// Buffers kept for reuse: the caller may hold one step's logits while the
/// next step downloads (the server samples after the step), and a pinned
/// allocation of tens of MiB costs milliseconds.
const POOL_MAX: usize = 3;

/// Spare page-locked buffers, shared with every [`PinnedLogits`] so that a
/// dropped one returns its buffer.
#[derive(Default, Clone)]
pub(crate) struct PinnedPool(Arc<Mutex<Vec<PinnedHostSlice<f32>>>>);

impl PinnedPool {
    /// A spare buffer of at least `len` values, if the pool has one.
    pub(crate) fn take(&self, len: usize) -> Option<PinnedHostSlice<f32>> {
        take_fit(&mut *self.0.lock().ok()?, len, PinnedHostSlice::len)
    }

    fn give(&self, b: PinnedHostSlice<f32>) {
        if let Ok(mut p) = self.0.lock() {
            keep_largest(&mut p, b, PinnedHostSlice::len);
        }
    }
}

/// Removes and returns the smallest buffer of `pool` holding at least
/// `len` (the larger ones stay for larger steps).
fn take_fit<B>(pool: &mut Vec<B>, len: usize, len_of: impl Fn(&B) -> usize) -> Option<B> {
    let i = (0..pool.len())
        .filter(|&i| len_of(&pool[i]) >= len)
        .min_by_key(|&i| len_of(&pool[i]))?;
    Some(pool.swap_remove(i))
}

/// Puts `b` back into `pool`, which keeps at most POOL_MAX buffers: past
/// that, the largest (the batch size grows and shrinks; a large buffer
/// serves a small step, not the reverse).
fn keep_largest<B>(pool: &mut Vec<B>, b: B, len_of: impl Fn(&B) -> usize) {
    if pool.len() < POOL_MAX {
        pool.push(b);
    } else if let Some(i) = (0..pool.len()).min_by_key(|&i| len_of(&pool[i])) {
        if len_of(&pool[i]) < len_of(&b) {
            pool[i] = b;
        }
    }
}

/// One step's logits in page-locked memory: the first `len` values of the
/// buffer, written by a device-to-host copy that has completed.
pub struct PinnedLogits {
    buf: Option<PinnedHostSlice<f32>>,
    ptr: *const f32,
    len: usize,
    pool: PinnedPool,
}

// SAFETY: `ptr` points into `buf`, which this value owns; nothing writes
// the buffer while it is here (the pool hands a buffer to one download at a
// time and gets it back only on drop), so shared reads from any thread are
// sound. PinnedHostSlice itself is Send + Sync.
unsafe impl Send for PinnedLogits {}
// SAFETY: as above: the memory is read-only while owned here.
unsafe impl Sync for PinnedLogits {}

impl PinnedLogits {
    /// Wraps `buf`, whose first value is at `ptr`, after a completed copy
    /// of `len` values into it. (The caller took `ptr` from the slice it
    /// copied into: asking the buffer again would wait on its event, a
    /// driver call on the step's critical path.)
    ///
    /// # Safety
    /// `ptr` must be the start of `buf`; the copy into `buf[..len]` must
    /// have completed (its stream synchronized) and nothing may write
    /// `buf` afterwards.
    pub(crate) unsafe fn new(
        buf: PinnedHostSlice<f32>,
        ptr: *const f32,
        len: usize,
        pool: PinnedPool,
    ) -> Self {
        assert!(
            len <= buf.len(),
            "pinned logits: {len} values in a buffer of {}",
            buf.len()
        );
        PinnedLogits {
            buf: Some(buf),
            ptr,
            len,
            pool,
        }
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `ptr` is the start of `buf` (alive while self is), which
        // holds at least `len` initialized values (see `new`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for PinnedLogits {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give(b);
        }
    }
}

impl std::fmt::Debug for PinnedLogits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedLogits({} values)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::{keep_largest, take_fit, POOL_MAX};

    #[test]
    fn pool_keeps_the_largest_buffers_and_hands_out_a_fit() {
        let mut pool: Vec<Vec<u8>> = Vec::new();
        for n in [10, 40, 20, 5, 30] {
            keep_largest(&mut pool, vec![0; n], Vec::len);
        }
        let mut lens: Vec<usize> = pool.iter().map(Vec::len).collect();
        lens.sort();
        assert_eq!(POOL_MAX, 3);
        assert_eq!(lens, vec![20, 30, 40]);
        // The smallest buffer that is large enough, removed from the pool.
        assert_eq!(take_fit(&mut pool, 25, Vec::len).map(|b| b.len()), Some(30));
        assert_eq!(pool.len(), 2);
        assert!(take_fit(&mut pool, 41, Vec::len).is_none());
        assert_eq!(take_fit(&mut pool, 0, Vec::len).map(|b| b.len()), Some(20));
        assert_eq!(take_fit(&mut pool, 31, Vec::len).map(|b| b.len()), Some(40));
        assert!(pool.is_empty());
    }
}
