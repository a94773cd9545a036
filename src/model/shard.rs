//! Cutting weights into a rank's share: a row range (output features) or a
//! column range (input features, whole blocks) of a matrix, copied out of
//! the mmap; a range of a vector.

use crate::dispatch::weights::WeightRef;
use crate::gguf::GgufFile;
use anyhow::{ensure, Context, Result};
use std::ops::Range;
use std::sync::Arc;

/// Which part of a matrix a rank holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Output features (rows) `range`.
    Rows(Range<usize>),
    /// Input features (columns) `range`, on block boundaries.
    Cols(Range<usize>),
}

/// The rows or columns `cut` of `w`, as an owned matrix whose name says
/// which part it is.
pub fn cut(g: &GgufFile, w: &WeightRef, cut: &Cut) -> Result<WeightRef> {
    let m = w.matrix(g)?;
    let row_bytes =
        w.ty.row_bytes(w.cols)
            .with_context(|| format!("{}: row of {} columns", w.name, w.cols))?;
    ensure!(
        m.data.len() == row_bytes * w.rows,
        "{}: {} bytes for {} rows of {row_bytes}",
        w.name,
        m.data.len(),
        w.rows
    );
    let (data, rows, cols, what): (Vec<u8>, usize, usize, String) = match cut {
        Cut::Rows(r) => {
            ensure!(
                r.start < r.end && r.end <= w.rows,
                "{}: rows {r:?} of {}",
                w.name,
                w.rows
            );
            (
                m.data[r.start * row_bytes..r.end * row_bytes].to_vec(),
                r.len(),
                w.cols,
                format!("rows {}..{}", r.start, r.end),
            )
        }
        Cut::Cols(c) => {
            let b = w.ty.block_size();
            ensure!(
                c.start < c.end && c.end <= w.cols && c.start % b == 0 && c.end % b == 0,
                "{}: columns {c:?} of {} are not whole {b}-element blocks of {:?}",
                w.name,
                w.cols,
                w.ty
            );
            let (lo, hi) = (w.ty.row_bytes(c.start)?, w.ty.row_bytes(c.end)?);
            let mut out = Vec::with_capacity((hi - lo) * w.rows);
            for row in m.data.chunks_exact(row_bytes) {
                out.extend_from_slice(&row[lo..hi]);
            }
            (out, w.rows, c.len(), format!("cols {}..{}", c.start, c.end))
        }
    };
    Ok(WeightRef {
        name: format!("{}[{what}]", w.name),
        ty: w.ty,
        rows,
        cols,
        owned: Some(Arc::from(data)),
    })
}

/// Part `rank` of `world` equal parts of `0..len`.
pub fn part(len: usize, rank: usize, world: usize) -> Range<usize> {
    let w = len / world;
    rank * w..(rank + 1) * w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_tile_the_range_in_rank_order() {
        assert_eq!(part(12, 0, 3), 0..4);
        assert_eq!(part(12, 2, 3), 8..12);
        assert_eq!(part(7, 0, 1), 0..7);
    }
}
