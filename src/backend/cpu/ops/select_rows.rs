//! Row gather of an activation (the rows that go through the output head).
//! A copy: no arithmetic, so every backend agrees bit for bit.

use anyhow::Result;

/// x: (n, dim); rows: (m,) indices into x; out: (m, dim).
pub fn run(x: &[f32], dim: usize, rows: &[u32], out: &mut [f32]) -> Result<()> {
    let n = crate::backend::validate::select_rows(x.len(), dim, rows.len(), out.len())?;
    crate::backend::validate::indices("select_rows: row", rows, n)?;
    for (o, &r) in out.chunks_exact_mut(dim).zip(rows) {
        let r = r as usize;
        o.copy_from_slice(&x[r * dim..(r + 1) * dim]);
    }
    Ok(())
}
