//! The in-process communicator: ranks are threads of one process sharing a
//! rendezvous. It runs the tensor-parallel path on the cpu backend (CI's
//! simulated ranks); every collective is deterministic (rank order).

use super::{Communicator, ReduceOrder};
use anyhow::{bail, ensure, Result};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A group of `world` simulated ranks; [`LocalGroup::comms`] hands out one
/// communicator per rank.
pub struct LocalGroup {
    world: usize,
    state: Mutex<State>,
    cv: Condvar,
}

/// What a rank posted for the current collective.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Gather { rows: usize },
    Reduce,
}

struct State {
    /// Per rank: the collective it posted and its data.
    posted: Vec<Option<(Kind, Vec<f32>)>>,
    /// Every rank posted; they are reading. No rank posts again until all
    /// have read (so no contribution is overwritten while it is read).
    reading: bool,
    /// Ranks that finished reading this round.
    done: usize,
    aborted: Option<String>,
}

impl LocalGroup {
    pub fn new(world: usize) -> Result<Arc<LocalGroup>> {
        ensure!(
            world >= 1,
            "a tensor-parallel group needs at least one rank"
        );
        Ok(Arc::new(LocalGroup {
            world,
            state: Mutex::new(State {
                posted: vec![None; world],
                reading: false,
                done: 0,
                aborted: None,
            }),
            cv: Condvar::new(),
        }))
    }

    /// One communicator per rank, in rank order.
    pub fn comms(self: &Arc<Self>) -> Vec<LocalComm> {
        (0..self.world)
            .map(|rank| LocalComm {
                group: Arc::clone(self),
                rank,
            })
            .collect()
    }

