//! Decode steps whose next tokens are chosen on the device and never
//! leave it on the critical path ("greedy" graphs, named for their first
//! use; rows may also sample). Such a graph ends with `sample_rows`
//! (backend/cuda/ops/sample: the sampler's greedy rule, or its draw
//! given the step's uniform, bit for bit) instead of the logits copy: each row's token goes into the graph's own token input
//! (the next replay's) and into a slot of a page-locked ring mapped for
//! the device (one shared by the graphs of up to SHARED_RING_ROWS rows),
//! which the host reads once the step has completed. So a chained step
//! uploads no token, and the host can enqueue step i + 1 before step i's
//! token has reached it (`Runner::decode_greedy` keeps one step ahead):
//! its per-step work (KV allocation, input staging, graph launch)
//! overlaps the device's, and no step waits on a logits download
//! (SmolLM2: 192 KiB, about 25 us of a 690 us step on an H100).
//!
//! Ordering: a step's tokens are written by the graph's last node and read
//! by the next replay's first (stream order); the host reads ring slot
//! `position % GREEDY_SLOTS` after the step's event (recorded behind its
//! graph) has completed, and at most GREEDY_SLOTS steps, of consecutive
//! positions, are out at once, so no step rewrites a slot still unread.

use super::graph::{GraphKey, GraphSel};
use super::{CudaExec, DecodeFn, DevKvCache};
use crate::backend::cuda::{drv, GreedyRing, GREEDY_SLOTS};
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::CudaEvent;
use std::sync::Arc;

/// Greedy steps in flight: one event per ring slot, and counters.
#[derive(Default)]
pub(super) struct Greedy {
    /// Event i % GREEDY_SLOTS: recorded behind greedy step i's graph.
    done: Vec<CudaEvent>,
    /// The last greedy step's graph and first position (what a chained
    /// step continues from).
    last: Option<(GraphKey, u32)>,
    issued: u64,
    waited: u64,
}

/// A greedy step in flight; [`CudaExec::greedy_wait`] returns its tokens.
#[must_use = "a greedy step's tokens must be waited for"]
pub struct GreedyTicket {
    n: u64,
    key: GraphKey,
    slot: usize,
}

/// Rows of the ring that greedy graphs share: a page-locked allocation
/// costs up to milliseconds, and a server captures a graph per batch size
/// and split bucket (24 concurrent greedy requests on SmolLM2, H100,
/// seconds for the whole load: one ring per graph 1.00 / 0.99 against
/// 0.86 with host sampling; one shared ring 0.92 / 0.92 against 0.93 /
/// 0.84). Larger steps get a ring of their own.
const SHARED_RING_ROWS: usize = 1024;

impl CudaExec {
    /// The ring a greedy graph of `b` rows writes: the shared one, or its
    /// own past SHARED_RING_ROWS. Graphs capture its address, so the
    /// shared ring lives as long as the executor.
    pub(super) fn greedy_ring(&self, b: usize) -> Result<Arc<GreedyRing>> {
        if b > SHARED_RING_ROWS {
            return Ok(Arc::new(self.be.greedy_ring(b)?));
        }
        let mut r = self
            .shared_ring
            .lock()
            .map_err(|_| anyhow!("cuda: greedy ring lock poisoned"))?;
        if let Some(r) = r.as_ref() {
            return Ok(r.clone());
        }
        let ring = Arc::new(self.be.greedy_ring(SHARED_RING_ROWS)?);
        *r = Some(ring.clone());
        Ok(ring)
    }

