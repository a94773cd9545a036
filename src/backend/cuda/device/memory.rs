//! The device memory space of the `cuda` backend: the buffers ops read and
//! write when their tensors live on the device (`Dev`: weights, KV cache,
//! attention batches), so a whole step runs on the GPU with one upload of
//! the step's inputs and one download of its logits. The ops over them are
//! dispatched by `run_dev.rs`.
//!
//! Index *values* in device buffers cannot be checked by the op without a
//! download. They are checked on the host where they are uploaded
//! ([`DevAttnBatch::upload`] for block tables; the executor for ids, slots
//! and rows), and every kernel that indexes memory with a device-side
//! value also bounds-checks it (an out-of-range id reads as NaN, an
//! out-of-range slot writes nothing), so no value can reach outside a
//! buffer.

use super::drv;
use crate::backend::cuda::CudaBackend;
use crate::backend::{validate, AttnBatch, KvInfo, Mem, WeightInfo};
use crate::quant::GgmlType;
use anyhow::{Context, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

/// Device memory (see the module doc).
pub struct Dev;

impl Mem for Dev {
    type In<'a> = CudaView<'a, f32>;
    type Out<'a> = CudaViewMut<'a, f32>;
    type Idx<'a> = CudaView<'a, u32>;
    type Param<'a> = CudaView<'a, f32>;
    type W<'a> = DevMatrix<'a>;
    type Kv<'a> = DevKv<'a>;
    type KvMut<'a> = DevKvMut<'a>;
    type Batch<'a> = &'a DevAttnBatch;
}

/// A weight matrix on the device in its stored type.
/// data: (rows, cols) row-major, `ty.row_bytes(cols)` bytes per row.
pub struct DevMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: CudaView<'a, u8>,
}

impl WeightInfo for DevMatrix<'_> {
    fn ty(&self) -> GgmlType {
        self.ty
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// One layer of the device KV cache, f16 bits.
/// k, v: (n_blocks, block_size, n_kv_heads, head_dim).
pub struct DevKv<'a> {
    pub k: CudaView<'a, u16>,
    pub v: CudaView<'a, u16>,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Written view of one layer of the device KV cache (layout of [`DevKv`]).
pub struct DevKvMut<'a> {
    pub k: CudaViewMut<'a, u16>,
    pub v: CudaViewMut<'a, u16>,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

// The device cache holds f16 rows only (`--kv-type f16`).
impl KvInfo for DevKv<'_> {
    fn geometry(&self) -> (usize, usize, usize) {
        (self.block_size, self.n_kv_heads, self.head_dim)
    }
    fn kv_type(&self) -> crate::backend::KvType {
        crate::backend::KvType::F16
    }
}

impl KvInfo for DevKvMut<'_> {
    fn geometry(&self) -> (usize, usize, usize) {
        (self.block_size, self.n_kv_heads, self.head_dim)
    }
    fn kv_type(&self) -> crate::backend::KvType {
        crate::backend::KvType::F16
    }
}

