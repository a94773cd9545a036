//! Decode graphs: a decode step's inputs staged into fixed device
//! buffers, the step captured once per (batch size, split-KV bucket,
//! greedy) as a CUDA graph (on sm_90+ instantiated with programmatic
//! edges) and replayed after; a greedy graph's last node chooses the
//! next tokens (greedy.rs), any other's copies the logits out.

use super::{CudaExec, DevBatch, DevBuf, DevIdx, DevKvCache, StepBufs};
use crate::backend::cuda::device::memory::{upload_if_changed, zeros, DevAttnBatch};
use crate::backend::cuda::device::step_times;
use crate::backend::cuda::{drv, CudaBackend, GreedyRing, PdlExec};
use crate::backend::AttnBatch;
use crate::dispatch::Exec;
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};
use std::sync::Arc;

/// A decode graph's key: (batch size, split-KV CTAs per row and head,
/// greedy: its last node chooses the next tokens instead of copying the
/// logits out).
pub(super) type GraphKey = (usize, usize, bool);

/// Where a greedy graph's sample_rows reads its draw records and writes
/// (decode_finish).
pub(super) struct GreedyOut<'g> {
    pub(super) b: usize,
    pub(super) vocab: usize,
    /// Device address of the graph's draw records (b, DRAW_WORDS).
    pub(super) draws: u64,
    /// Device address of the graph's tokens: (b tokens, b statuses).
    pub(super) tokens: u64,
    pub(super) ring: &'g Arc<crate::backend::cuda::GreedyRing>,
    /// Device address of the graph's step words (DevAttnBatch::step_words:
    /// b positions, b slots, b tokens, b statuses, the advance's ticket).
    pub(super) steps: u64,
}

/// Which graph a decode step replays, and where its tokens come from.
#[derive(Clone, Copy)]
pub(super) struct GraphSel<'d> {
    /// `graph_key` of the step (`.2`: a greedy graph, greedy.rs).
    pub(super) key: GraphKey,
    /// A greedy step's previous greedy step's graph, whose tokens are this
    /// step's (None: uploaded from `input.tokens`).
    pub(super) chain: Option<GraphKey>,
    /// A greedy graph's draw records (b, DRAW_WORDS), uploaded where they
    /// differ from the graph's last ones; empty: every row greedy.
    pub(super) draws: &'d [u32],
    /// The step synchronizes the stream before it returns (its logits are
    /// downloaded), so its staging needs no event.
    pub(super) synced: bool,
}

/// A decode graph's fixed inputs as a step's buffers, and (greedy graphs)
/// where its last node, sample_rows, reads and writes.
pub(super) struct GraphIo<'g> {
    pub(super) bufs: StepBufs<DevIdx<'g>, DevBatch<'g>>,
    pub(super) fin: Option<GreedyOut<'g>>,
}

impl<'g> GraphIo<'g> {
    /// The inputs of a graph of `b` rows (its fields, borrowed one by one
    /// so that its `out` stays free to be written).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn of(
        batch: &'g DevAttnBatch,
        rows: &'g CudaSlice<u32>,
        state_slots: &'g CudaSlice<u32>,
        greedy: Option<&'g GreedyBufs>,
        b: usize,
        vocab: usize,
        st: &Arc<CudaStream>,
    ) -> Result<Self> {
        // Greedy graphs end with sample_rows into their own token input.
        let fin = match greedy {
            Some(g) => Some(GreedyOut {
                b,
                vocab,
                draws: g.draws.device_ptr(st).0,
                tokens: batch.tokens_and_status()?.device_ptr(st).0,
                ring: &g.ring,
                steps: batch.step_words()?.device_ptr(st).0,
            }),
            None => None,
        };
        let bufs = StepBufs {
            n: b,
            n_rows: b,
            tokens: DevIdx::View(batch.tokens()?),
            // The attention batch's positions serve rope and the KV write
            // too: one upload.
            positions: DevIdx::View(batch.positions()),
            slots: DevIdx::View(batch.slots()?),
            state_slots: DevIdx::View(state_slots.slice(0..b)),
            rows: DevIdx::View(rows.slice(0..b)),
            // decode_run checked that every row wants its logits, in order.
            rows_all: true,
            hidden: false,
            batch: DevBatch::Fixed(batch),
        };
        Ok(GraphIo { bufs, fin })
    }
}