    /// Enqueues a decode step (as [`CudaExec::decode_step`]: one row per
    /// sequence) whose graph also chooses each row's next token, without
    /// waiting for it. With `chain`, the step's tokens are the previous
    /// greedy step's choices: that step must have had as many rows and
    /// positions one lower; `input.tokens` then only gives the row count.
    /// `draws`: each row's draw record (`draw_record`, DRAW_WORDS words a
    /// row, each within `device_draws`); empty: every row greedy.
    pub fn decode_step_greedy(
        &self,
        vocab: usize,
        input: &crate::dispatch::StepInput<'_>,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
        chain: bool,
        draws: &[u32],
    ) -> Result<GreedyTicket> {
        let b = input.tokens.len();
        let pos0 = *input
            .positions
            .first()
            .ok_or_else(|| anyhow!("greedy decode: a step of no rows"))?;
        let mut g = self
            .greedy
            .lock()
            .map_err(|_| anyhow!("cuda: greedy lock poisoned"))?;
        ensure!(
            g.issued - g.waited < GREEDY_SLOTS as u64,
            "greedy decode: {GREEDY_SLOTS} steps already in flight"
        );
        let key = Self::graph_key(input, true);
        let from = match (chain, g.last) {
            (false, _) => None,
            (true, Some((pk, pp))) if pk.0 == b && pp.wrapping_add(1) == pos0 => Some(pk),
            (true, _) => bail!(
                "greedy decode: a chained step of {b} rows at position {pos0} needs a previous \
                 greedy step of {b} rows at position {}",
                pos0.wrapping_sub(1)
            ),
        };
        if g.issued != g.waited {
            // The slots of the steps out must be distinct.
            ensure!(
                from.is_some(),
                "greedy decode: an unchained step while greedy steps are in flight"
            );
        }
        self.decode_run(
            vocab,
            input,
            kv,
            step,
            GraphSel {
                key,
                chain: from,
                draws,
                synced: false,
            },
            |_, _| Ok(()),
        )?;
        let st = self.be.stream();
        let i = (g.issued % GREEDY_SLOTS as u64) as usize;
        if g.done.len() <= i {
            g.done
                .push(drv(st.record_event(None), "greedy decode: events")?);
        } else {
            drv(g.done[i].record(st), "greedy decode: events")?;
        }
        g.last = Some((key, pos0));
        g.issued += 1;
        Ok(GreedyTicket {
            n: g.issued - 1,
            key,
            slot: pos0 as usize % GREEDY_SLOTS,
        })
    }

    /// Waits for a greedy step (tickets in the order issued) and returns
    /// its tokens, one per row. A row whose logits held a NaN or +inf (or,
    /// sampled, only -inf) is an error, as the sampler makes it.
    pub fn greedy_wait(&self, t: GreedyTicket) -> Result<Vec<u32>> {
        let mut g = self
            .greedy
            .lock()
            .map_err(|_| anyhow!("cuda: greedy lock poisoned"))?;
        ensure!(
            t.n == g.waited,
            "greedy decode: step {} waited before step {}",
            t.n,
            g.waited
        );
        let ev = g
            .done
            .get((t.n % GREEDY_SLOTS as u64) as usize)
            .ok_or_else(|| anyhow!("greedy decode: no event for step {}", t.n))?;
        drv(ev.synchronize(), "greedy decode: tokens")?;
        g.waited += 1;
        drop(g);
        let graphs = self
            .graphs
            .lock()
            .map_err(|_| anyhow!("cuda: graph lock poisoned"))?;
        let ring = graphs
            .get(&t.key)
            .and_then(|dg| dg.greedy.as_ref().map(|gb| &gb.ring))
            .ok_or_else(|| anyhow!("greedy decode: the step's graph is gone"))?;
        let (b, cap) = (t.key.0, ring.cap);
        let slot = ring.slot(t.slot)?;
        draw_statuses(&slot[cap..cap + b])?;
        Ok(slot[..b].to_vec())
    }
}

/// The sampler's error for the first row whose sample_rows status is not
/// 0 (ops/sample: 1 a NaN or +inf logit, 2 a sampled row of only -inf, 3
/// more candidates than the device draws), if any.
pub(super) fn draw_statuses(status: &[u32]) -> Result<()> {
    let Some(r) = status.iter().position(|&v| v != 0) else {
        return Ok(());
    };
    match status[r] {
        1 => bail!("sample: row {r}'s logits hold a NaN or +inf (choice on the device)"),
        2 => bail!("sample: every logit of row {r} is -inf (draw on the device)"),
        s => bail!("sample: row {r}: the device could not draw (status {s})"),
    }
}
