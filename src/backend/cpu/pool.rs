//! A small persistent worker pool for op-level parallel loops.
//!
//! Decode runs a few hundred short parallel loops per token; a general
//! work-stealing pool costs several microseconds per hand-off. Here the
//! calling thread publishes one job (`n_tasks` calls of a `Fn(task)`),
//! bumps an epoch and claims tasks itself; workers that see the epoch
//! claim the rest. Tasks are claimed through one atomic counter, so a
//! worker that is slow to wake (a loaded machine) never holds the caller
//! up: the caller then runs every task itself. Idle workers spin on the
//! epoch for a short while, then park on a condition variable.
//!
//! Nothing here decides arithmetic: a job only ever splits independent
//! outputs among tasks, so results never depend on which thread ran which
//! task (see `super` for the determinism contract).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins on the epoch before parking.
const SPIN: Duration = Duration::from_micros(200);

/// A lifetime-erased job: `&(dyn Fn(usize) + Sync)`.
type JobPtr = *const (dyn Fn(usize) + Sync + 'static);

/// One published job. Shared by `Arc`, so a worker that picks it up late
/// (after the caller returned) still reads valid counters; it then finds
/// every task claimed and never touches `f`.
struct Job {
    f: JobPtr,
    n_tasks: usize,
    /// Next unclaimed task.
    next: AtomicUsize,
    /// Tasks finished (by any thread).
    done: AtomicUsize,
    panicked: AtomicBool,
}

// SAFETY: `f` points at a `Sync` closure and is only called for a claimed
// task, while the publishing `Pool::run` is still waiting for that task
// (it returns only once `done == n_tasks`), so the closure is alive.
unsafe impl Send for Job {}
// SAFETY: as above; every other field is atomic.
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n_tasks {
                return;
            }
            // SAFETY: task i is claimed and not done, so the publisher is
            // still inside `run` and the closure is alive (see `Job`).
            let f = unsafe { &*self.f };
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Shared {
    /// Bumped once per published job (after `job` is set).
    epoch: AtomicU64,
    job: Mutex<Option<Arc<Job>>>,
    stop: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

/// A fixed set of `n - 1` worker threads; the caller works too.
pub struct Pool {
    shared: Arc<Shared>,
    n: usize,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `n` threads in all (the caller plus `n - 1` workers).
    pub fn new(n: usize) -> std::io::Result<Pool> {
        let n = n.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        });
        let mut pool = Pool {
            shared,
            n,
            handles: Vec::with_capacity(n - 1),
        };
        for t in 1..n {
            let sh = pool.shared.clone();
            // On error, dropping `pool` stops the workers already started.
            let h = std::thread::Builder::new()
                .name(format!("quire-cpu-{t}"))
                .spawn(move || worker(sh))?;
            pool.handles.push(h);
        }
        Ok(pool)
    }

    /// Threads in all, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n
    }

    /// Runs `f(i)` for every task `i` in `0..n_tasks`, each exactly once,
    /// on the calling thread and the workers; returns when all are done.
    /// A panic in any task is re-raised here.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.n == 1 || n_tasks <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let sh = &*self.shared;
        // SAFETY: erase the closure's lifetime. It is only called for a
        // claimed task, and this function does not return (even when a
        // task panics on this thread: see `Wait`) before every task is
        // done, so `f` outlives every call.
        let ptr: JobPtr = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), JobPtr>(f) };
        let job = Arc::new(Job {
            f: ptr,
            n_tasks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
        });
        *sh.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job.clone());
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.cv.notify_all();
        }
        // Waits for tasks claimed by workers.
        struct Wait<'a>(&'a Job);
        impl Drop for Wait<'_> {
            fn drop(&mut self) {
                // Claim what is left, so nobody can start a task later.
                let j = self.0;
                j.next.fetch_add(j.n_tasks, Ordering::Relaxed);
                let mut spins = 0u32;
                while j.done.load(Ordering::Acquire) < j.n_tasks {
                    spins += 1;
                    if spins < 1 << 12 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
        let wait = Wait(&job);
        job.work();
        drop(wait);
        if job.panicked.load(Ordering::Relaxed) {
            panic!("cpu backend: a parallel task panicked");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.stop.store(true, Ordering::SeqCst);
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.cv.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(sh: Arc<Shared>) {
    // The epoch a new pool starts at (not a fresh load: the pool may be
    // dropped, bumping it, before this thread first runs).
    let mut seen = 0;
    loop {
        // Spin, then park, until the epoch moves.
        let mut start: Option<Instant> = None;
        let mut spins = 0u32;
        let e = loop {
            let e = sh.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let s = *start.get_or_insert(now);
            if now.duration_since(s) < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while sh.epoch.load(Ordering::SeqCst) == seen && !sh.stop.load(Ordering::SeqCst) {
                g = sh.cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(g);
            start = None;
        };
        seen = e;
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let job = sh.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(job) = job {
            job.work();
        }
    }
}

/// How an op may run: serially on the calling thread, or on a pool.
#[derive(Clone, Copy)]
pub struct Par<'a> {
    pool: Option<&'a Pool>,
}

impl<'a> Par<'a> {
    /// Serial: everything on the calling thread.
    pub const SERIAL: Par<'static> = Par { pool: None };

    pub fn pool(pool: &'a Pool) -> Par<'a> {
        Par {
            pool: if pool.n_threads() > 1 {
                Some(pool)
            } else {
                None
            },
        }
    }

    /// Whether work is split among threads.
    pub fn is_par(&self) -> bool {
        self.pool.is_some()
    }

    /// Threads that share the work (1 when serial).
    pub fn n_threads(&self) -> usize {
        self.pool.map_or(1, |p| p.n_threads())
    }

    /// Runs `f(t, nt)` once per part `t` in `0..nt`, nt = the thread count
    /// (a static split; a part runs on whichever thread claims it).
    pub fn for_threads(&self, f: impl Fn(usize, usize) + Sync) {
        match self.pool {
            Some(p) => {
                let nt = p.n_threads();
                p.run(nt, &|t| f(t, nt));
            }
            None => f(0, 1),
        }
    }

    /// Runs `f(i)` for every task `i` in `0..n_tasks`, each exactly once;
    /// threads claim tasks dynamically (in increasing order). Serial: in
    /// order on the calling thread.
    pub fn for_tasks(&self, n_tasks: usize, f: impl Fn(usize) + Sync) {
        match self.pool {
            Some(p) => p.run(n_tasks, &f),
            None => (0..n_tasks).for_each(f),
        }
    }
}

impl From<bool> for Par<'static> {
    /// A bare flag names no pool: always serial (results are identical).
    fn from(_: bool) -> Par<'static> {
        Par::SERIAL
    }
}
