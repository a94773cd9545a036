//! Shape checks shared by every backend: one definition of what a valid op
//! argument is, so backends cannot disagree on what they accept.

use super::QMatrix;
use anyhow::{anyhow, ensure, Result};

/// `MatMul` arguments: w (rows m, cols k), x (n, k), out (n, m). Returns the
/// weight's row bytes.
pub fn mat_mul(w: &QMatrix<'_>, x_len: usize, n: usize, out_len: usize) -> Result<usize> {
    let (m, k) = (w.rows, w.cols);
    let rb =
        w.ty.row_bytes(k)
            .map_err(|e| anyhow!("mat_mul: weight {:?} ({m} x {k}): {e}", w.ty))?;
    ensure!(
        w.data.len() == rb * m,
        "mat_mul: weight {:?} ({m} x {k}) needs {} bytes, got {}",
        w.ty,
        rb * m,
        w.data.len()
    );
    ensure!(
        x_len == n * k,
        "mat_mul: x has {x_len} elements, expected n {n} * k {k} (weight {:?} {m} x {k})",
        w.ty
    );
    ensure!(
        out_len == n * m,
        "mat_mul: out has {out_len} elements, expected n {n} * m {m}"
    );
    Ok(rb)
}

/// `GetRows` arguments: every id indexes a row of `table`; out (ids, cols).
/// Returns the table's row bytes.
pub fn get_rows(table: &QMatrix<'_>, ids: &[u32], out_len: usize) -> Result<usize> {
    let rb = table
        .ty
        .row_bytes(table.cols)
        .map_err(|e| anyhow!("get_rows: {e}"))?;
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
        out_len == ids.len() * table.cols,
        "get_rows: out has {out_len} elements, expected ids {} * cols {}",
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
    Ok(rb)
}