/// A decode step's ops on fixed buffers (`forward_bufs`): its logits.
pub type DecodeFn<'f> = dyn FnMut(&CudaExec, &mut DevKvCache, &StepBufs<DevIdx<'_>, DevBatch<'_>>) -> Result<Option<DevBuf>>
    + 'f;

/// A captured, instantiated graph, and on sm_90+ the same graph
/// instantiated with programmatic kernel-to-kernel edges, which is the one
/// launched (`backend::cuda::pdl`).
pub(super) struct SendGraph(pub(super) CudaGraph, pub(super) Option<PdlExec>);

// SAFETY: CUDA graph handles are not tied to a thread; every use (launch,
// destroy) binds the context first and is serialized by `CudaExec::graphs`.
unsafe impl Send for SendGraph {}

/// Page-locked staging of decode inputs: the table offsets, block tables,
/// positions, slots and tokens (DevAttnBatch::refill), (B * (stride + 4),) for a
/// step of B rows, then the draw records. Async copies: the positions,
/// slots and tokens in one (not the tokens in a greedy chain), the tables
/// and the draws when they changed (`mem::upload_if_changed`; from
/// pageable memory each upload cost the host a staging copy of its own:
/// about 14 of a SmolLM2 step's 700 us on an H100). Invariant: the host
/// writes the buffer only after the last copies that read it have run
/// (`pending` says how to know).
#[derive(Default)]
pub(super) struct Staging {
    pub(super) buf: Option<PinnedHostSlice<u32>>,
    /// The event recorded behind copies (made once, then re-recorded).
    pub(super) event: Option<CudaEvent>,
    pub(super) pending: Pending,
}

/// What the last copies from the staging left to wait for.
#[derive(Default, Clone, Copy)]
pub(super) enum Pending {
    /// Nothing: no copy read it since the last `take` waited.
    #[default]
    Nothing,
    /// `Staging::event`, recorded behind them.
    Event,
    /// A stream synchronization begun after this ticket
    /// (`CudaBackend::sync_ticket`): the copies' step synchronizes the
    /// stream at its end anyway (it returns its logits), so it records no
    /// event and the next `take` waits for nothing unless it failed first.
    Ticket(u64),
}

impl Staging {
    /// The first `len` values of the buffer (grown when too small), once
    /// the copies of its last use have run (long done when that step
    /// synchronized on its logits; not if it failed half way).
    fn take(&mut self, be: &CudaBackend, len: usize) -> Result<&mut [u32]> {
        match (self.pending, &self.event) {
            (Pending::Event, Some(e)) => drv(e.synchronize(), "decode inputs")?,
            (Pending::Ticket(t), _) if !be.synced_past(t) => be.sync("decode inputs")?,
            _ => {}
        }
        self.pending = Pending::Nothing;
        let buf = match self.buf.take() {
            Some(b) if b.len() >= len => b,
            // Sized for the next batch sizes too (steps grow one sequence
            // at a time while a server fills up).
            _ => be.pinned_u32(len.next_power_of_two())?,
        };
        let buf = self.buf.insert(buf);
        Ok(&mut drv(buf.as_mut_slice(), "decode inputs")?[..len])
    }

    /// Notes that the copies just issued from the buffer on `st` are the
    /// last to read it: a ticket when their step synchronizes the stream
    /// before it returns (`synced`; one driver call fewer each way), else
    /// the event recorded behind them.
    fn mark(
        &mut self,
        be: &CudaBackend,
        st: &Arc<cudarc::driver::CudaStream>,
        synced: bool,
    ) -> Result<()> {
        if synced {
            self.pending = Pending::Ticket(be.sync_ticket());
            return Ok(());
        }
        match &self.event {
            Some(e) => drv(e.record(st), "decode inputs")?,
            None => self.event = Some(drv(st.record_event(None), "decode inputs")?),
        }
        self.pending = Pending::Event;
        Ok(())
    }
}

/// A greedy graph's buffers beyond the step's.
pub(super) struct GreedyBufs {
    /// The page-locked ring its sample_rows writes.
    pub(super) ring: Arc<GreedyRing>,
    /// The draw records sample_rows reads (b, DRAW_WORDS).
    pub(super) draws: CudaSlice<u32>,
    /// The host's copy of what `draws` holds (zeros: every row greedy).
    pub(super) held: Option<Vec<u32>>,
}

