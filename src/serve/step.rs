//! Runs a scheduler's [`StepPlan`] on the runner's model, with the block
//! tables of the scheduler's KV manager.
//!
//! `Runner::step` allocates through the runner's own `KvManager`; in the
//! server the scheduler owns allocation (it must, to preempt and to admit
//! with prefix hits), so this is the same batch construction reading slot
//! mappings and block tables from the scheduler's manager, allocating
//! nothing. (Suggested refactor: `Runner::step` = allocate, then this.)

use crate::kv::KvManager;
use crate::model::StepInput;
use crate::runner::Runner;
use crate::scheduler::StepPlan;
use anyhow::{bail, Context, Result};

/// Runs every planned sequence of `plan` in one forward pass. Returns, per
/// planned sequence in plan order, the logits of its last row when it is
/// due for sampling (`sample`), else an empty vector.
pub fn run_plan(runner: &mut Runner, kv: &KvManager, plan: &StepPlan) -> Result<Vec<Vec<f32>>> {
    let ctx = runner.model.cfg.context_length;
    let mut tokens = Vec::with_capacity(plan.n_tokens());
    let mut positions = Vec::with_capacity(plan.n_tokens());
    let mut row_seq = Vec::with_capacity(plan.n_tokens());
    let mut slots = Vec::with_capacity(plan.n_tokens());
    let mut logit_rows = Vec::new();
    let mut tables: Vec<&[u32]> = Vec::with_capacity(plan.seqs.len());
    // Copy-on-write copies first: a later sequence may read a block that an
    // earlier one's copy fills.
    for s in &plan.seqs {
        for c in &s.copies {
            runner.storage.copy_block(c.src, c.dst).with_context(|| {
                format!("copying KV block {} -> {} for {}", c.src, c.dst, s.seq)
            })?;
        }
    }
    for (si, s) in plan.seqs.iter().enumerate() {
        let n = s.tokens.len();
        if n == 0 {
            bail!("planned sequence {} has no tokens", s.seq);
        }
        let end = s.start + n;
        if end > ctx {
            bail!(
                "sequence {} reaches position {end}, past the model's context length {ctx}",
                s.seq
            );
        }
        let sl = kv
            .slot_mapping(s.seq, s.start, n)
            .with_context(|| format!("slot mapping of {}", s.seq))?;
        let table = kv
            .block_table(s.seq)
            .with_context(|| format!("no block table for {}", s.seq))?;
        let base = tokens.len();
        tokens.extend_from_slice(&s.tokens);
        positions.extend((s.start..end).map(|p| p as u32));
        row_seq.extend(std::iter::repeat_n(si as u32, n));
        slots.extend_from_slice(&sl);
        if s.sample {
            logit_rows.push(base + n - 1);
        }
        tables.push(table);
    }
    let input = StepInput {
        tokens: &tokens,
        positions: &positions,
        row_seq: &row_seq,
        slots: &slots,
        block_tables: &tables,
        logit_rows: &logit_rows,
    };
    let logits = runner
        .model
        .forward(&runner.gguf, &runner.dx, &mut runner.storage, &input)?;
    let v = runner.model.cfg.vocab_size;
    if logits.len() != logit_rows.len() * v {
        bail!(
            "the model returned {} logits for {} rows of vocabulary {v}",
            logits.len(),
            logit_rows.len()
        );
    }
    let mut out = Vec::with_capacity(plan.seqs.len());
    let mut k = 0;
    for s in &plan.seqs {
        if s.sample {
            out.push(logits[k * v..(k + 1) * v].to_vec());
            k += 1;
        } else {
            out.push(Vec::new());
        }
    }
    Ok(out)
}
