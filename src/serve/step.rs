//! Runs a scheduler's [`StepPlan`] on the runner's model, with the block
//! tables of the scheduler's KV manager (the scheduler owns allocation: it
//! must, to preempt and to admit with prefix hits).

use crate::kv::KvManager;
use crate::runner::{Logits, LogitsWanted, Runner, SeqWork};
use crate::scheduler::StepPlan;
use anyhow::{Context, Result};

/// Runs every planned sequence of `plan` in one forward pass. Returns, per
/// planned sequence in plan order, the logits of its last row when it is
/// due for sampling (`sample`), else an empty slice.
pub fn run_plan(runner: &mut Runner, kv: &KvManager, plan: &StepPlan) -> Result<Logits> {
    // Copy-on-write copies first: a later sequence may read a block that an
    // earlier one's copy fills.
    for s in &plan.seqs {
        for c in &s.copies {
            runner.copy_block(c.src, c.dst).with_context(|| {
                format!("copying KV block {} -> {} for {}", c.src, c.dst, s.seq)
            })?;
        }
    }
    let work: Vec<SeqWork> = plan
        .seqs
        .iter()
        .map(|s| SeqWork {
            seq: s.seq,
            tokens: &s.tokens,
            start_pos: s.start,
            logits: if s.sample {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            },
        })
        .collect();
    runner.step_with_kv(kv, &work)
}
