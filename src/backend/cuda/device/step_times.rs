//! Host-side phases of decode steps (`QUIRE_STEP_TIMES=1`): where a step's
//! wall time goes between the host and the device when its graph is
//! replayed (`QUIRE_PROFILE_OPS=1` times ops instead, without graphs).
//!
//! The step path marks named points in order ([`mark`]); the time from
//! each mark to the next is added to the phase the first one opens. The
//! phases, printed by [`report`]: the host's work before the graph launch
//! (KV blocks, input rows, staging and upload enqueue), the launch call,
//! the logits copy's enqueue, the wait for the device (graph and copy),
//! the host's work after it, and the caller between steps.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The marks, in step order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// A step starts (Runner::step_flat).
    StepStart = 0,
    /// Its KV blocks are allocated.
    KvDone = 1,
    /// Its input rows are built (forward_batch).
    InputBuilt = 2,
    /// The decode graph's inputs are staged and their upload enqueued.
    Uploaded = 3,
    /// The graph launch is about to be called.
    Launch = 4,
    /// The launch call returned.
    Launched = 5,
    /// The logits copy is enqueued; the host waits next.
    Wait = 6,
    /// The wait returned.
    Waited = 7,
    /// The step returns to its caller.
    StepEnd = 8,
}

const N: usize = 9;
const NAMES: [&str; N] = [
    "kv allocate",
    "step input rows",
    "graph inputs staged, upload enqueued",
    "before the launch",
    "graph launch call",
    "logits copy enqueue",
    "wait for the device",
    "host after the wait",
    "caller between steps",
];

static ON: OnceLock<bool> = OnceLock::new();
static PHASES: Mutex<Phases> = Mutex::new(Phases::new());

/// Whether QUIRE_STEP_TIMES=1.
pub fn enabled() -> bool {
    *ON.get_or_init(|| std::env::var("QUIRE_STEP_TIMES").is_ok_and(|v| v == "1"))
}

/// Marks point `p` now (QUIRE_STEP_TIMES=1; otherwise nothing).
pub fn mark(p: Point) {
    if enabled() {
        if let Ok(mut ph) = PHASES.lock() {
            ph.mark(p, Instant::now());
        }
    }
}

/// The phases measured so far: (name, count, mean microseconds), and
/// clears them. Empty when off.
pub fn report() -> Vec<(&'static str, u64, f64)> {
    if !enabled() {
        return Vec::new();
    }
    PHASES.lock().map(|mut p| p.take()).unwrap_or_default()
}

/// Time per phase between marks.
struct Phases {
    nanos: [u64; N],
    count: [u64; N],
    last: Option<(Point, Instant)>,
}

impl Phases {
    const fn new() -> Self {
        Phases {
            nanos: [0; N],
            count: [0; N],
            last: None,
        }
    }

    /// The time since the last mark goes to the phase that mark opened,
    /// only when `p` is the point after it in step order (a step that
    /// runs op by op marks fewer points and adds nothing wrong).
    fn mark(&mut self, p: Point, now: Instant) {
        if let Some((q, t)) = self.last {
            if (q as usize + 1) % N == p as usize {
                let i = q as usize;
                self.nanos[i] += now.saturating_duration_since(t).as_nanos() as u64;
                self.count[i] += 1;
            }
        }
        self.last = Some((p, now));
    }

    fn take(&mut self) -> Vec<(&'static str, u64, f64)> {
        let out = (0..N)
            .map(|i| {
                let n = self.count[i];
                (NAMES[i], n, self.nanos[i] as f64 / 1e3 / n.max(1) as f64)
            })
            .collect();
        *self = Phases::new();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Phases, Point, N};
    use std::time::{Duration, Instant};

    #[test]
    fn phases_add_only_consecutive_marks() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut p = Phases::new();
        // Two graph steps: every point in order, the second step 10 us
        // after the first ends.
        let order = [
            Point::StepStart,
            Point::KvDone,
            Point::InputBuilt,
            Point::Uploaded,
            Point::Launch,
            Point::Launched,
            Point::Wait,
            Point::Waited,
            Point::StepEnd,
        ];
        assert_eq!(order.len(), N);
        for step in 0..2u64 {
            for (i, &pt) in order.iter().enumerate() {
                p.mark(
                    pt,
                    at(step * 100 + 2 * i as u64 + if step == 1 { 10 } else { 0 }),
                );
            }
        }
        // An op-by-op step (no graph points) adds to no phase but the
        // caller's gap before it.
        p.mark(Point::StepStart, at(300));
        p.mark(Point::KvDone, at(301));
        p.mark(Point::StepEnd, at(350));
        let r = p.take();
        assert_eq!(r.len(), N);
        // Each in-step phase: 2 us, twice; kv allocate three times.
        assert_eq!((r[0].1, r[0].2), (3, 5.0 / 3.0));
        for ph in &r[1..N - 1] {
            assert_eq!((ph.1, ph.2), (2, 2.0), "{}", ph.0);
        }
        // Between steps: 100 + 10 - 16 = 94 us, then 300 - 126 = 174.
        assert_eq!((r[N - 1].1, r[N - 1].2), (2, (94.0 + 174.0) / 2.0));
        // Taken: cleared.
        assert!(p.take().iter().all(|ph| ph.1 == 0));
    }
}
