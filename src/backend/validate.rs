//! Shape checks shared by every backend and every memory space: one
//! definition of what a valid op argument is, so backends cannot disagree
//! on what they accept. Checks take lengths (host slices and device
//! buffers both know theirs); checks of index *values* (ids, slots, block
//! tables) need them on the host and are done where they are uploaded.

use super::{AttnBatch, AttnOpts, KvLayer, KvType, WeightInfo};
use anyhow::{anyhow, ensure, Context, Result};

/// `MatMul` arguments: w (rows m, cols k) of `data_len` bytes, x (n, k),
/// out (n, m). Returns the weight's row bytes.
pub fn mat_mul(
    w: &dyn WeightInfo,
    data_len: usize,
    x_len: usize,
    n: usize,
    out_len: usize,
) -> Result<usize> {
    let (m, k, ty) = (w.rows(), w.cols(), w.ty());
    let rb = ty
        .row_bytes(k)
        .map_err(|e| anyhow!("mat_mul: weight {ty:?} ({m} x {k}): {e}"))?;
    ensure!(
        data_len == rb * m,
        "mat_mul: weight {ty:?} ({m} x {k}) needs {} bytes, got {data_len}",
        rb * m
    );
    ensure!(
        x_len == n * k,
        "mat_mul: x has {x_len} elements, expected n {n} * k {k} (weight {ty:?} {m} x {k})"
    );
    ensure!(
        out_len == n * m,
        "mat_mul: out has {out_len} elements, expected n {n} * m {m}"
    );
    Ok(rb)
}

/// `MatMuls` shapes: 1..=MAX_MAT_JOBS jobs (weight, output length), all of
/// one weight type and k, each a valid `MatMul` of x (n, k).
pub fn mat_muls(x_len: usize, n: usize, jobs: &[(&dyn WeightInfo, usize)]) -> Result<()> {
    ensure!(
        !jobs.is_empty() && jobs.len() <= super::MAX_MAT_JOBS,
        "mat_muls: {} jobs (1 to {} allowed)",
        jobs.len(),
        super::MAX_MAT_JOBS
    );
    let (ty, k) = (jobs[0].0.ty(), jobs[0].0.cols());
    for (i, (w, out_len)) in jobs.iter().enumerate() {
        ensure!(
            w.ty() == ty && w.cols() == k,
            "mat_muls: job {i} is {:?} ({} x {}), job 0 is {ty:?} (_ x {k}): one type and k per op",
            w.ty(),
            w.rows(),
            w.cols()
        );
        mat_mul(*w, w.data_len(), x_len, n, *out_len).map_err(|e| anyhow!("job {i}: {e}"))?;
    }
    Ok(())
}

/// The norm of a `MatMuls`: weights (k,) and scratch (n, k) with the op's
/// x (n, k), as `RmsNorm` with dim = k.
pub fn mat_muls_norm(x_len: usize, k: usize, w_len: usize, out_len: usize) -> Result<()> {
    rms_norm(x_len, w_len, k, out_len)
        .map(|_| ())
        .map_err(|e| anyhow!("mat_muls norm: {e}"))
}

/// The SwiGlu of a `MatMuls` (`glu`): jobs 0 (gate) and 1 (up) of one
/// output length, neither adding, and the output of that length. `jobs`:
/// each job's (output length, add).
pub fn mat_muls_glu(jobs: &[(usize, bool)], glu_len: usize) -> Result<()> {
    ensure!(
        jobs.len() >= 2,
        "mat_muls glu: {} jobs (the gate and up jobs 0 and 1 needed)",
        jobs.len()
    );
    let ((g, g_add), (u, u_add)) = (jobs[0], jobs[1]);
    ensure!(
        !g_add && !u_add,
        "mat_muls glu: the gate and up jobs must not add into their outputs"
    );
    ensure!(
        g == u && u == glu_len,
        "mat_muls glu: gate {g}, up {u} and glu {glu_len} values: one length"
    );
    Ok(())
}

/// `GetRows` shapes: table (rows, cols) of `data_len` bytes; out (n_ids,
/// cols). Returns the table's row bytes.
pub fn get_rows(
    table: &dyn WeightInfo,
    data_len: usize,
    n_ids: usize,
    out_len: usize,
) -> Result<usize> {
    let (rows, cols, ty) = (table.rows(), table.cols(), table.ty());
    let rb = ty.row_bytes(cols).map_err(|e| anyhow!("get_rows: {e}"))?;
    ensure!(
        data_len == rb * rows,
        "get_rows: {ty:?} table ({rows} x {cols}) needs {} bytes, got {data_len}",
        rb * rows
    );
    ensure!(
        out_len == n_ids * cols,
        "get_rows: out has {out_len} elements, expected ids {n_ids} * cols {cols}"
    );
    Ok(rb)
}

