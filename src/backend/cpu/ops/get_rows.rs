//! Embedding lookup: dequantized table rows.

use super::try_for_chunks;
use crate::backend::QMatrix;
use anyhow::{Context, Result};

/// table: (rows, cols); ids: (n,); out: (n, cols).
pub fn run(
    par: crate::backend::cpu::pool::Par<'_>,
    table: QMatrix<'_>,
    ids: &[u32],
    out: &mut [f32],
) -> Result<()> {
    let rb = crate::backend::validate::get_rows(&table, table.data.len(), ids.len(), out.len())?;
    crate::backend::validate::indices("get_rows: id", ids, table.rows)?;
    if table.cols == 0 {
        return Ok(());
    }
    try_for_chunks(par, out, table.cols, |i, o| {
        let r = ids[i] as usize;
        // The quant module's ggml-order dequantization (bitwise equal to
        // this backend's own block decoding; see tests).
        crate::quant::dequantize(table.ty, &table.data[r * rb..(r + 1) * rb], o)
            .with_context(|| format!("get_rows: row {r}"))
    })
}
