//! The runner's side of hybrid models' recurrent state: which sequence owns
//! which state slot. The numbers live beside the KV cache, in the
//! executor's memory (host `KvStorage`, or the device cache).
//!
//! A sequence gets a fresh slot whenever it steps from position 0 (a new
//! sequence, or one recomputed after preemption), which the step zeroes
//! first; it keeps the slot while it steps forward and gives it back when
//! freed. A sequence cannot resume past position 0 without its slot: the
//! state of its earlier tokens exists nowhere else (prefix-cache hits need
//! state snapshots, which this runner does not keep; callers turn prefix
//! caching off for hybrids).

use super::SeqWork;
use crate::kv::{SeqId, StateGeometry, StateSlots};
use crate::model::ModelConfig;
use anyhow::{bail, Context, Result};

pub(crate) struct HybridState {
    slots: StateSlots,
    /// The state arrays: the sequences' slots, then the snapshot slots.
    geo: StateGeometry,
}

/// A step's slots: each row's, and those to zero before the step.
pub(crate) struct StepSlots {
    pub(crate) rows: Vec<u32>,
    pub(crate) fresh: Vec<u32>,
}

impl HybridState {
    /// Slots for `n_slots` sequences of a hybrid model (None for a model
    /// without recurrent layers).
    pub(crate) fn new(
        cfg: &ModelConfig,
        n_slots: usize,
        n_snapshots: usize,
    ) -> Result<Option<HybridState>> {
        let Some(geo) = state_geometry(cfg, n_slots, n_snapshots)? else {
            return Ok(None);
        };
        Ok(Some(HybridState {
            slots: StateSlots::new(n_slots)?,
            geo,
        }))
    }

    /// The state arrays' shape.
    pub(crate) fn geometry(&self) -> StateGeometry {
        self.geo
    }

    /// Each row's state slot for a step over `work` (consecutive rows of
    /// a sequence share its slot), and the slots to zero first.
    pub(crate) fn step_slots(&mut self, work: &[SeqWork<'_>]) -> Result<StepSlots> {
        let mut rows = Vec::with_capacity(work.iter().map(|w| w.tokens.len()).sum());
        let mut fresh = Vec::new();
        for w in work {
            let slot = if w.start_pos == 0 {
                self.slots.release(w.seq);
                let s = self.slots.acquire(w.seq).with_context(|| {
                    format!(
                        "no free recurrent state slot for {} ({} slots, all in use)",
                        w.seq,
                        self.slots.n_slots()
                    )
                })?;
                fresh.push(s);
                s
            } else {
                match self.slots.get(w.seq) {
                    Some(s) => s,
                    None => bail!(
                        "{} resumes at position {} without a recurrent state: a hybrid \
                         model's sequence must be computed from position 0",
                        w.seq,
                        w.start_pos
                    ),
                }
            };
            rows.extend(std::iter::repeat_n(slot, w.tokens.len()));
        }
        Ok(StepSlots { rows, fresh })
    }

    pub(crate) fn release(&mut self, seq: SeqId) {
        self.slots.release(seq);
    }

    pub(crate) fn n_slots(&self) -> usize {
        self.slots.n_slots()
    }

    /// Snapshot slots after the sequences' own.
    pub(crate) fn n_snapshots(&self) -> usize {
        self.geo.n_slots - self.slots.n_slots()
    }

    /// The state-array slot of snapshot `snap`.
    pub(crate) fn snapshot_slot(&self, snap: u32) -> Result<u32> {
        let n = self.n_snapshots();
        anyhow::ensure!(
            (snap as usize) < n,
            "state snapshot {snap} out of range ({n} snapshots)"
        );
        Ok(self.slots.n_slots() as u32 + snap)
    }

    /// A fresh slot for `seq` (its old one given back first), to be filled
    /// by a copy: (the slot).
    pub(crate) fn take_slot(&mut self, seq: SeqId) -> Result<u32> {
        self.slots.release(seq);
        self.slots.acquire(seq).with_context(|| {
            format!(
                "no free recurrent state slot for {seq} ({} slots, all in use)",
                self.slots.n_slots()
            )
        })
    }

    /// The slot `seq` holds.
    pub(crate) fn slot_of(&self, seq: SeqId) -> Result<u32> {
        self.slots
            .get(seq)
            .with_context(|| format!("{seq} holds no recurrent state slot"))
    }
}

/// The recurrent state's shape for `n_slots` sequences and `n_snapshots`
/// snapshots of `cfg` (None for a model without recurrent layers); errors
/// on 0 slots or an overflowing size.
pub(crate) fn state_geometry(
    cfg: &ModelConfig,
    n_slots: usize,
    n_snapshots: usize,
) -> Result<Option<StateGeometry>> {
    let Some(g) = &cfg.gdn else { return Ok(None) };
    StateSlots::new(n_slots)?;
    let geo = StateGeometry {
        n_layers: (0..cfg.n_layers).filter(|&i| cfg.is_recurrent(i)).count(),
        n_slots: n_slots
            .checked_add(n_snapshots)
            .context("state slots + snapshots overflow")?,
        conv_len: g.conv_kernel.saturating_sub(1) * g.conv_dim(),
        ssm_len: g.n_v_heads * g.d_k * g.d_v,
    };
    geo.bytes().context("sizing the recurrent state")?;
    Ok(Some(geo))
}