/// Fixed inputs, fixed logits buffer and the captured graph of the decode
/// steps of one batch size (one row per sequence, every row's logits).
pub(super) struct DecodeGraph {
    pub(super) rows: CudaSlice<u32>,
    pub(super) batch: DevAttnBatch,
    /// (B, vocab) logits, written by the graph's last node (greedy graphs:
    /// unused).
    pub(super) out: CudaSlice<f32>,
    /// Greedy graphs: what their last nodes read and write.
    pub(super) greedy: Option<GreedyBufs>,
    /// Hybrid models: each row's recurrent state slot (b,), and the host's
    /// copy of what it holds (uploaded when it changes).
    pub(super) state_slots: (CudaSlice<u32>, Option<Vec<u32>>),
    pub(super) graph: Option<SendGraph>,
    /// A step of this key ran op by op (its L2 read-ahead measured).
    pub(super) warm: bool,
    /// Captures of this key that failed since the last that worked.
    pub(super) capture_attempts: u32,
    /// Its captures failed `capture::CAPTURE_ATTEMPTS` times: run its
    /// steps op by op.
    pub(super) capture_failed: bool,
    /// Scratch arena size at capture: a larger arena is a new allocation,
    /// and the graph must be captured again.
    pub(super) arena_len: usize,
    /// The L2 read-ahead branch's buffers (tuning `matvec.l2_ahead_mb`;
    /// None: off).
    pub(super) l2: Option<crate::backend::cuda::L2Bufs>,
    /// Replays so far (the read-ahead trace's sampling, `l2_trace`).
    pub(super) replays: u64,
    /// The read-ahead distance the uncaptured step's weights call for (0:
    /// the graph gets no branch; None: not measured).
    pub(super) l2_measured: Option<u64>,
}

impl CudaExec {
    /// Runs a decode step (one row per sequence, every row's logits) with
    /// fixed input buffers, as a CUDA graph captured right after the first
    /// step of a batch size (which runs op by op) and replayed after. `step` runs the model's ops on the
    /// given inputs and returns its logits buffer (forward_bufs).
    #[allow(clippy::type_complexity)]
    pub fn decode_step(
        &self,
        vocab: usize,
        input: &crate::dispatch::StepInput<'_>,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
    ) -> Result<crate::dispatch::HostLogits> {
        let b = input.tokens.len();
        let sel = GraphSel {
            key: Self::graph_key(input, false),
            chain: None,
            draws: &[],
            synced: true,
        };
        self.decode_run(vocab, input, kv, step, sel, |be, g| {
            be.down_logits(&g.out, b * vocab, "decode step logits")
        })
    }

    /// The graph key of a step: (rows, split-KV CTAs per row and head,
    /// greedy).
    pub(super) fn graph_key(input: &crate::dispatch::StepInput<'_>, greedy: bool) -> GraphKey {
        // Split-KV CTAs are baked into a graph: one graph per power-of-two
        // bucket of the longest row's partial count.
        let max_pos = input.positions.iter().copied().max().unwrap_or(0) as usize;
        let ctas = crate::backend::cuda::device::memory::att_parts(max_pos).next_power_of_two();
        (input.tokens.len(), ctas, greedy)
    }