/// Every index is below `limit` (`what` names the op and the index kind).
pub fn indices(what: &str, idx: &[u32], limit: usize) -> Result<()> {
    if let Some((i, &v)) = idx.iter().enumerate().find(|(_, &v)| v as usize >= limit) {
        anyhow::bail!("{what}: {v} at {i} out of range (limit {limit})");
    }
    Ok(())
}

/// `RmsNorm`: x, out (n, dim), w (dim,). Returns n.
pub fn rms_norm(x_len: usize, w_len: usize, dim: usize, out_len: usize) -> Result<usize> {
    ensure!(dim > 0, "rms_norm: dim must be > 0");
    ensure!(
        w_len == dim && x_len.is_multiple_of(dim) && out_len == x_len,
        "rms_norm: x {x_len} / out {out_len} elements, w {w_len} (dim {dim}): expected x = out = n*dim, w = dim"
    );
    Ok(x_len / dim)
}

/// `Rope`: x (n, n_heads, head_dim), n positions, rope_dim / 2 frequencies.
pub fn rope(
    x_len: usize,
    n_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    n: usize,
    inv_freq_len: usize,
) -> Result<()> {
    ensure!(
        n_heads > 0 && head_dim > 0,
        "rope: n_heads {n_heads} and head_dim {head_dim} must be > 0"
    );
    ensure!(
        rope_dim.is_multiple_of(2) && rope_dim <= head_dim && inv_freq_len == rope_dim / 2,
        "rope: rope_dim {rope_dim} (head_dim {head_dim}) with {inv_freq_len} inv_freq, expected {}",
        rope_dim / 2
    );
    ensure!(
        x_len == n * n_heads * head_dim,
        "rope: x has {x_len} elements, expected n {n} * n_heads {n_heads} * head_dim {head_dim}"
    );
    Ok(())
}

/// Elementwise ops over equal lengths (`swiglu`, `add`).
pub fn same_len(op: &str, lens: &[usize]) -> Result<()> {
    ensure!(
        lens.windows(2).all(|w| w[0] == w[1]),
        "{op}: operand lengths {lens:?} differ"
    );
    Ok(())
}

/// `AllGather` on `world` ranks: x (n, w) of each, out (n, world * w).
pub fn all_gather(x_len: usize, n: usize, out_len: usize, world: usize) -> Result<()> {
    ensure!(
        n > 0 && x_len.is_multiple_of(n) && out_len == x_len * world,
        "all_gather: {x_len} values in {n} rows, out {out_len} (expected {x_len} x {world})"
    );
    Ok(())
}

/// `AddBias`: x (n, dim), bias (dim,).
pub fn add_bias(x_len: usize, dim: usize) -> Result<()> {
    ensure!(
        dim > 0 && x_len.is_multiple_of(dim),
        "add_bias: x has {x_len} elements, not rows of bias dim {dim}"
    );
    Ok(())
}

/// `SelectRows`: x (n, dim), out (n_sel, dim). Returns n.
pub fn select_rows(x_len: usize, dim: usize, n_sel: usize, out_len: usize) -> Result<usize> {
    ensure!(
        dim > 0 && x_len.is_multiple_of(dim) && out_len == n_sel * dim,
        "select_rows: x {x_len} / out {out_len} elements for dim {dim} and {n_sel} rows"
    );
    Ok(x_len / dim)
}

/// `KvWrite` shapes: cache k, v of whole blocks of (block_size, n_kv_heads,
/// head_dim); k, v (n_slots, n_kv_heads, head_dim). Returns the cache's
/// number of cells.
pub fn kv_write(
    geometry: (usize, usize, usize),
    ty: KvType,
    cache_k_len: usize,
    cache_v_len: usize,
    k_len: usize,
    v_len: usize,
    n_slots: usize,
) -> Result<usize> {
    let (bs, nkv, hd) = geometry;
    let row = nkv * hd;
    ensure!(
        row > 0 && bs > 0,
        "kv_write: n_kv_heads {nkv} / head_dim {hd} / block_size {bs} must be > 0"
    );
    ty.check(hd).context("kv_write")?;
    // The cache's 16-bit units per cell.
    let cell = nkv * ty.row_units(hd);
    ensure!(
        cache_k_len == cache_v_len && cache_k_len.is_multiple_of(bs * cell),
        "kv_write: cache k {cache_k_len} / v {cache_v_len} units, not whole blocks of (block_size {bs}, n_kv_heads {nkv}, head_dim {hd} as {ty})"
    );
    ensure!(
        k_len == n_slots * row && v_len == k_len,
        "kv_write: k {k_len} / v {v_len} elements, expected n {n_slots} * n_kv_heads {nkv} * head_dim {hd}"
    );
    Ok(cache_k_len / cell)
}

/// `KvWrite` slot values: in range and distinct (two rows of one step never
/// share a cell; a repeat is a caller bug, and would race on a GPU).
pub fn kv_slots(slots: &[u32], n_cells: usize) -> Result<()> {
    indices("kv_write: slot", slots, n_cells)?;
    let mut sorted = slots.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        anyhow::bail!("kv_write: slot {} is written by two rows", w[0]);
    }
    Ok(())
}

