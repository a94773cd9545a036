//! The inputs of one forward step, as the runner builds them and every
//! executor reads them.

use anyhow::{bail, Result};

/// The inputs of one forward step over a batch of rows.
/// Row i is token `tokens[i]` of sequence `row_seq[i]` at `positions[i]`;
/// its K/V go to physical cell `slots[i]`.
pub struct StepInput<'a> {
    /// (n_rows,)
    pub tokens: &'a [u32],
    /// (n_rows,)
    pub positions: &'a [u32],
    /// (n_rows,) index into `block_tables`.
    pub row_seq: &'a [u32],
    /// (n_rows,) physical KV cell of each row.
    pub slots: &'a [u32],
    /// One block table per sequence of the step.
    pub block_tables: &'a [&'a [u32]],
    /// Rows whose logits are returned, in this order.
    pub logit_rows: &'a [usize],
    /// Hybrid models: (n_rows,) each row's recurrent state slot (a slot's
    /// rows consecutive, in position order); empty for other models.
    pub state_slots: &'a [u32],
    /// Hybrid models: state slots to zero before the step (sequences that
    /// start at position 0 in it).
    pub fresh_slots: &'a [u32],
    /// The rows of `logit_rows` give their final hidden state (the output
    /// norm's result, (rows, dim)) instead of logits: embeddings.
    pub hidden: bool,
}

impl StepInput<'_> {
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let n = self.tokens.len();
        if self.positions.len() != n || self.row_seq.len() != n || self.slots.len() != n {
            bail!(
                "step input: {} tokens, {} positions, {} row_seq, {} slots (must be equal)",
                n,
                self.positions.len(),
                self.row_seq.len(),
                self.slots.len()
            );
        }
        if !self.state_slots.is_empty() && self.state_slots.len() != n {
            bail!(
                "step input: {} state slots for {n} rows",
                self.state_slots.len()
            );
        }
        if let Some(&t) = self.tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {t} out of range for a vocabulary of {vocab}");
        }
        if let Some(&s) = self
            .row_seq
            .iter()
            .find(|&&s| s as usize >= self.block_tables.len())
        {
            bail!(
                "row_seq {s} out of range ({} block tables)",
                self.block_tables.len()
            );
        }
        Ok(())
    }
}
