//! Recurrent state of hybrid models, beside the paged KV cache.
//!
//! A Gated DeltaNet layer keeps, per sequence, a conv state (the last
//! kernel - 1 raw inputs of every channel) and an SSM state (one d_k x d_v
//! matrix per value head). Each sequence owns one *slot*: the same index in
//! every layer's arrays. [`StateSlots`] hands slots out (pure bookkeeping,
//! lowest free slot first, so ids are reproducible); [`RecurrentStates`]
//! holds the numbers in host memory.

use super::{KvError, SeqId};
use anyhow::{ensure, Context, Result};
use std::collections::{BTreeSet, HashMap};

/// Which sequence owns which state slot.
#[derive(Clone, Debug)]
pub struct StateSlots {
    n_slots: usize,
    free: BTreeSet<u32>,
    owner: HashMap<SeqId, u32>,
}

impl StateSlots {
    pub fn new(n_slots: usize) -> Result<StateSlots, KvError> {
        if n_slots == 0 || u32::try_from(n_slots).is_err() {
            return Err(KvError::InvalidConfig(format!(
                "{n_slots} recurrent state slots (need 1..=u32::MAX)"
            )));
        }
        Ok(StateSlots {
            n_slots,
            free: (0..n_slots as u32).collect(),
            owner: HashMap::new(),
        })
    }

    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    /// The slot of `seq`, if it holds one.
    pub fn get(&self, seq: SeqId) -> Option<u32> {
        self.owner.get(&seq).copied()
    }

    /// Gives `seq` the lowest free slot. Errors if it already holds one or
    /// none is free (the manager is unchanged then).
    pub fn acquire(&mut self, seq: SeqId) -> Result<u32, KvError> {
        if self.owner.contains_key(&seq) {
            return Err(KvError::SeqExists(seq));
        }
        let Some(&s) = self.free.iter().next() else {
            return Err(KvError::OutOfBlocks { needed: 1, free: 0 });
        };
        self.free.remove(&s);
        self.owner.insert(seq, s);
        Ok(s)
    }

    /// Returns `seq`'s slot to the free set; None if it held none.
    pub fn release(&mut self, seq: SeqId) -> Option<u32> {
        let s = self.owner.remove(&seq)?;
        self.free.insert(s);
        Some(s)
    }
}

/// The recurrent state arrays of every Gated DeltaNet layer: per layer,
/// conv (n_slots, conv_len) and ssm (n_slots, ssm_len), f32.
/// The shape of a model's recurrent state: `n_layers` recurrent layers,
/// `n_slots` sequences, per slot and layer `conv_len` conv and `ssm_len`
/// SSM values (f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateGeometry {
    pub n_layers: usize,
    pub n_slots: usize,
    pub conv_len: usize,
    pub ssm_len: usize,
}

impl StateGeometry {
    /// Bytes of every layer's arrays; errors when that overflows.
    pub fn bytes(&self) -> Result<usize> {
        let b = self
            .conv_len
            .checked_add(self.ssm_len)
            .and_then(|l| l.checked_mul(self.n_slots))
            .and_then(|l| l.checked_mul(self.n_layers))
            .and_then(|l| l.checked_mul(4))
            .context("recurrent state size overflows")?;
        ensure!(
            b <= isize::MAX as usize,
            "recurrent state of {b} bytes is too large"
        );
        Ok(b)
    }

    /// Errors unless every slot in `slots` is below `n_slots`.
    pub fn check_slots(&self, slots: &[u32]) -> Result<()> {
        if let Some(&s) = slots.iter().find(|&&s| s as usize >= self.n_slots) {
            anyhow::bail!("state slot {s} out of range ({} slots)", self.n_slots);
        }
        Ok(())
    }
}

pub struct RecurrentStates {
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
    conv_len: usize,
    ssm_len: usize,
    n_slots: usize,
}

