//! Greedy decode steps whose next tokens never leave the device on the
//! critical path. A step replays the decode graph as `decode_step` does,
//! then `argmax_rows` (backend/cuda/launch/argmax.rs, the sampler's
//! greedy rule) writes each row's token into a ring slot; a second stream
//! copies the slot to page-locked memory while the main stream goes on.
//! A chained step copies the previous slot's tokens into the graph's
//! token input on the device, so the host can enqueue step i + 1 before
//! step i's token has reached it (`Runner::decode_greedy` keeps one step
//! ahead). The logits never cross to the host: a step no longer waits on
//! their download (SmolLM2: 192 KiB, about 25 us of a 690 us step on an
//! H100).
//!
//! Ordering (event tracking is off, so it is all explicit):
//! - slot s's argmax (main stream) records `chosen[s]`; the side stream
//!   waits on it, downloads the slot and records `landed[s]`;
//! - before an argmax rewrites slot s, the main stream waits on
//!   `landed[s]` (the download of its last use);
//! - a chained step reads the previous slot on the main stream, after
//!   that slot's argmax in stream order;
//! - the host reads a slot only through `greedy_wait`, which synchronizes
//!   on `landed[s]`; at most RING tickets are out, waited in order.

use super::{CudaExec, DecodeFn, DevKvCache};
use crate::backend::cuda::{drv, CudaBackend};
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use std::sync::Arc;

/// Greedy steps that may be in flight at once (ring slots).
const RING: usize = 4;

/// The ring of greedy results, sized for `cap` rows per step.
pub(super) struct Greedy {
    cap: usize,
    /// Per slot (2 cap,) u32: tokens (cap), then status (cap).
    dev: Vec<CudaSlice<u32>>,
    /// The same, page-locked, written by the side stream.
    host: Vec<PinnedHostSlice<u32>>,
    side: Arc<CudaStream>,
    chosen: Vec<CudaEvent>,
    landed: Vec<CudaEvent>,
    /// Rows of the step that last used each slot (0: never used).
    rows: [usize; RING],
    issued: u64,
    waited: u64,
}

impl Greedy {
    fn new(be: &CudaBackend, cap: usize) -> Result<Self> {
        let st = be.stream();
        let side = drv(st.fork(), "greedy decode: a download stream")?;
        let mut dev = Vec::with_capacity(RING);
        let mut host = Vec::with_capacity(RING);
        let mut chosen = Vec::with_capacity(RING);
        let mut landed = Vec::with_capacity(RING);
        for _ in 0..RING {
            dev.push(crate::backend::cuda::mem::zeros::<u32>(
                be,
                2 * cap,
                "greedy decode: tokens",
            )?);
            host.push(be.pinned_u32(2 * cap)?);
            chosen.push(drv(st.record_event(None), "greedy decode: events")?);
            landed.push(drv(side.record_event(None), "greedy decode: events")?);
        }
        Ok(Greedy {
            cap,
            dev,
            host,
            side,
            chosen,
            landed,
            rows: [0; RING],
            issued: 0,
            waited: 0,
        })
    }
}

/// A greedy step in flight; [`CudaExec::greedy_wait`] returns its tokens.
#[must_use = "a greedy step's tokens must be waited for"]
pub struct GreedyTicket(u64);

impl CudaExec {
    /// Enqueues a decode step (as [`CudaExec::decode_step`]: one row per
    /// sequence) and the greedy choice of each row's next token, without
    /// waiting for either. With `chain`, the step's tokens are the
    /// previous greedy step's choices (which must have had as many rows);
    /// `input.tokens` then only gives the row count.
    pub fn decode_step_greedy(
        &self,
        vocab: usize,
        input: &crate::model::StepInput<'_>,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
        chain: bool,
    ) -> Result<GreedyTicket> {
        let b = input.tokens.len();
        let mut lock = self
            .greedy
            .lock()
            .map_err(|_| anyhow!("cuda: greedy lock poisoned"))?;
        if lock.as_ref().is_none_or(|g| g.cap < b) {
            ensure!(
                lock.as_ref().is_none_or(|g| g.issued == g.waited),
                "greedy decode: a step of {b} rows while smaller steps are in flight"
            );
            *lock = Some(Greedy::new(&self.be, b.next_power_of_two())?);
        }
        let g = lock.as_mut().ok_or_else(|| anyhow!("greedy ring missing"))?;
        ensure!(
            g.issued - g.waited < RING as u64,
            "greedy decode: {RING} steps already in flight"
        );
        let s = (g.issued % RING as u64) as usize;
        let p = (s + RING - 1) % RING;
        if chain {
            ensure!(
                g.issued > 0 && g.rows[p] == b,
                "greedy decode: a chained step of {b} rows needs a previous greedy step of {b} rows"
            );
        }
        let st = self.be.stream();
        if g.rows[s] != 0 {
            // The slot's last download must be done before its rewrite.
            drv(st.wait(&g.landed[s]), "greedy decode: slot reuse")?;
        }
        let cap = g.cap;
        let [prev, cur] = g
            .dev
            .get_disjoint_mut([p, s])
            .map_err(|e| anyhow!("greedy ring slots: {e:?}"))?;
        let prev_view = prev.slice(0..b);
        let (chosen, landed) = (&g.chosen[s], &g.landed[s]);
        let (side, host) = (&g.side, &mut g.host[s]);
        self.decode_run(
            vocab,
            input,
            kv,
            step,
            chain.then_some(&prev_view),
            |be, dg| {
                {
                    let (mut toks, mut stat) = cur.split_at_mut(cap);
                    be.d_argmax_rows(
                        &dg.out.slice(0..b * vocab),
                        b,
                        vocab,
                        &mut toks,
                        &mut stat,
                    )?;
                }
                drv(chosen.record(&be.stream()), "greedy decode: events")?;
                drv(side.wait(chosen), "greedy decode: download stream")?;
                drv(side.memcpy_dtoh(&*cur, host), "greedy decode: tokens")?;
                drv(landed.record(side), "greedy decode: events")
            },
        )?;
        g.rows[s] = b;
        g.issued += 1;
        Ok(GreedyTicket(g.issued - 1))
    }

    /// Waits for a greedy step (tickets in the order issued) and returns
    /// its tokens, one per row. A row whose logits held a NaN or +inf is
    /// an error, as the sampler makes it.
    pub fn greedy_wait(&self, t: GreedyTicket) -> Result<Vec<u32>> {
        let mut lock = self
            .greedy
            .lock()
            .map_err(|_| anyhow!("cuda: greedy lock poisoned"))?;
        let g = lock
            .as_mut()
            .ok_or_else(|| anyhow!("greedy decode: no step in flight"))?;
        ensure!(
            t.0 == g.waited,
            "greedy decode: step {} waited before step {}",
            t.0,
            g.waited
        );
        let s = (t.0 % RING as u64) as usize;
        drv(g.landed[s].synchronize(), "greedy decode: tokens")?;
        g.waited += 1;
        let (b, cap) = (g.rows[s], g.cap);
        let host = drv(g.host[s].as_slice(), "greedy decode: tokens")?;
        if let Some(r) = host[cap..cap + b].iter().position(|&v| v != 0) {
            bail!("sample: row {r}'s logits hold a NaN or +inf (greedy choice on the device)");
        }
        Ok(host[..b].to_vec())
    }
}
