//! The activation pool: device buffers of finished steps kept by capacity
//! for the next steps to reuse, so that a captured decode graph never has
//! to allocate.
//!
//! Buffers are allocated in size classes (`size_class`: less than 1/8
//! over the request) and a request takes the smallest free buffer whose
//! capacity lies in `[size_class(len), 2 * size_class(len)]`. Decode steps
//! of neighbouring batch sizes therefore share buffers: a server whose
//! batch grows one sequence at a time reuses what the previous sizes left,
//! and the buffers a captured graph holds (`pinned`: never freed, since the
//! graph keeps their addresses) serve every later capture of a nearby size
//! instead of each size pinning buffers of its own exact lengths. Sharing
//! is safe because every step and every graph replay runs on the one
//! stream, in order.
//!
//! Unpinned buffers are kept up to `POOL_CAP_BYTES`, the oldest returned
//! evicted first to keep the newest (what the next step, or the capture
//! right after a step, asks for); pinned ones are neither counted nor
//! evicted (they are the graphs' working set). A cap that counted them, and
//! freed the newcomer rather than an old buffer, filled up with a serving
//! run's prefill activations and then dropped each new batch size's
//! buffers, so that its capture failed.

use std::collections::BTreeMap;

/// Most bytes of unpinned buffers the pool keeps.
pub(super) const POOL_CAP_BYTES: usize = 1 << 30;

/// Smallest allocation, in elements (4 KiB).
const MIN_CLASS: usize = 1024;

/// The capacity a request of `len` elements is allocated with: `len`
/// rounded up to a multiple of 1/16 of the power of two above it (less
/// than 1/8 more than `len`), at least `MIN_CLASS`.
pub(super) fn size_class(len: usize) -> usize {
    if len <= MIN_CLASS {
        return MIN_CLASS;
    }
    let step = len.next_power_of_two() / 16;
    len.div_ceil(step) * step
}

/// A graph capture asked the pool for `.0` elements and found no buffer
/// (it may not allocate): the capture is tried again once one is added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NoPooledBuffer(pub(super) usize);

impl std::fmt::Display for NoPooledBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cuda graph capture: no pooled buffer of {} elements (would allocate)",
            self.0
        )
    }
}

impl std::error::Error for NoPooledBuffer {}

/// The missing buffer's length, when `e` comes from one.
pub(super) fn missing_buffer(e: &anyhow::Error) -> Option<usize> {
    e.chain()
        .find_map(|c| c.downcast_ref::<NoPooledBuffer>())
        .map(|m| m.0)
}

/// A free buffer: whether a graph holds it, and when it came back.
struct Entry<T> {
    buf: T,
    pinned: bool,
    stamp: u64,
}

/// Free buffers by capacity. Generic over the buffer so that the rules run
/// on the host in tests.
pub(super) struct ClassPool<T> {
    free: BTreeMap<usize, Vec<Entry<T>>>,
    /// Elements held in unpinned buffers.
    unpinned: usize,
    /// Returns so far (the entries' stamps).
    clock: u64,
}

impl<T> Default for ClassPool<T> {
    fn default() -> Self {
        ClassPool {
            free: BTreeMap::new(),
            unpinned: 0,
            clock: 0,
        }
    }
}

impl<T> ClassPool<T> {
    /// The smallest free buffer for `len` elements (capacity in
    /// `[size_class(len), 2 * size_class(len)]`), the latest returned of
    /// its capacity.
    pub(super) fn take(&mut self, len: usize) -> Option<T> {
        let c = size_class(len);
        let cap = *self.free.range(c..=2 * c).find(|(_, v)| !v.is_empty())?.0;
        let v = self.free.get_mut(&cap)?;
        let e = v.pop()?;
        if v.is_empty() {
            self.free.remove(&cap);
        }
        if !e.pinned {
            self.unpinned -= cap;
        }
        Some(e.buf)
    }

    /// Returns buffer `b` of capacity `cap`. A pinned one is always kept.
    /// An unpinned one is kept too while the unpinned total stays within
    /// `cap_bytes`, making room by evicting the unpinned buffers returned
    /// longest ago: the newest are what the next step (or the capture
    /// right after a step) asks for. Returns the buffers to free (`b`
    /// itself only when it alone exceeds the cap).
    pub(super) fn give(&mut self, b: T, cap: usize, pinned: bool, cap_bytes: usize) -> Vec<T> {
        let mut out = Vec::new();
        if !pinned {
            if cap * 4 > cap_bytes {
                out.push(b);
                return out;
            }
            while (self.unpinned + cap) * 4 > cap_bytes {
                match self.evict_oldest() {
                    Some(old) => out.push(old),
                    None => break,
                }
            }
            self.unpinned += cap;
        }
        self.clock += 1;
        self.free.entry(cap).or_default().push(Entry {
            buf: b,
            pinned,
            stamp: self.clock,
        });
        out
    }