impl RecurrentStates {
    /// Zeroed states for `n_layers` recurrent layers. Errors (before
    /// allocating) when the total would overflow.
    pub fn new(
        n_layers: usize,
        n_slots: usize,
        conv_len: usize,
        ssm_len: usize,
    ) -> Result<RecurrentStates> {
        let per_slot = conv_len
            .checked_add(ssm_len)
            .and_then(|l| l.checked_mul(n_slots))
            .and_then(|l| l.checked_mul(n_layers))
            .and_then(|l| l.checked_mul(4))
            .context("recurrent state size overflows")?;
        ensure!(
            per_slot <= isize::MAX as usize,
            "recurrent state of {per_slot} bytes is too large"
        );
        Ok(RecurrentStates {
            conv: (0..n_layers)
                .map(|_| vec![0.0; conv_len * n_slots])
                .collect(),
            ssm: (0..n_layers)
                .map(|_| vec![0.0; ssm_len * n_slots])
                .collect(),
            conv_len,
            ssm_len,
            n_slots,
        })
    }

    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// The arrays' shape.
    pub fn geometry(&self) -> StateGeometry {
        StateGeometry {
            n_layers: self.conv.len(),
            n_slots: self.n_slots,
            conv_len: self.conv_len,
            ssm_len: self.ssm_len,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.conv.len() * self.n_slots * (self.conv_len + self.ssm_len) * 4
    }

    /// Zeroes `slot` in every layer (a sequence starting at position 0).
    pub fn reset(&mut self, slot: u32) -> Result<()> {
        let s = slot as usize;
        ensure!(s < self.n_slots, "state slot {slot} of {}", self.n_slots);
        for c in &mut self.conv {
            c[s * self.conv_len..(s + 1) * self.conv_len].fill(0.0);
        }
        for m in &mut self.ssm {
            m[s * self.ssm_len..(s + 1) * self.ssm_len].fill(0.0);
        }
        Ok(())
    }

    /// Copies slot `src` into `dst` in every layer (a fork).
    pub fn copy_slot(&mut self, src: u32, dst: u32) -> Result<()> {
        let (a, b) = (src as usize, dst as usize);
        ensure!(
            a < self.n_slots && b < self.n_slots,
            "state slots {src} -> {dst} of {}",
            self.n_slots
        );
        for (arr, len) in [
            (&mut self.conv, self.conv_len),
            (&mut self.ssm, self.ssm_len),
        ] {
            for l in arr.iter_mut() {
                l.copy_within(a * len..(a + 1) * len, b * len);
            }
        }
        Ok(())
    }

    /// Recurrent layer `i`'s (conv, ssm) arrays, every slot.
    pub fn layer_mut(&mut self, i: usize) -> Result<(&mut [f32], &mut [f32])> {
        let n = self.conv.len();
        let conv = self
            .conv
            .get_mut(i)
            .with_context(|| format!("recurrent layer {i} of {n}"))?;
        let ssm = &mut self.ssm[i];
        Ok((conv, ssm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_lowest_first_with_exact_ids() {
        let mut s = StateSlots::new(3).unwrap();
        assert_eq!(s.acquire(SeqId(7)).unwrap(), 0);
        assert_eq!(s.acquire(SeqId(8)).unwrap(), 1);
        assert_eq!(s.acquire(SeqId(7)), Err(KvError::SeqExists(SeqId(7))));
        assert_eq!(s.release(SeqId(7)), Some(0));
        assert_eq!(s.release(SeqId(7)), None);
        assert_eq!(s.acquire(SeqId(9)).unwrap(), 0);
        assert_eq!(s.acquire(SeqId(10)).unwrap(), 2);
        assert!(matches!(
            s.acquire(SeqId(11)),
            Err(KvError::OutOfBlocks { needed: 1, free: 0 })
        ));
        assert_eq!(
            (s.get(SeqId(8)), s.get(SeqId(11)), s.n_free()),
            (Some(1), None, 0)
        );
        assert!(StateSlots::new(0).is_err());
    }

    #[test]
    fn reset_and_copy_touch_one_slot() {
        let mut r = RecurrentStates::new(2, 3, 2, 4).unwrap();
        for l in 0..2 {
            let (c, m) = r.layer_mut(l).unwrap();
            c.iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = i as f32 + 1.0);
            m.iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = -(i as f32) - 1.0);
        }
        r.copy_slot(0, 2).unwrap();
        r.reset(1).unwrap();
        let (c, m) = r.layer_mut(1).unwrap();
        assert_eq!(c, &[1.0, 2.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(&m[4..8], &[0.0; 4]);
        assert_eq!(&m[8..12], &[-1.0, -2.0, -3.0, -4.0]);
        assert!(r.reset(3).is_err());
        assert!(r.copy_slot(0, 3).is_err());
        assert!(r.layer_mut(2).is_err());
        assert_eq!(r.bytes(), 2 * 3 * 6 * 4);
        assert!(RecurrentStates::new(usize::MAX, 2, 2, 2).is_err());
    }
}
