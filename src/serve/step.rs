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
    let work = plan_work(runner, plan)?;
    runner.step_with_kv(kv, &work)
}

/// Runs a plan of decode rows only, each due for sampling, with the next
/// tokens chosen on the device (`Runner::step_greedy_with_kv`; `draws`
/// per planned sequence: None greedy, or its draw parameters and uniform):
/// one per planned sequence, in plan order. None where that cannot run
/// (not a pure decode plan, no decode graph here, or parameters the device
/// cannot draw).
pub fn run_plan_greedy(
    runner: &mut Runner,
    kv: &KvManager,
    plan: &StepPlan,
    draws: &[Option<(crate::sampler::DrawParams, f64)>],
) -> Result<Option<Vec<u32>>> {
    if !plan.seqs.iter().all(|s| s.sample && s.tokens.len() == 1)
        || !runner.greedy_on_device_rows(plan.seqs.len())
    {
        return Ok(None);
    }
    let work = plan_work(runner, plan)?;
    runner.step_greedy_with_kv(kv, &work, draws)
}

/// Runs a plan of decode rows only, each due for sampling, with the
/// tokens drawn on the device through grammar masks that `fill` writes
/// into `masks` while the forward runs (`Runner::step_draw_with_kv`):
/// one per planned sequence, in plan order. None where that cannot run
/// (`fill` not called).
pub fn run_plan_draw(
    runner: &mut Runner,
    kv: &KvManager,
    plan: &StepPlan,
    draws: &[Option<(crate::sampler::DrawParams, f64)>],
    masks: &mut crate::sampler::RowMasks,
    fill: &mut dyn FnMut(&mut crate::sampler::RowMasks),
) -> Result<Option<Vec<u32>>> {
    if !plan.seqs.iter().all(|s| s.sample && s.tokens.len() == 1)
        || !runner.masks_on_device(plan.seqs.len())
    {
        return Ok(None);
    }
    let work = plan_work(runner, plan)?;
    runner.step_draw_with_kv(kv, &work, draws, masks, fill)
}

/// The plan's copy-on-write block copies, done, and its work list.
fn plan_work<'p>(runner: &mut Runner, plan: &'p StepPlan) -> Result<Vec<SeqWork<'p>>> {
    // Copy-on-write copies first: a later sequence may read a block that an
    // earlier one's copy fills.
    for s in &plan.seqs {
        for c in &s.copies {
            runner.copy_block(c.src, c.dst).with_context(|| {
                format!("copying KV block {} -> {} for {}", c.src, c.dst, s.seq)
            })?;
        }
        // A hybrid's prefix-cache hit resumes from its state snapshot.
        if let Some(snap) = s.restore {
            runner.restore_state(s.seq, snap)?;
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
    Ok(work)
}