/// An attention batch on the device, validated on the host at upload
/// against a cache of `n_blocks` blocks of `block_size` cells: every table
/// entry a row reads is below `n_blocks`. Fields are private so no
/// unvalidated batch exists.
pub struct DevAttnBatch {
    /// Concatenated block tables, each cut to the blocks its rows read.
    pub(in crate::backend::cuda) tables: CudaSlice<u32>,
    /// (n_seqs,) start of each sequence's table in `tables`.
    pub(in crate::backend::cuda) table_off: CudaSlice<u32>,
    /// (n_rows,) sequence of each query row.
    pub(in crate::backend::cuda) row_seq: CudaSlice<u32>,
    /// (n_rows,) absolute position of each query row; in a fixed batch
    /// (n_rows * 4 + 1,), the "step words": then each row's KV slot
    /// (`slots`), its input token (`tokens`), a greedy step's status word,
    /// and the ticket of a greedy graph's advance (`step_words`), so that
    /// one copy refills a step's inputs.
    pub(in crate::backend::cuda) positions: CudaSlice<u32>,
    /// A fixed batch's block tables as its last refill copied them (the
    /// prefix its rows read): a refill whose tables are the same skips
    /// their copy. None until the first refill, and for uploaded batches.
    held_tables: Option<Vec<u32>>,
    /// A fixed batch's table offsets as its last refill copied them.
    held_offs: Option<Vec<u32>>,
    /// A fixed batch's positions and slots (2 n_rows words) as the device
    /// holds them once the steps enqueued so far have run: what the last
    /// refill copied, advanced by one per greedy replay since
    /// ([`DevAttnBatch::hold_steps`]). A chained step whose positions and
    /// slots are those skips their copy. None: unknown (then it copies).
    held_steps: Option<Vec<u32>>,
    pub(in crate::backend::cuda) n_rows: usize,
    pub(in crate::backend::cuda) block_size: usize,
    pub(in crate::backend::cuda) n_blocks: usize,
    /// Split-KV attention: partial slots per (row, head) in the scratch
    /// buffer (at least the most partials any row can have) and CTAs per
    /// (row, head) (`ATT_PARTS` bounds both; see attention.cu). Neither
    /// changes the arithmetic.
    pub(in crate::backend::cuda) part_stride: usize,
    pub(in crate::backend::cuda) part_ctas: usize,
    /// Prefill tiles of the tensor-core kernel, (n_tiles, 2) = {first row,
    /// rows}: runs of at most 16 consecutive rows of one sequence. Only for
    /// batches of at least FA_MIN_ROWS rows.
    pub(in crate::backend::cuda) tiles: Option<(CudaSlice<u32>, usize)>,
    /// Every row is the only row of its sequence (a decode batch): then a
    /// row's keys before its position are not written by this step's KV
    /// write, and the split kernels may read them before their
    /// programmatic wait (attention_pipe_fast.cu, att_pipe_gqa).
    pub(in crate::backend::cuda) one_row_per_seq: bool,
}

/// Batches of at least this many rows may take the tensor-core prefill
/// attention in `fast` mode (fewer rows: decode-shaped, split-KV wins).
pub const FA_MIN_ROWS: usize = 64;

/// The tensor-core prefill tiles of a batch, when it is prefill-shaped: at
/// least FA_MIN_ROWS rows and on average at least 4 rows per tile (a
/// decode batch of one row per sequence would fill 1/16 of each MMA tile;
/// the split-KV kernel serves it better).
fn fa_tiles_for(be: &CudaBackend, row_seq: &[u32]) -> Result<Option<(CudaSlice<u32>, usize)>> {
    if row_seq.len() < FA_MIN_ROWS {
        return Ok(None);
    }
    let t = fa_tiles(row_seq);
    let n_tiles = t.len() / 2;
    if 4 * n_tiles > row_seq.len() {
        return Ok(None);
    }
    Ok(Some((
        be.up(&t, "paged_attention: prefill tiles")?,
        n_tiles,
    )))
}

/// Cuts the batch's rows into runs of at most 16 consecutive rows of one
/// sequence: flattened {first row, rows} pairs.
pub fn fa_tiles(row_seq: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < row_seq.len() {
        let mut n = 1;
        while n < 16 && i + n < row_seq.len() && row_seq[i + n] == row_seq[i] {
            n += 1;
        }
        out.push(i as u32);
        out.push(n as u32);
        i += n;
    }
    out
}

/// Keys per chunk and partials per row of the split-KV attention
/// (ATT_CHUNK, ATT_PARTS in attention.cu).
pub const ATT_CHUNK: usize = 128;
pub const ATT_PARTS: usize = 32;

/// Whether no value occurs twice.
fn distinct(v: &[u32]) -> bool {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.windows(2).all(|w| w[0] != w[1])
}

/// Whether `words` differ from `held`, what a device buffer holds since
/// the last copy into it (None: unknown); if so `held` becomes them.
fn held_changed(held: &mut Option<Vec<u32>>, words: &[u32]) -> bool {
    if held.as_deref() == Some(words) {
        return false;
    }
    let h = held.get_or_insert_with(Vec::new);
    h.clear();
    h.extend_from_slice(words);
    true
}

/// Copies `src` (page-locked staging) to the start of `dst` unless `held`
/// says `dst` holds it already: a copy on the stream between two graph
/// replays costs the device a few microseconds. After a failed copy
/// `held` is unknown, so the next call copies. Returns whether it copied.
pub(crate) fn upload_if_changed(
    be: &CudaBackend,
    held: &mut Option<Vec<u32>>,
    src: &[u32],
    dst: &mut CudaSlice<u32>,
    what: &str,
) -> Result<bool> {
    if !held_changed(held, src) {
        return Ok(false);
    }
    let copied = drv(be.stream().memcpy_htod(src, dst), what);
    if copied.is_err() {
        *held = None;
    }
    copied.map(|()| true)
}

