//! Embedding lookup: dequantized table rows.

use super::try_for_chunks;
use crate::backend::QMatrix;
use anyhow::{ensure, Context, Result};

/// table: (rows, cols); ids: (n,); out: (n, cols).
pub fn run(
    par: crate::backend::cpu::pool::Par<'_>,
    table: QMatrix<'_>,
    ids: &[u32],
    out: &mut [f32],
) -> Result<()> {
    let rb = table
        .ty
        .row_bytes(table.cols)
        .map_err(|e| anyhow::anyhow!("get_rows: {e}"))?;
    ensure!(
        table.data.len() == rb * table.rows,
        "get_rows: {:?} table ({} x {}) needs {} bytes, got {}",
        table.ty,
        table.rows,
        table.cols,
        rb * table.rows,
        table.data.len()
    );
    ensure!(
        out.len() == ids.len() * table.cols,
        "get_rows: out has {} elements, expected ids {} * cols {}",
        out.len(),
        ids.len(),
        table.cols
    );
    for (i, &id) in ids.iter().enumerate() {
        ensure!(
            (id as usize) < table.rows,
            "get_rows: id {id} at {i} out of range (table has {} rows)",
            table.rows
        );
    }
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