/// `PagedAttention` shapes. Returns the cache's number of blocks.
#[allow(clippy::too_many_arguments)] // the op's scalar fields
pub fn attention(
    geometry: (usize, usize, usize),
    ty: KvType,
    n_heads: usize,
    cache_k_len: usize,
    cache_v_len: usize,
    n_rows: usize,
    q_len: usize,
    out_len: usize,
) -> Result<usize> {
    let (bs, nkv, hd) = geometry;
    ensure!(
        hd > 0 && nkv > 0 && bs > 0 && n_heads > 0,
        "paged_attention: head_dim {hd}, n_kv_heads {nkv}, block_size {bs}, n_heads {n_heads} must be > 0"
    );
    ensure!(
        n_heads.is_multiple_of(nkv),
        "paged_attention: n_heads {n_heads} is not a multiple of n_kv_heads {nkv}"
    );
    ty.check(hd).context("paged_attention")?;
    let block_elems = bs * nkv * ty.row_units(hd);
    ensure!(
        cache_k_len == cache_v_len && cache_k_len.is_multiple_of(block_elems),
        "paged_attention: cache k {cache_k_len} / v {cache_v_len} units, not whole blocks of (block_size {bs}, n_kv_heads {nkv}, head_dim {hd} as {ty})"
    );
    ensure!(
        q_len == n_rows * n_heads * hd && out_len == q_len,
        "paged_attention: q {q_len} / out {out_len} elements, expected n_rows {n_rows} * n_heads {n_heads} * head_dim {hd}"
    );
    Ok(cache_k_len / block_elems)
}

/// A host-memory `PagedAttention`: its shapes, options and batch values
/// ([`attention`], [`attention_opts`], [`attention_batch`]). Returns, per
/// sequence, the number of blocks its rows read.
pub fn host_attention(
    q_len: usize,
    n_heads: usize,
    cache: &KvLayer<'_>,
    batch: &AttnBatch<'_>,
    opts: &AttnOpts<&[f32]>,
    out_len: usize,
) -> Result<Vec<usize>> {
    let n_blocks = attention(
        (cache.block_size, cache.n_kv_heads, cache.head_dim),
        cache.ty,
        n_heads,
        cache.k.len(),
        cache.v.len(),
        batch.positions.len(),
        q_len,
        out_len,
    )?;
    attention_opts(opts, n_heads)?;
    attention_batch(batch, cache.block_size, n_blocks)
}

/// `PagedAttention` options: a finite, non-negative softcap and one ALiBi
/// slope and one sink logit per query head.
pub fn attention_opts<P: ParamLen>(opts: &AttnOpts<P>, n_heads: usize) -> Result<()> {
    ensure!(
        opts.softcap.is_finite() && opts.softcap >= 0.0,
        "paged_attention: softcap {} must be finite and >= 0 (0: off)",
        opts.softcap
    );
    for (name, p) in [("alibi slopes", &opts.alibi), ("sinks", &opts.sinks)] {
        if let Some(p) = p {
            ensure!(
                p.param_len() == n_heads,
                "paged_attention: {name} hold {} values, expected one per head ({n_heads})",
                p.param_len()
            );
        }
    }
    Ok(())
}

/// Length of a parameter vector, whatever memory holds it.
pub trait ParamLen {
    fn param_len(&self) -> usize;
}

impl ParamLen for &[f32] {
    fn param_len(&self) -> usize {
        self.len()
    }
}

/// `PagedAttention` batch values: every row names a sequence with a table
/// long enough for its position, and every block it reads is in range.
/// Returns, per sequence, the number of blocks its rows read.
pub fn attention_batch(
    batch: &AttnBatch<'_>,
    block_size: usize,
    n_blocks: usize,
) -> Result<Vec<usize>> {
    let n_rows = batch.positions.len();
    ensure!(
        batch.row_seq.len() == n_rows,
        "paged_attention: row_seq has {} entries, positions {n_rows}",
        batch.row_seq.len()
    );
    let mut need = vec![0usize; batch.block_tables.len()];
    for r in 0..n_rows {
        let s = batch.row_seq[r] as usize;
        ensure!(
            s < batch.block_tables.len(),
            "paged_attention: row {r} names sequence {s}, only {} block tables",
            batch.block_tables.len()
        );
        let nb = batch.positions[r] as usize / block_size + 1;
        let table = batch.block_tables[s];
        ensure!(
            table.len() >= nb,
            "paged_attention: row {r} at position {} needs {nb} blocks of {block_size}, table has {}",
            batch.positions[r],
            table.len()
        );
        need[s] = need[s].max(nb);
    }
    for (s, &nb) in need.iter().enumerate() {
        for (i, &b) in batch.block_tables[s][..nb].iter().enumerate() {
            ensure!(
                (b as usize) < n_blocks,
                "paged_attention: block table {s} entry {i} = {b} out of range ({n_blocks} blocks)"
            );
        }
    }
    Ok(need)
}
