//! The runner's recurrent state for hybrid models: the state arrays of
//! every Gated DeltaNet layer, and which sequence owns which slot.
//!
//! A sequence gets a fresh, zeroed slot whenever it steps from position 0
//! (a new sequence, or one recomputed after preemption), keeps it while it
//! steps forward, and gives it back when freed. A sequence cannot resume
//! past position 0 without its slot: the state of its earlier tokens
//! exists nowhere else (prefix-cache hits need state snapshots, which this
//! runner does not keep; callers turn prefix caching off for hybrids).

use super::SeqWork;
use crate::kv::{RecurrentStates, SeqId, StateSlots};
use crate::model::ModelConfig;
use anyhow::{bail, Context, Result};

pub(crate) struct HybridState {
    pub(crate) states: RecurrentStates,
    slots: StateSlots,
}

impl HybridState {
    /// States for `n_slots` sequences of a hybrid model (None for a model
    /// without recurrent layers).
    pub(crate) fn new(cfg: &ModelConfig, n_slots: usize) -> Result<Option<HybridState>> {
        let Some(g) = &cfg.gdn else { return Ok(None) };
        let n_rec = (0..cfg.n_layers).filter(|&i| cfg.is_recurrent(i)).count();
        let conv_len = g.conv_kernel.saturating_sub(1) * g.conv_dim();
        let ssm_len = g.n_v_heads * g.d_k * g.d_v;
        let states = RecurrentStates::new(n_rec, n_slots, conv_len, ssm_len)
            .context("allocating the recurrent state")?;
        Ok(Some(HybridState {
            states,
            slots: StateSlots::new(n_slots)?,
        }))
    }

    /// Each row's state slot for a step over `work`: consecutive rows of a
    /// sequence share its slot.
    pub(crate) fn row_slots(&mut self, work: &[SeqWork<'_>]) -> Result<Vec<u32>> {
        let mut rows = Vec::with_capacity(work.iter().map(|w| w.tokens.len()).sum());
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
                self.states.reset(s)?;
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
        Ok(rows)
    }

    pub(crate) fn release(&mut self, seq: SeqId) {
        self.slots.release(seq);
    }
}
