//! The backend stream's synchronizations, counted (`CudaBackend::sync`).

/// Counts a stream's synchronizations so that the host can tell whether
/// work enqueued at some point has run without asking the driver: a
/// synchronization that *began* after a ticket was taken covers every
/// copy enqueued before it.
#[derive(Default)]
pub(crate) struct SyncCount {
    /// Synchronizations begun.
    starts: std::sync::atomic::AtomicU64,
    /// One past the index of the latest completed one.
    done: std::sync::atomic::AtomicU64,
}

impl SyncCount {
    /// A synchronization begins: its index.
    pub(crate) fn begin(&self) -> u64 {
        self.starts
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
    }

    /// Synchronization `n` completed.
    pub(crate) fn end(&self, n: u64) {
        self.done
            .fetch_max(n + 1, std::sync::atomic::Ordering::AcqRel);
    }

    pub(crate) fn ticket(&self) -> u64 {
        self.starts.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn past(&self, ticket: u64) -> bool {
        self.done.load(std::sync::atomic::Ordering::Acquire) > ticket
    }
}

#[cfg(test)]
mod tests {
    use super::SyncCount;

    #[test]
    fn a_sync_covers_only_tickets_taken_before_it_began() {
        let c = SyncCount::default();
        let t0 = c.ticket();
        assert!(!c.past(t0));
        // A sync that began before the ticket (n = 0) and ends after it
        // does not cover it.
        let n0 = c.begin();
        let t1 = c.ticket();
        c.end(n0);
        assert!(c.past(t0) && !c.past(t1));
        // A failed sync (begun, never ended) covers nothing.
        let _failed = c.begin();
        assert!(!c.past(t1));
        // The next completed one covers t1.
        let n2 = c.begin();
        c.end(n2);
        assert!(c.past(t1));
        // Completions out of order keep the latest.
        let (a, b) = (c.begin(), c.begin());
        let t3 = c.ticket();
        c.end(b);
        c.end(a);
        assert!(!c.past(t3));
        assert!(c.past(b));
    }
}
