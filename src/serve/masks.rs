//! Grammar masks for a decode step drawn on the device: every constrained
//! row's mask is computed before the step (rows in parallel) and goes up
//! with it as 32-id words, so the device draws among the allowed ids and
//! no logits come down. The host then only advances each grammar past
//! its row's token.

use super::engine::Seq;
use crate::constrain::Constraint;
use crate::kv::SeqId;
use crate::sampler::{RowMasks, TokenMask, WordMask};
use crate::scheduler::StepPlan;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Fills `out` with the masks of `plan`'s rows (one per planned sequence,
/// in plan order; rows without a grammar unmasked) over `vocab` ids.
/// False when some mask cannot be had (a grammar with no way on): the step
/// then samples on the host, which reports that row's error alone.
pub(super) fn step_masks(
    seqs: &mut BTreeMap<SeqId, Seq>,
    plan: &StepPlan,
    vocab: usize,
    out: &mut RowMasks,
) -> bool {
    out.reset(plan.seqs.len(), vocab);
    let planned: Vec<SeqId> = plan.seqs.iter().map(|ss| ss.seq).collect();
    let grammars: Vec<&mut Constraint> = seqs
        .iter_mut()
        .filter(|(id, _)| planned.contains(id))
        .filter_map(|(_, s)| s.constraint.as_mut())
        .collect();
    // A mask reads only the tokens already committed.
    grammars.into_par_iter().for_each(Constraint::prepare);
    for (i, ss) in plan.seqs.iter().enumerate() {
        let Some(s) = seqs.get_mut(&ss.seq) else {
            continue;
        };
        let stops = &s.req.stop_ids;
        if let Some(c) = s.constraint.as_mut() {
            match c.allows(stops) {
                Ok(a) => a.write_words(out.row_mut(i)),
                Err(_) => return false,
            }
        }
    }
    true
}

/// A constrained row's token drawn on the device under `mask`: a greedy
/// row whose allowed logits were all -inf comes back with the row's
/// first maximum, which may be refused; the host sampler's choice is then
/// the first allowed id. Advances the grammar past the token (not past a
/// stop token). The error is the sequence's end message.
pub(super) fn device_pick(
    s: &mut Seq,
    tok: u32,
    mask: Option<WordMask<'_>>,
) -> Result<u32, String> {
    let Some(c) = s.constraint.as_mut() else {
        return Ok(tok);
    };
    let mask = mask.ok_or("grammar: the step ran without this row's mask")?;
    let tok = if mask.allows(tok) {
        tok
    } else {
        mask.first_allowed()
            .ok_or("grammar: no token can continue the output")?
    };
    if !s.req.stop_ids.contains(&tok) {
        c.commit(tok).map_err(|e| format!("{e:#}"))?;
    }
    Ok(tok)
}