/// Lays a one-row-per-sequence step of n rows out in `stage` (n *
/// (stride + 4) words, checked by the caller): each row's table offset
/// (n words), then the rows' `need[s]` used blocks packed one after the
/// other (room for n * stride), then the positions, `slots` and `tokens`.
/// Returns the table words to copy (the packed tables: a row's table is
/// read up to its position's block) and the step words to copy (2n, or 3n
/// with tokens). Packed, a refill copies what the rows read however long
/// the longest possible table (`stride`) is.
fn stage_step(
    batch: &AttnBatch<'_>,
    need: &[usize],
    slots: &[u32],
    tokens: Option<&[u32]>,
    stride: usize,
    stage: &mut [u32],
) -> Result<(usize, usize)> {
    let n = need.len();
    let (offs, rest) = stage.split_at_mut(n);
    let (flat, pos) = rest.split_at_mut(n * stride);
    let mut at = 0;
    for (s, &nb) in need.iter().enumerate() {
        anyhow::ensure!(
            nb <= stride,
            "decode batch: a table of {nb} blocks exceeds {stride}"
        );
        offs[s] = u32::try_from(at).context("block tables too long")?;
        flat[at..at + nb].copy_from_slice(&batch.block_tables[s][..nb]);
        at += nb;
    }
    pos[..n].copy_from_slice(batch.positions);
    pos[n..2 * n].copy_from_slice(slots);
    let words = match tokens {
        Some(t) => {
            pos[2 * n..3 * n].copy_from_slice(t);
            3 * n
        }
        None => 2 * n,
    };
    Ok((at, words))
}

/// How many of a refill's staged step words (`words`: n positions, n
/// slots, then n tokens unless the step is chained) to copy, given what
/// the device will hold of the positions and slots (`held`, 2 n words):
/// none when `words` are those (a chained step: no tokens); else all of
/// them.
fn step_copy(held: Option<&[u32]>, words: &[u32]) -> usize {
    if held == Some(words) {
        0
    } else {
        words.len()
    }
}

/// What the device holds of the positions and slots after a step that
/// found `held` there: the same, or (`greedy`: sample_rows' advance) each
/// word plus one.
fn after_step(mut held: Option<Vec<u32>>, greedy: bool) -> Option<Vec<u32>> {
    if greedy {
        for w in held.iter_mut().flatten() {
            *w = w.wrapping_add(1);
        }
    }
    held
}

/// Partials a row at `max_pos` has (the most the batch's rows need).
pub fn att_parts(max_pos: usize) -> usize {
    (max_pos / ATT_CHUNK + 1).min(ATT_PARTS)
}

impl DevAttnBatch {
    /// Validates `batch` (see [`validate::attention_batch`]) and uploads it.
    pub fn upload(
        be: &CudaBackend,
        batch: &AttnBatch<'_>,
        block_size: usize,
        n_blocks: usize,
    ) -> Result<Self> {
        anyhow::ensure!(block_size > 0, "paged_attention: block_size must be > 0");
        let need = validate::attention_batch(batch, block_size, n_blocks)?;
        let max_pos = batch.positions.iter().copied().max().unwrap_or(0) as usize;
        let mut flat = Vec::new();
        let mut offs = Vec::with_capacity(need.len());
        for (s, &nb) in need.iter().enumerate() {
            offs.push(u32::try_from(flat.len()).context("block tables too long")?);
            flat.extend_from_slice(&batch.block_tables[s][..nb]);
        }
        Ok(DevAttnBatch {
            tables: be.up(&flat, "paged_attention: block tables")?,
            table_off: be.up(&offs, "paged_attention: table offsets")?,
            row_seq: be.up(batch.row_seq, "paged_attention: row_seq")?,
            positions: be.up(batch.positions, "paged_attention: positions")?,
            held_tables: None,
            held_offs: None,
            held_steps: None,
            n_rows: batch.positions.len(),
            block_size,
            n_blocks,
            part_stride: att_parts(max_pos),
            part_ctas: att_parts(max_pos),
            tiles: fa_tiles_for(be, batch.row_seq)?,
            one_row_per_seq: distinct(batch.row_seq),
        })
    }