    /// Clears an abort so the group can run the next step (every rank has
    /// returned from the failed one).
    pub fn reset(&self) {
        let mut s = self.lock();
        s.aborted = None;
        s.posted.iter_mut().for_each(|p| *p = None);
        s.reading = false;
        s.done = 0;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panicked while holding the lock left nothing half
        // written that a later round reads unchecked: every round
        // overwrites its slots first.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(
        &self,
        mut s: MutexGuard<'a, State>,
        until: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'a, State>> {
        loop {
            if let Some(why) = &s.aborted {
                bail!("tensor-parallel collective abandoned: {why}");
            }
            if until(&s) {
                return Ok(s);
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Posts `data` as `rank`'s part of a collective, waits for every
    /// rank's, lets `read` see them all (in rank order), then waits for
    /// nothing: the round ends when the last rank has read.
    fn round(
        &self,
        rank: usize,
        kind: Kind,
        data: &[f32],
        read: impl FnOnce(&[Option<(Kind, Vec<f32>)>]) -> Result<()>,
    ) -> Result<()> {
        let s = self.lock();
        let mut s = self.wait(s, |s| !s.reading && s.posted[rank].is_none())?;
        s.posted[rank] = Some((kind, data.to_vec()));
        if s.posted.iter().all(Option::is_some) {
            s.reading = true;
            self.cv.notify_all();
        }
        let s = self.wait(s, |s| s.reading)?;
        let mismatch = s.posted.iter().enumerate().find_map(|(r, p)| match p {
            Some((k, d)) if *k != kind || d.len() != data.len() => {
                Some(format!("rank {r} posted {k:?} of {} values", d.len()))
            }
            _ => None,
        });
        let res = match mismatch {
            Some(m) => Err(anyhow::anyhow!(
                "tensor-parallel ranks disagree: rank {rank} posted {kind:?} of {} values, {m}",
                data.len()
            )),
            None => read(&s.posted),
        };
        let mut s = s;
        s.done += 1;
        if s.done == self.world {
            s.posted.iter_mut().for_each(|p| *p = None);
            s.reading = false;
            s.done = 0;
            self.cv.notify_all();
        }
        res
    }
}

/// One rank's handle on a [`LocalGroup`].
pub struct LocalComm {
    group: Arc<LocalGroup>,
    rank: usize,
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.group.world
    }

    fn all_gather(&self, x: &[f32], rows: usize, out: &mut [f32], add: bool) -> Result<()> {
        let world = self.group.world;
        ensure!(
            rows > 0 && x.len().is_multiple_of(rows) && out.len() == x.len() * world,
            "all_gather: {} values in {rows} rows, out {} (expected {} x {world})",
            x.len(),
            out.len(),
            x.len()
        );
        let w = x.len() / rows;
        self.group
            .round(self.rank, Kind::Gather { rows }, x, |parts| {
                for (r, p) in parts.iter().enumerate() {
                    let Some((_, p)) = p else { continue };
                    for (i, src) in p.chunks_exact(w).enumerate() {
                        let dst = &mut out[i * world * w + r * w..][..w];
                        if add {
                            dst.iter_mut().zip(src).for_each(|(o, s)| *o += s);
                        } else {
                            dst.copy_from_slice(src);
                        }
                    }
                }
                Ok(())
            })
    }

    fn all_reduce_add(&self, x: &[f32], out: &mut [f32], _order: ReduceOrder) -> Result<()> {
        ensure!(
            x.len() == out.len(),
            "all_reduce: {} values into {}",
            x.len(),
            out.len()
        );
        // Rank order for either order: the simulated ranks are always
        // deterministic (only a device communicator's `Any` differs).
        self.group.round(self.rank, Kind::Reduce, x, |parts| {
            let mut sum: Vec<f32> = Vec::new();
            for (r, p) in parts.iter().enumerate() {
                let Some((_, p)) = p else { continue };
                if r == 0 {
                    sum = p.clone();
                } else {
                    sum.iter_mut().zip(p).for_each(|(s, v)| *s += v);
                }
            }
            out.iter_mut().zip(&sum).for_each(|(o, s)| *o += s);
            Ok(())
        })
    }

    fn abort(&self, why: &str) {
        let mut s = self.group.lock();
        if s.aborted.is_none() {
            s.aborted = Some(format!("rank {} failed: {why}", self.rank));
        }
        self.group.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send>(world: usize, f: impl Fn(&LocalComm) -> T + Sync) -> Vec<T> {
        let comms = LocalGroup::new(world).unwrap().comms();
        std::thread::scope(|s| {
            let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Random-ish values: distinct per rank, element and call.
    fn vals(seed: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((seed * 7919 + i * 104729) % 1000) as f32 / 37.0 - 13.0)
            .collect()
    }

    #[test]
    fn all_gather_concatenates_rows_in_rank_order_and_adds() {
        for world in [1, 2, 3, 4] {
            let (rows, w) = (3, 5);
            let outs = run(world, |c| {
                let x = vals(c.rank() + 1, rows * w);
                let mut out = vec![f32::NAN; rows * w * world];
                c.all_gather(&x, rows, &mut out, false).unwrap();
                let base = vals(99, rows * w * world);
                let mut acc = base.clone();
                c.all_gather(&x, rows, &mut acc, true).unwrap();
                (out, acc, base)
            });
            for (out, acc, base) in &outs {
                for i in 0..rows {
                    for r in 0..world {
                        let x = vals(r + 1, rows * w);
                        for j in 0..w {
                            let at = i * world * w + r * w + j;
                            assert_eq!(out[at].to_bits(), x[i * w + j].to_bits());
                            assert_eq!(acc[at].to_bits(), (base[at] + x[i * w + j]).to_bits());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn all_reduce_adds_the_sum_in_rank_order_on_every_rank() {
        let world = 4;
        let n = 257;
        let outs = run(world, |c| {
            let mut out = vals(50, n);
            for _ in 0..3 {
                c.all_reduce_add(&vals(c.rank(), n), &mut out, ReduceOrder::Fixed)
                    .unwrap();
            }
            out
        });
        let mut want = vals(50, n);
        for _ in 0..3 {
            for (i, o) in want.iter_mut().enumerate() {
                let s = ((vals(0, n)[i] + vals(1, n)[i]) + vals(2, n)[i]) + vals(3, n)[i];
                *o += s;
            }
        }
        for o in &outs {
            assert_eq!(
                o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_failed_rank_releases_the_others() {
        let errs = run(3, |c| {
            if c.rank() == 1 {
                c.abort("out of memory");
                return "aborted".to_string();
            }
            let mut out = vec![0.0; 4];
            format!(
                "{:#}",
                c.all_reduce_add(&[1.0; 4], &mut out, ReduceOrder::Fixed)
                    .unwrap_err()
            )
        });
        assert!(
            errs[0].contains("rank 1 failed: out of memory"),
            "{}",
            errs[0]
        );
        assert!(errs[2].contains("rank 1 failed"), "{}", errs[2]);
    }

    #[test]
    fn mismatched_collectives_are_an_error_not_garbage() {
        let res = run(2, |c| {
            let mut out = vec![0.0; 8];
            if c.rank() == 0 {
                c.all_reduce_add(&[1.0; 8], &mut out, ReduceOrder::Fixed)
            } else {
                c.all_reduce_add(&[1.0; 6], &mut out[..6], ReduceOrder::Fixed)
            }
        });
        for r in res {
            assert!(format!("{:#}", r.unwrap_err()).contains("ranks disagree"));
        }
    }
}
