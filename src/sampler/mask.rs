//! Token masks as 32-id words: the form a grammar's allowed set takes on
//! its way to the device draw (ops/sample's mask_rows reads the same
//! words), and its host reading, so both sides refuse the same ids.

use super::TokenMask;

/// A row's allowed ids as words: id `i` is allowed when bit `i % 32` of
/// word `i / 32` is set; ids past the words are refused.
#[derive(Debug, Clone, Copy)]
pub struct WordMask<'a> {
    words: &'a [u32],
}

impl<'a> WordMask<'a> {
    pub fn new(words: &'a [u32]) -> Self {
        WordMask { words }
    }

    /// The first allowed id, if any (the greedy choice when every allowed
    /// logit is -inf, as `Sampler::sample_masked` makes it).
    pub fn first_allowed(&self) -> Option<u32> {
        let (w, &bits) = self.words.iter().enumerate().find(|(_, &b)| b != 0)?;
        u32::try_from(w * 32 + bits.trailing_zeros() as usize).ok()
    }
}

impl TokenMask for WordMask<'_> {
    fn apply(&self, logits: &mut [f32]) -> bool {
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = self.words.get(w).copied().unwrap_or(0);
            // Bits past the row's end name no token.
            let live = if chunk.len() == 32 {
                u32::MAX
            } else {
                (1u32 << chunk.len()) - 1
            };
            any |= bits & live != 0;
            if bits & live == live {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if bits >> i & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        any
    }

    fn allows(&self, id: u32) -> bool {
        self.words
            .get(id as usize / 32)
            .is_some_and(|&b| b >> (id % 32) & 1 == 1)
    }
}

/// The masks of a decode step's rows, for a draw on the device: row `r`
/// has a mask when `has(r)`, its words at `[r * words, (r + 1) * words)`
/// of [`RowMasks::data`] (`words` = the vocabulary / 32, rounded up).
/// Kept between steps to reuse its allocation.
#[derive(Debug, Default, Clone)]
pub struct RowMasks {
    words: usize,
    rows: Vec<bool>,
    data: Vec<u32>,
}

impl RowMasks {
    /// Words of a row of `vocab` ids.
    pub fn words_for(vocab: usize) -> usize {
        vocab.div_ceil(32)
    }

    /// `rows` rows over `vocab` ids, none masked.
    pub fn reset(&mut self, rows: usize, vocab: usize) {
        self.words = Self::words_for(vocab);
        self.rows.clear();
        self.rows.resize(rows, false);
        self.data.resize(rows * self.words, 0);
    }

    /// Row `r`'s mask, if it has one.
    pub fn row(&self, r: usize) -> Option<WordMask<'_>> {
        self.rows
            .get(r)
            .copied()
            .unwrap_or(false)
            .then(|| WordMask::new(&self.data[r * self.words..(r + 1) * self.words]))
    }

    /// Whether row `r` is masked.
    pub fn has(&self, r: usize) -> bool {
        self.rows.get(r).copied().unwrap_or(false)
    }

    /// Whether any row is masked.
    pub fn any(&self) -> bool {
        self.rows.iter().any(|&m| m)
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Words per row.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Every row's words, (rows, words) (an unmasked row's are unspecified).
    pub fn data(&self) -> &[u32] {
        &self.data
    }

    /// Every row's flag and words, to be written together (rows in
    /// parallel): a row is masked when its flag is set.
    pub fn parts_mut(&mut self) -> (&mut [bool], &mut [u32]) {
        (&mut self.rows, &mut self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_read_as_ids() {
        let words = [0b1010u32, 0, 1 << 31];
        let m = WordMask::new(&words);
        let allowed: Vec<u32> = (0..100).filter(|&i| m.allows(i)).collect();
        assert_eq!(allowed, vec![1, 3, 95]);
        assert_eq!(m.first_allowed(), Some(1));
        assert_eq!(WordMask::new(&[0, 0]).first_allowed(), None);
        let mut l: Vec<f32> = (0..70).map(|i| i as f32 * 0.5 - 3.0).collect();
        let before = l.clone();
        assert!(m.apply(&mut l));
        for (i, (&a, &b)) in l.iter().zip(&before).enumerate() {
            let want = if m.allows(i as u32) {
                b
            } else {
                f32::NEG_INFINITY
            };
            assert_eq!(a.to_bits(), want.to_bits(), "id {i}");
        }
        // Id 95 is past a 70-id row: nothing of it is allowed.
        let mut short = vec![1.0f32; 70];
        assert!(!WordMask::new(&[0, 0, 1 << 31]).apply(&mut short));
    }

    #[test]
    fn row_masks_keep_rows_apart() {
        let mut m = RowMasks::default();
        m.reset(3, 65);
        assert_eq!(m.words(), 3);
        assert!(!m.any());
        let (flags, data) = m.parts_mut();
        flags[2] = true;
        data[6..9].copy_from_slice(&[0, 0, 1]);
        assert!(m.has(2) && !m.has(0) && !m.has(3));
        assert_eq!(m.row(2).and_then(|w| w.first_allowed()), Some(64));
        assert!(m.row(1).is_none());
        m.reset(1, 65);
        assert!(!m.any() && m.len() == 1);
    }
}