    /// The body of [`CudaExec::decode_step`]: stages the inputs, captures
    /// or replays graph `key` (`graph_key`), then runs `after` on the graph
    /// under the graphs lock. Without `greedy` the graph's last node copies
    /// the logits into `out`. With it (greedy.rs), its last node is
    /// sample_rows writing each row's next token into `tokens` (the next
    /// replay's input), its status after them, and both into the graph's
    /// host `ring`; with `sel.chain` the step's tokens
    /// are not uploaded (`input.tokens` only gives their count): they are
    /// the previous greedy step's, already in place or copied from that
    /// step's graph.
    pub(super) fn decode_run<R>(
        &self,
        vocab: usize,
        input: &crate::dispatch::StepInput<'_>,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
        sel: GraphSel<'_>,
        after: impl FnOnce(&CudaBackend, &DecodeGraph) -> Result<R>,
    ) -> Result<R> {
        let b = input.tokens.len();
        input.validate(vocab)?;
        crate::backend::validate::kv_slots(input.slots, Self::kv_cells(kv))?;
        anyhow::ensure!(
            input.logit_rows.len() == b
                && input.logit_rows.iter().enumerate().all(|(i, &r)| r == i),
            "decode graph: every row must want its logits, in order"
        );
        self.be.bind()?;
        let mut graphs = self
            .graphs
            .lock()
            .map_err(|_| anyhow!("cuda: graph lock poisoned"))?;
        let (key, greedy) = (sel.key, sel.key.2);
        let ctas = key.1;
        if let std::collections::hash_map::Entry::Vacant(slot) = graphs.entry(key) {
            let rows: Vec<u32> = (0..b as u32).collect();
            // Greedy graphs: no logits copy (their tokens and statuses
            // are in the batch's step words).
            let nl = if greedy { 1 } else { b * vocab };
            slot.insert(DecodeGraph {
                rows: self.be.up(&rows, "decode rows")?,
                batch: DevAttnBatch::fixed(
                    &self.be,
                    b,
                    kv.table_stride(),
                    kv.geo.block_size,
                    kv.geo.n_blocks,
                    ctas,
                )?,
                out: zeros::<f32>(&self.be, super::pool::size_class(nl), "decode logits")?,
                greedy: if greedy {
                    let n = b * crate::backend::cuda::DRAW_WORDS;
                    Some(GreedyBufs {
                        ring: self.greedy_ring(b)?,
                        draws: zeros::<u32>(&self.be, n, "decode draws")?,
                        held: Some(vec![0; n]),
                    })
                } else {
                    None
                },
                state_slots: (zeros::<u32>(&self.be, b, "decode state slots")?, None),
                graph: None,
                warm: false,
                capture_attempts: 0,
                capture_failed: false,
                arena_len: 0,
                l2: None,
                replays: 0,
                l2_measured: None,
            });
        }
        let st = self.be.stream();
        // A chained step whose previous greedy step replayed another graph
        // (its split bucket changed): that graph's tokens are this one's.
        if let Some(pk) = sel.chain {
            if pk != key {
                let [p, c] = graphs.get_disjoint_mut([&pk, &key]);
                let (p, c) = p
                    .zip(c)
                    .ok_or_else(|| anyhow!("greedy decode: the previous step's graph is gone"))?;
                drv(
                    st.memcpy_dtod(&p.batch.tokens()?, &mut c.batch.tokens_mut()?),
                    "greedy decode: tokens from the previous graph",
                )?;
            }
        }
        let g = graphs
            .get_mut(&key)
            .ok_or_else(|| anyhow!("cuda: decode graph missing"))?;
        let mut staging = self
            .stage
            .lock()
            .map_err(|_| anyhow!("cuda: staging lock poisoned"))?;
        let nd = b * crate::backend::cuda::DRAW_WORDS;
        let stride = kv.table_stride();
        let stage = staging.take(&self.be, b * (stride + 4) + nd)?;
        let (stage, draw_stage) = stage.split_at_mut(b * (stride + 4));
        // Whether a copy read the staging (then its event is recorded).
        let mut copied = false;
        if let Some(GreedyBufs { draws: d, held, .. }) = g.greedy.as_mut() {
            // Only what changed goes up: a greedy chain's records stay zero.
            if sel.draws.is_empty() {
                draw_stage.fill(0);
            } else {
                ensure!(
                    sel.draws.len() == nd,
                    "decode step: {} draw words for {b} rows",
                    sel.draws.len()
                );
                draw_stage.copy_from_slice(sel.draws);
            }
            copied |= upload_if_changed(&self.be, held, draw_stage, d, "decode draws")?;
        }
        copied |= g.batch.refill(
            &self.be,
            &AttnBatch {
                block_tables: input.block_tables,
                row_seq: input.row_seq,
                positions: input.positions,
            },
            input.slots,
            // A chained step's tokens are on the device already.
            sel.chain.is_none().then_some(input.tokens),
            stride,
            stage,
        )?;
        if !input.state_slots.is_empty() {
            if let Some(st_geo) = kv.state_geometry() {
                st_geo.check_slots(input.state_slots)?;
            }
            let (d, held) = &mut g.state_slots;
            upload_if_changed(&self.be, held, input.state_slots, d, "decode state slots")?;
        }
        if copied {
            staging.mark(&self.be, st, sel.synced)?;
        }
        drop(staging);
        step_times::mark(step_times::Point::Uploaded);
        // Dropped (unknown) if the step fails before its replay is enqueued.
        let held_steps = g.batch.take_held_steps();
        if g.graph.is_some() && g.arena_len != self.be.arena_len() {
            g.graph = None;
        }
        // A graph not captured yet (or dropped: the arena grew) runs this
        // step op by op, then is captured right after it, with nothing in
        // between: the buffers the step used are back in the pool, so the
        // capture allocates nothing.
        let mut capture_after = false;
        if g.graph.is_none() {
            let io = GraphIo::of(
                &g.batch,
                &g.rows,
                &g.state_slots.0,
                g.greedy.as_ref(),
                b,
                vocab,
                st,
            )?;
            let bufs = &io.bufs;
            // The first step also measures the weights the graph will read
            // (whether it wants the L2 read-ahead branch).
            if !g.warm {
                if self.be.l2_wants_rows(b) {
                    self.be.l2_measure()?;
                } else {
                    g.l2_measured = Some(0);
                }
            }
            let r = step(self, kv, bufs).and_then(|l| {
                let l = l.ok_or_else(|| anyhow!("decode step returned no logits"))?;
                self.decode_finish(l, &mut g.out, io.fin.as_ref())
            });
            if let Some(d) = self.be.l2_measured()? {
                g.l2_measured = Some(d);
            }
            r?;
            self.count_path(|p| match g.capture_failed {
                true => p.eager += 1,
                false => p.warmup += 1,
            });
            g.warm = true;
            capture_after = !g.capture_failed;
        }
        if let Some(SendGraph(graph, pdl)) = &g.graph {
            step_times::mark(step_times::Point::Launch);
            match pdl {
                Some(exec) => self.be.launch_pdl(exec)?,
                None => drv(graph.launch(), "launching a decode graph")?,
            }
            step_times::mark(step_times::Point::Launched);
            if let Ok(mut c) = self.counts.lock() {
                c.entry("decode_graph").or_insert((0, 0.0)).0 += 1;
            }
            self.count_path(|p| p.graph += 1);
            if let Some(l2) = &g.l2 {
                self.be.l2_trace(l2, g.replays)?;
            }
            g.replays += 1;
        }
        // The step ran, or its replay is on the stream: a greedy one's
        // sample_rows advances the positions and slots.
        g.batch.hold_steps(held_steps, greedy);
        let r = after(&self.be, g)?;
        if capture_after {
            self.capture_or_retry(g, kv, step, b, vocab);
        }
        Ok(r)
    }

