//! The in-process communicator: ranks are threads of one process sharing a
//! rendezvous. It runs the tensor-parallel path on the cpu backend (CI's
//! simulated ranks); its sum is in rank order.

use super::Communicator;
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
    Gather,
    Sum,
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

impl LocalComm {
    /// Makes every pending and later collective of the group fail, naming
    /// this rank (called by a rank whose step failed, so the others do not
    /// wait for it forever).
    pub fn abort(&self, why: &str) {
        let mut s = self.group.lock();
        if s.aborted.is_none() {
            s.aborted = Some(format!("rank {} failed: {why}", self.rank));
        }
        self.group.cv.notify_all();
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.group.world
    }

    fn all_gather(&self, x: &[f32], parts: &mut [f32]) -> Result<()> {
        ensure!(
            parts.len() == x.len() * self.group.world,
            "all_gather: {} values into {} (expected {} x {})",
            x.len(),
            parts.len(),
            x.len(),
            self.group.world
        );
        self.group.round(self.rank, Kind::Gather, x, |posted| {
            for (p, dst) in posted.iter().zip(parts.chunks_exact_mut(x.len().max(1))) {
                if let Some((_, p)) = p {
                    dst.copy_from_slice(p);
                }
            }
            Ok(())
        })
    }

    /// The sum in rank order, `((x_0 + x_1) + x_2) + ...`.
    fn all_reduce_sum(&self, x: &[f32], sum: &mut [f32]) -> Result<()> {
        ensure!(
            x.len() == sum.len(),
            "all_reduce: {} values into {}",
            x.len(),
            sum.len()
        );
        self.group.round(self.rank, Kind::Sum, x, |posted| {
            for (r, p) in posted.iter().enumerate() {
                let Some((_, p)) = p else { continue };
                if r == 0 {
                    sum.copy_from_slice(p);
                } else {
                    sum.iter_mut().zip(p).for_each(|(s, v)| *s += v);
                }
            }
            Ok(())
        })
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
    fn all_gather_lays_the_ranks_out_in_order() {
        for world in [1, 2, 3, 4] {
            let n = 7;
            let outs = run(world, |c| {
                let mut parts = vec![f32::NAN; n * world];
                c.all_gather(&vals(c.rank() + 1, n), &mut parts).unwrap();
                parts
            });
            let want: Vec<f32> = (0..world).flat_map(|r| vals(r + 1, n)).collect();
            for o in &outs {
                assert_eq!(
                    o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn all_reduce_sums_in_rank_order_on_every_rank() {
        let world = 4;
        let n = 257;
        let outs = run(world, |c| {
            let mut sum = vec![f32::NAN; n];
            for _ in 0..3 {
                c.all_reduce_sum(&vals(c.rank(), n), &mut sum).unwrap();
            }
            sum
        });
        let want: Vec<u32> = (0..n)
            .map(|i| (((vals(0, n)[i] + vals(1, n)[i]) + vals(2, n)[i]) + vals(3, n)[i]).to_bits())
            .collect();
        for o in &outs {
            assert_eq!(o.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want);
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
            format!("{:#}", c.all_reduce_sum(&[1.0; 4], &mut out).unwrap_err())
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
            let mut out = vec![0.0; 16];
            if c.rank() == 0 {
                c.all_reduce_sum(&[1.0; 8], &mut out[..8])
            } else {
                c.all_gather(&[1.0; 8], &mut out)
            }
        });
        for r in res {
            assert!(format!("{:#}", r.unwrap_err()).contains("ranks disagree"));
        }
    }
}
