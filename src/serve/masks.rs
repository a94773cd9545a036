//! Grammar masks for a decode step drawn on the device: every constrained
//! row's mask is computed while the step's forward runs (rows in
//! parallel) and goes up after it as 32-id words, so the device draws
//! among the allowed ids and no logits come down. The host then advances
//! each grammar past its row's token.

use super::seq::{Pick, Seq};
use crate::kv::SeqId;
use crate::sampler::{RowMasks, TokenMask, WordMask};
use crate::scheduler::StepPlan;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};

/// Fills `out` with the masks of `plan`'s rows (one per planned sequence,
/// in plan order; rows without a grammar unmasked) over `vocab` ids, rows
/// in parallel. Returns the rows whose grammar cannot go on (left
/// unmasked) with their end messages.
pub(super) fn step_masks(
    seqs: &mut BTreeMap<SeqId, Seq>,
    plan: &StepPlan,
    vocab: usize,
    out: &mut RowMasks,
) -> Vec<(usize, String)> {
    out.reset(plan.seqs.len(), vocab);
    let words = out.words();
    let at: HashMap<SeqId, usize> = plan
        .seqs
        .iter()
        .enumerate()
        .map(|(i, ss)| (ss.seq, i))
        .collect();
    let mut by_row: Vec<Option<&mut Seq>> = (0..plan.seqs.len()).map(|_| None).collect();
    for (id, s) in seqs.iter_mut() {
        if let Some(&i) = at.get(id) {
            by_row[i] = Some(s);
        }
    }
    let (flags, data) = out.parts_mut();
    // A mask reads only the tokens already committed.
    by_row
        .into_par_iter()
        .zip(flags.par_iter_mut())
        .zip(data.par_chunks_mut(words))
        .enumerate()
        .filter_map(|(i, ((s, flag), w))| {
            let s = s?;
            let stops = &s.req.stop_ids;
            match s.constraint.as_mut()?.allows(stops) {
                Ok(a) => {
                    a.write_words(w);
                    *flag = true;
                    None
                }
                Err(e) => Some((i, format!("{e:#}"))),
            }
        })
        .collect()
}

/// The plan row of each sequence the step samples.
pub(super) fn sampled_rows(plan: &StepPlan) -> HashMap<SeqId, usize> {
    plan.seqs
        .iter()
        .enumerate()
        .filter(|(_, ss)| ss.sample)
        .map(|(i, ss)| (ss.seq, i))
        .collect()
}

/// The constrained rows' picks of a step drawn on the device (`tokens`:
/// one per planned sequence, drawn under `masks`), each advancing its
/// grammar, rows in parallel: (plan row, pick).
pub(super) fn device_picks(
    seqs: &mut BTreeMap<SeqId, Seq>,
    plan: &StepPlan,
    tokens: &[u32],
    masks: &RowMasks,
) -> Vec<(usize, Result<Pick, String>)> {
    let at = sampled_rows(plan);
    seqs.iter_mut()
        .filter(|(_, s)| s.constraint.is_some())
        .filter_map(|(id, s)| Some((*at.get(id)?, s)))
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|(i, s)| {
            let r = device_pick(s, tokens[i], masks.row(i));
            (i, r.map(|tok| (tok, None)))
        })
        .collect()
}

/// A constrained row's token drawn on the device under `mask`: a greedy
/// row whose allowed logits were all -inf comes back with the row's
/// first maximum, which may be refused; the host sampler's choice is then
/// the first allowed id. Advances the grammar past the token (not past a
/// stop token). The error is the sequence's end message.
fn device_pick(s: &mut Seq, tok: u32, mask: Option<WordMask<'_>>) -> Result<u32, String> {
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