    /// Removes the unpinned free buffer returned longest ago.
    fn evict_oldest(&mut self) -> Option<T> {
        let (cap, i) = self
            .free
            .iter()
            .flat_map(|(&cap, v)| {
                v.iter()
                    .enumerate()
                    .filter(|(_, e)| !e.pinned)
                    .map(move |(i, e)| (e.stamp, cap, i))
            })
            .min()
            .map(|(_, cap, i)| (cap, i))?;
        let v = self.free.get_mut(&cap)?;
        let e = v.remove(i);
        if v.is_empty() {
            self.free.remove(&cap);
        }
        self.unpinned -= cap;
        Some(e.buf)
    }

    /// Elements held in unpinned buffers.
    #[cfg(test)]
    fn unpinned(&self) -> usize {
        self.unpinned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_an_eighth_at_most() {
        assert_eq!(size_class(1), MIN_CLASS);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1152); // 2048 / 16 = 128
        assert_eq!(size_class(2048), 2048);
        assert_eq!(size_class(2049), 2304);
        let v = 128_256;
        for b in 1..=256usize {
            let (len, c) = (b * v, size_class(b * v));
            assert!(c >= len && (c - len) * 8 <= len, "b {b}: {len} -> {c}");
            assert_eq!(size_class(c), c, "a class is its own class");
        }
    }

    /// The classes of a 1..=64 sweep of one activation: few distinct ones.
    #[test]
    fn a_batch_sweep_uses_few_classes() {
        let mut classes: Vec<usize> = (1..=64).map(|b| size_class(b * 128_256)).collect();
        classes.dedup();
        assert!(classes.len() <= 48, "{} classes", classes.len());
    }

    #[test]
    fn take_finds_the_smallest_fitting_capacity() {
        let mut p: ClassPool<(usize, u32)> = ClassPool::default();
        for (cap, id) in [(4096, 1), (2560, 2), (8192, 3), (2048, 4)] {
            assert!(p.give((cap, id), cap, false, usize::MAX).is_empty());
        }
        // 2049 -> class 2304: the 2560 one, then 4096 (within 2x), then
        // nothing (8192 > 4608).
        assert_eq!(p.take(2049), Some((2560, 2)));
        assert_eq!(p.take(2049), Some((4096, 1)));
        assert_eq!(p.take(2049), None);
        // A smaller buffer never serves a larger request.
        assert_eq!(p.take(3000), None);
        assert_eq!(p.take(2048), Some((2048, 4)));
        assert_eq!(p.take(4097), Some((8192, 3)));
        assert_eq!(p.unpinned(), 0);
    }

    #[test]
    fn a_missing_buffer_is_found_through_context() {
        let e = anyhow::Error::new(NoPooledBuffer(32_256)).context("op mat_muls");
        assert_eq!(missing_buffer(&e), Some(32_256));
        assert!(format!("{e:#}").contains("no pooled buffer of 32256 elements"));
        assert_eq!(missing_buffer(&anyhow::anyhow!("another failure")), None);
    }

    #[test]
    fn past_the_cap_the_oldest_unpinned_buffers_go() {
        let mut p: ClassPool<u32> = ClassPool::default();
        let cap_bytes = 4 * 10_000;
        // Pinned buffers are always kept and never counted or evicted.
        for i in 0..4 {
            assert!(p.give(i, 8192, true, cap_bytes).is_empty());
        }
        assert_eq!(p.unpinned(), 0);
        assert!(p.give(10, 4096, false, cap_bytes).is_empty());
        assert!(p.give(11, 4096, false, cap_bytes).is_empty());
        assert_eq!(p.unpinned(), 8192);
        // The newcomer stays; the oldest unpinned one (10) is evicted.
        assert_eq!(p.give(12, 2048, false, cap_bytes), vec![10]);
        assert_eq!(p.unpinned(), 4096 + 2048);
        // One larger than the cap itself is freed at once.
        assert_eq!(p.give(13, 16_384, false, cap_bytes), vec![13]);
        // What is left: 11, 12 and the pinned ones, latest first.
        assert_eq!(p.take(4096), Some(11));
        assert_eq!(p.take(2048), Some(12));
        let mut got = Vec::new();
        while let Some(b) = p.take(8192) {
            got.push(b);
        }
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert_eq!(p.unpinned(), 0);
    }
}