    /// (n_rows,) absolute position of each query row.
    pub fn positions(&self) -> CudaView<'_, u32> {
        self.positions.slice(0..self.n_rows)
    }

    /// Word `k * n_rows` of a fixed batch's step words (positions, slots,
    /// tokens, statuses, ticket), checked to be one.
    fn fixed_part(&self, k: usize, what: &str) -> Result<std::ops::Range<usize>> {
        let n = self.n_rows;
        anyhow::ensure!(
            self.positions.len() > 4 * n,
            "decode batch: {what} of a batch that is not fixed"
        );
        Ok(k * n..(k + 1) * n)
    }

    /// (n_rows,) each row's KV slot, refilled with the positions: fixed
    /// batches only.
    pub fn slots(&self) -> Result<CudaView<'_, u32>> {
        Ok(self.positions.slice(self.fixed_part(1, "slots")?))
    }

    /// (n_rows,) each row's input token, refilled with the positions
    /// unless a greedy chain's last node wrote them: fixed batches only.
    pub fn tokens(&self) -> Result<CudaView<'_, u32>> {
        Ok(self.positions.slice(self.fixed_part(2, "tokens")?))
    }

    /// The tokens, to be written in place (a chained step's tokens from
    /// another graph's batch).
    pub fn tokens_mut(&mut self) -> Result<CudaViewMut<'_, u32>> {
        let r = self.fixed_part(2, "tokens")?;
        Ok(self.positions.slice_mut(r))
    }

    /// (2 * n_rows,) the tokens then one status word per row: where a
    /// greedy graph's last node (sample_rows) writes the next step's
    /// tokens and their statuses.
    pub fn tokens_and_status(&self) -> Result<CudaView<'_, u32>> {
        let r = self.fixed_part(2, "tokens")?;
        Ok(self.positions.slice(r.start..r.end + self.n_rows))
    }

    /// (4 * n_rows + 1,) a fixed batch's step words: positions, slots,
    /// tokens, statuses, and the ticket word that a greedy graph's
    /// sample_rows counts its rows' CTAs with (zero between launches):
    /// the last CTA advances every row's position and slot by one
    /// (sample.cu).
    pub fn step_words(&self) -> Result<CudaView<'_, u32>> {
        let r = self.fixed_part(0, "step words")?;
        Ok(self.positions.slice(0..4 * r.end + 1))
    }

    /// What the device will hold of the positions and slots once the
    /// copies enqueued so far have run, taken while a step that reads them
    /// is being enqueued: if it fails before its replay is on the stream,
    /// the words are dropped (unknown: the next refill copies them).
    pub fn take_held_steps(&mut self) -> Option<Vec<u32>> {
        self.held_steps.take()
    }

    /// Gives back [`DevAttnBatch::take_held_steps`]'s words once the step
    /// is on the stream; `greedy`: its graph ends with sample_rows, which
    /// advances every row's position and slot by one (sample.cu), so the
    /// next chained step at those positions skips their copy.
    pub fn hold_steps(&mut self, held: Option<Vec<u32>>, greedy: bool) {
        self.held_steps = after_step(held, greedy);
    }

    /// A batch of `n_rows` rows, one per sequence, whose block tables hold
    /// at most `stride` blocks: fixed buffers (a captured graph reads
    /// them) refilled by [`DevAttnBatch::refill`] before each replay.
    /// Partial slots cover any position; `part_ctas` is baked into the
    /// graph (rows past it only get fewer CTAs, the same result).
    pub fn fixed(
        be: &CudaBackend,
        n_rows: usize,
        stride: usize,
        block_size: usize,
        n_blocks: usize,
        part_ctas: usize,
    ) -> Result<Self> {
        u32::try_from(n_rows * stride).context("block tables too long")?;
        let seqs: Vec<u32> = (0..n_rows as u32).collect();
        Ok(DevAttnBatch {
            tables: zeros::<u32>(be, n_rows * stride, "decode block tables")?,
            table_off: zeros::<u32>(be, n_rows, "decode table offsets")?,
            row_seq: be.up(&seqs, "decode row_seq")?,
            positions: zeros::<u32>(be, 4 * n_rows + 1, "decode positions, slots and tokens")?,
            held_tables: None,
            held_offs: None,
            held_steps: None,
            n_rows,
            block_size,
            n_blocks,
            part_stride: ATT_PARTS,
            part_ctas: part_ctas.clamp(1, ATT_PARTS),
            tiles: None,
            one_row_per_seq: true,
        })
    }

    /// Validates a one-row-per-sequence `batch` against this fixed batch's
    /// cache geometry and copies its tables, positions, the rows' KV
    /// `slots` and their input `tokens` (None: a greedy chain's graph wrote
    /// them on the device) in place, through `stage` (n_rows * (stride +
    /// 3) values; page-locked memory makes the copies asynchronous, so the
    /// caller must not rewrite it before they have run). The positions,
    /// slots and tokens go up in one copy; the tables only when they
    /// changed (a decode step's table grows a block every block_size
    /// tokens), and a chained step's positions and slots only when they
    /// are not what the device holds (`held_steps`: its last greedy replay
    /// advanced them by one, so only a step into a new block copies): a
    /// copy on the stream between two replays costs the device a few
    /// microseconds. Returns whether any copy from `stage` was
    /// enqueued (a chained greedy step often has none: then the caller
    /// records no event behind it).
    pub fn refill(
        &mut self,
        be: &CudaBackend,
        batch: &AttnBatch<'_>,
        slots: &[u32],
        tokens: Option<&[u32]>,
        stride: usize,
        stage: &mut [u32],
    ) -> Result<bool> {
        let need = validate::attention_batch(batch, self.block_size, self.n_blocks)?;
        anyhow::ensure!(
            batch.positions.len() == self.n_rows
                && batch.block_tables.len() == self.n_rows
                && batch
                    .row_seq
                    .iter()
                    .enumerate()
                    .all(|(i, &s)| s as usize == i),
            "decode batch: expected {} rows, one per sequence, in order",
            self.n_rows
        );
        let n = self.n_rows;
        anyhow::ensure!(
            stage.len() == n * (stride + 4)
                && slots.len() == n
                && tokens.is_none_or(|t| t.len() == n),
            "decode batch: staging of {} values, {} slots and {:?} tokens for {n} rows of \
             {stride} blocks",
            stage.len(),
            slots.len(),
            tokens.map(<[u32]>::len)
        );
        // The step words' layout (positions, slots, tokens): a fixed batch's.
        self.fixed_part(2, "a refill")?;
        let (used, words) = stage_step(batch, &need, slots, tokens, stride, stage)?;
        let (offs, rest) = stage.split_at_mut(n);
        let (flat, pos) = rest.split_at_mut(n * stride);
        let tables = upload_if_changed(
            be,
            &mut self.held_tables,
            &flat[..used],
            &mut self.tables,
            "decode block tables",
        )?;
        let offsets = upload_if_changed(
            be,
            &mut self.held_offs,
            offs,
            &mut self.table_off,
            "decode table offsets",
        )?;
        // Taken: unknown (None) if the copy fails; its buffer reused.
        let held = self.held_steps.take();
        let copy = step_copy(held.as_deref(), &pos[..words]);
        if copy > 0 {
            drv(
                be.stream()
                    .memcpy_htod(&pos[..copy], &mut self.positions.slice_mut(0..copy)),
                "decode positions, slots and tokens",
            )?;
        }
        let mut held = held.unwrap_or_default();
        held.clear();
        held.extend_from_slice(&pos[..2 * n]);
        self.held_steps = Some(held);
        Ok(tables || offsets || copy > 0)
    }
}