    /// A decode step's end: its logits buffer becomes the graph's `out`,
    /// or (`greedy`) sample_rows into the graph's tokens and ring.
    ///
    /// The logits are not copied: the step's buffer and `out` trade places
    /// (the pool gets `out`'s old buffer back when `logits` drops), so the
    /// graph's last kernel writes `out` itself. A copy node there was a
    /// full-dependency node of every replay. `out` may so have any
    /// capacity of at least the logits' length (pooled buffers come in
    /// size classes); readers take its first B * vocab values. Only a
    /// greedy graph's logits are not swapped.
    pub(super) fn decode_finish(
        &self,
        mut logits: DevBuf,
        out: &mut CudaSlice<f32>,
        greedy: Option<&GreedyOut<'_>>,
    ) -> Result<()> {
        if greedy.is_none() {
            let n = logits.len;
            if let Some(d) = logits.data.as_mut().filter(|d| d.len() >= n) {
                std::mem::swap(d, out);
                return Ok(());
            }
        }
        let l = Self::rd(&logits);
        match greedy {
            // SAFETY: the graph's batch holds (b tokens, b statuses) at
            // `tokens` (DevAttnBatch::tokens_and_status) and its 4 b + 1
            // step words at `steps`, whose positions and slots every node
            // before this one has finished reading (it is the step's last);
            // the step read its tokens first (stream order); its draws
            // buffer holds b records, written only by uploads ordered
            // before the graph on this stream.
            Some(f) => unsafe {
                self.be.d_sample_rows_at(
                    &l,
                    f.b,
                    f.vocab,
                    f.draws,
                    f.tokens,
                    f.tokens + 4 * f.b as u64,
                    Some((f.ring, f.steps)),
                )
            },
            None => drv(self.be.stream().memcpy_dtod(&l, out), "decode logits"),
        }
    }
}