/// A device allocation of `len` elements of `T`, zero-filled.
pub fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    be: &CudaBackend,
    len: usize,
    what: &str,
) -> Result<CudaSlice<T>> {
    drv(be.stream().alloc_zeros::<T>(len.max(1)), what)
}

impl crate::backend::validate::ParamLen for CudaView<'_, f32> {
    fn param_len(&self) -> usize {
        self.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fa_tiles_cut_runs_of_one_sequence_into_sixteen() {
        let mut rows = vec![3u32; 20];
        rows.extend([5, 5, 3]);
        assert_eq!(fa_tiles(&rows), vec![0, 16, 16, 4, 20, 2, 22, 1]);
        assert_eq!(fa_tiles(&[]), Vec::<u32>::new());
    }

    #[test]
    fn one_row_per_sequence_is_detected() {
        assert!(distinct(&[]));
        assert!(distinct(&[4, 0, 7]));
        assert!(!distinct(&[4, 0, 4]));
        assert!(!distinct(&[2, 2]));
    }

    #[test]
    fn a_refill_copies_tables_only_when_they_change() {
        let mut held = None;
        assert!(held_changed(&mut held, &[7, 3]));
        assert!(!held_changed(&mut held, &[7, 3]));
        // A block appended, a block replaced (copy on write), a table cut.
        assert!(held_changed(&mut held, &[7, 3, 9]));
        assert!(!held_changed(&mut held, &[7, 3, 9]));
        assert!(held_changed(&mut held, &[7, 4, 9]));
        assert!(held_changed(&mut held, &[7, 4]));
        assert_eq!(held.as_deref(), Some(&[7, 4][..]));
        // An empty prefix (no row reads a block) is held too.
        assert!(held_changed(&mut held, &[]));
        assert!(!held_changed(&mut held, &[]));
    }

    #[test]
    fn a_chained_step_copies_positions_and_slots_only_into_a_new_block() {
        // Two rows (n = 2), KV blocks of 16 tokens: row 0 at position 30
        // (block 4: slots 64..80), row 1 at 47 (block 9: slots 144..160).
        let first = [30u32, 47, 78, 159, 11, 12];
        // An unchained step copies everything, whatever the device holds.
        assert_eq!(step_copy(None, &first), 6);
        assert_eq!(step_copy(Some(&first[..4]), &first), 6);
        // Its greedy replay advances the positions and slots on the device.
        let held = after_step(Some(first[..4].to_vec()), true);
        assert_eq!(held.as_deref(), Some(&[31u32, 48, 79, 160][..]));
        // The chained step at 31 / 48: row 1 enters a new block (the host
        // allocated block 12: slot 192, not 160), so both words go up.
        let next = [31u32, 48, 79, 192];
        assert_eq!(step_copy(held.as_deref(), &next), 4);
        // The device holds them now; the step after needs no copy...
        let held = after_step(Some(next.to_vec()), true);
        assert_eq!(step_copy(held.as_deref(), &[32, 49, 80, 193]), 0);
        // ...unless the graph did not advance them (a graph that copies
        // the logits out instead).
        let held = after_step(Some(next.to_vec()), false);
        assert_eq!(step_copy(held.as_deref(), &[32, 49, 80, 193]), 4);
        // A failed step leaves them unknown: copied.
        assert_eq!(step_copy(None, &[32, 49, 80, 193]), 4);
    }

    #[test]
    fn a_step_is_staged_offsets_packed_tables_then_positions_slots_tokens() {
        // Two rows, room for 4 blocks a row: row 0 reads 3 blocks, row 1 one.
        let (t0, t1) = ([5u32, 6, 7, 8], [9u32, 10]);
        let tables: [&[u32]; 2] = [&t0, &t1];
        let batch = AttnBatch {
            block_tables: &tables,
            row_seq: &[0, 1],
            positions: &[40, 3],
        };
        // Stale words from an earlier use of the buffer.
        let mut stage = vec![77u32; 2 * (4 + 4)];
        let r = stage_step(&batch, &[3, 1], &[101, 102], Some(&[11, 12]), 4, &mut stage);
        assert_eq!(r.unwrap(), (4, 6));
        // Offsets 0 and 3, the tables packed, the room past them left
        // alone (never copied).
        assert_eq!(
            stage,
            [0, 3, 5, 6, 7, 9, 77, 77, 77, 77, 40, 3, 101, 102, 11, 12]
        );
        // A chained step: no tokens, two words a row.
        let mut stage2 = vec![0u32; 16];
        let r = stage_step(&batch, &[3, 1], &[101, 102], None, 4, &mut stage2);
        assert_eq!(r.unwrap(), (4, 4));
        assert_eq!(&stage2[..6], &stage[..6]);
        // A table longer than the stride is an error, not a panic.
        let mut stage3 = vec![0u32; 2 * (2 + 4)];
        assert!(stage_step(&batch, &[3, 1], &[1, 2], None, 2, &mut stage3).is_err());
    }

    #[test]
    fn att_parts_is_capped() {
        assert_eq!(att_parts(0), 1);
        assert_eq!(att_parts(ATT_CHUNK - 1), 1);
        assert_eq!(att_parts(ATT_CHUNK), 2);
        assert_eq!(att_parts(100 * ATT_CHUNK), ATT_PARTS);
    }
}
