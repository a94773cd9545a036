//! The L2 read-ahead of captured decode graphs (kernels/l2_ahead_fast.cu).
//!
//! A decode step reads every weight once, in a fixed order, through a
//! chain of dependent kernels; while the latency-bound ones run (norms,
//! rope, attention, the small matvecs) DRAM idles. A one-row `fast` decode
//! graph whose weights call for it (`auto_ahead`: Q4_0 / Q4_1 / Q8_0, 256
//! MiB or more) gets a second branch: after a memset of a progress word,
//! one `l2_ahead` grid of 32 one-warp CTAs runs beside the whole chain and
//! prefetches the step's weights into L2, a fixed distance (4-16 MiB) past
//! the chain's read position, which the one-row matvecs publish (`mv_mark`,
//! common.cuh). The matvecs read the weights evict-first (MV_L2_POL,
//! dequant.cuh), so the prefetched lines outlive the consumed ones.
//! Measured on an H100 (2026-11-27): 8B Q4_0 tg128 +8% (+13% with the
//! evict-first loads), 1B Q4_0 +5%, 8B Q8_0 +3% over the evict-first loads
//! alone (docs/PERF.md). Not in `exact` mode: its graphs measured slower
//! with it (8B Q4_0 after a 512-token prompt 279 -> 239 tok/s; again on an
//! H200 on 2026-11-27, commit 8de7f66, with the exact matvecs marking
//! their progress, tg128 / tg128@d512: off 329.0 / 309.1 tok/s; on, with
//! the attention clusters as without it 319.0 / 271.3, without clusters
//! 319.5 / 264.9, with clusters of two-per-SM CTAs 309.1 / 251.6; 8B Q8_0
//! off 268.6 / 255.3, on 254.1 / 222.8: the exact matvec, latency-bound at
//! three CTAs per SM, loses SM room to the read-ahead's resident CTAs).
//!
//! How a graph gets it: its first, uncaptured step records the weights its
//! matvecs read (`l2_measure` / `l2_measured`: is the distance 0?); the
//! capture then forks the branch (`l2_begin`), records the weights again
//! with the marks pointed at the progress word (`l2_record`, called by the
//! matvec launch), joins the branch last (`l2_end`), and the piece table
//! is uploaded once after the capture, before the first replay
//! (`l2_upload`). The tuning table's `matvec.l2_ahead_mb` = 0 turns it
//! off, N forces N MiB on every decode graph of any row count
//! (`matvec.l2_piece_kb`, `matvec.l2_ctas`: the pieces and CTAs).
//!
//! The branch writes nothing the chain reads, and the chain never waits
//! for it (it joins the stream only at the graph's end): results are the
//! same bits with it on or off.

use crate::backend::cuda::device::launch::dev_ptr;
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::i32_of;
use crate::backend::cuda::ops::matmul::MmJobs;
use crate::backend::cuda::{drv, CudaBackend, MatvecTuning};
use crate::backend::MatJob;
use crate::quant::GgmlType;
use anyhow::{bail, Result};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// Bytes per unit of the progress word and the pieces' end marks.
const UNIT: u64 = 256;

/// How far ahead the read-ahead runs (tuning `matvec.l2_ahead_mb`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Ahead {
    Off,
    /// The distance follows the step's weight bytes (`auto_ahead`).
    Auto,
    Bytes(u64),
}

/// The read-ahead's settings from the tuning table: the distance (null:
/// auto; 0: off; else MiB), bytes per bulk prefetch and CTAs of the
/// read-ahead grid (clamped into what the kernel takes).
fn knobs(t: &MatvecTuning) -> (Ahead, u64, u32) {
    let ahead = match t.l2_ahead_mb {
        None => Ahead::Auto,
        Some(0) => Ahead::Off,
        Some(mb) => Ahead::Bytes(mb << 20),
    };
    (
        ahead,
        (t.l2_piece_kb.min(1 << 20) << 10).clamp(4 << 10, 1 << 30),
        t.l2_ctas.clamp(1, 1024),
    )
}

/// Whether the automatic rule reads ahead of weights of type `ty`: Q4_0,
/// Q4_1 and Q8_0, whose matvec loads are evict-first (MV_L2_POL in
/// dequant.cuh) and were measured.
fn streams_ahead(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// The automatic distance for a step that reads `total` bytes of weights,
/// all of them of `streams_ahead` types (`ok`): none for other types or
/// under 256 MiB, else total / 48 within [4, 16] MiB. Measured on an H100
/// (2026-11-27, bulk prefetches, 32 CTAs, the matvecs' weight loads
/// evict-first), greedy tg128 tok/s: the 8B Q4_0 (4.5 GB) 431 at 16 MiB,
/// 431 at 24, 413 at 32, 346 at 40; the 1B Q4_0 (0.7 GB) 1,571 at 8, 1,591
/// at 12, 1,586 at 16 and 20, 1,503 at 32; the 8B Q8_0 277 without, 283 at
/// 16, 286 at 24; SmolLM2-135M slower at 4-16 MiB (1,588 without,
/// 1,535-1,541). The Q8_0 cap was 24 MiB from that H100 run until the
/// H200 (the machine) measured 16 faster in three calls
/// (2026-11-28, tg128 / tg128@d512 tok/s, 16 against 24 MiB: 374.5 /
/// 363.5 against 365.9 / 358.4 and 371.8 / 362.0 against 368.0 / 360.5 in
/// one call, 1.1-1.5% in an earlier one). Before the evict-first loads the
/// Q8_0 lost 2% after a 512-token prompt and distances past 16-20 MiB were
/// slower than none: the lines the chain had just read stayed in the 50 MB
/// L2.
pub(crate) fn auto_ahead(total: u64, ok: bool) -> u64 {
    const MIB: u64 = 1 << 20;
    if !ok || total < 256 * MIB {
        0
    } else {
        (total / 48).clamp(4 * MIB, 16 * MIB)
    }
}

/// The distance for a step of `total` bytes of weights (`ok`: all of
/// `streams_ahead` types) under the tuning table; 0: none.
fn distance(t: &MatvecTuning, total: u64, ok: bool) -> u64 {
    match knobs(t).0 {
        Ahead::Off => 0,
        Ahead::Auto => auto_ahead(total, ok),
        Ahead::Bytes(v) => v,
    }
}

/// The weights a step's matvecs read, in order, while the step is
/// measured (`l2_measure`, no marks) or captured (`l2_begin`).
pub(crate) struct L2Log {
    /// Device address of the progress word the matvecs raise.
    mark_ptr: u64,
    /// Bytes of the weight stream so far.
    pos: u64,
    /// (device address, bytes) of each weight matrix, in stream order.
    segs: Vec<(u64, u64)>,
    /// Every matrix so far is of a `streams_ahead` type (`auto_ahead`).
    types_ok: bool,
}

impl L2Log {
    fn new(mark_ptr: u64) -> Self {
        L2Log {
            mark_ptr,
            pos: 0,
            segs: Vec::new(),
            types_ok: true,
        }
    }

    /// Whether this log belongs to a capture with the read-ahead branch
    /// (its marks go to a progress word), not to the uncaptured step that
    /// only measures the weights (`l2_measure`).
    fn with_branch(&self) -> bool {
        self.mark_ptr != 0
    }
}

/// A decode graph's read-ahead buffers (reused by its recaptures).
pub(crate) struct L2Bufs {
    /// (3,) u64: the piece count, the pieces' address and the distance
    /// (l2_ahead_fast.cu).
    head: CudaSlice<u64>,
    /// (2 n,) u64: the piece table, made after the capture.
    pieces: Option<CudaSlice<u64>>,
    /// (4,) i32: the chain's read position, in 256-byte units, then the
    /// kernel's give-up record (l2_ahead_fast.cu; `l2_trace`).
    progress: CudaSlice<i32>,
    /// The uploaded table's stream end and distance, in 256-byte units
    /// (for `l2_trace`).
    end_units: u64,
    ahead_units: u64,
    /// The stream of the read-ahead's branch while the step is captured.
    side: Arc<CudaStream>,
    fork: CudaEvent,
    join: CudaEvent,
}

/// The piece table of a stream of weight matrices (address, bytes):
/// pieces of at most `piece` bytes (a multiple of 16), each with its end
/// in the stream in 256-byte units, rounded up; whole 16-byte runs only
/// (a bulk prefetch moves multiples of 16 bytes; a tail under 16 bytes is
/// left to the chain).
pub(crate) fn piece_table(segs: &[(u64, u64)], piece: u64) -> Result<Vec<u64>> {
    let piece = (piece / 16).max(1) * 16;
    let mut t = Vec::new();
    let mut pos = 0u64;
    for &(addr, bytes) in segs {
        if !addr.is_multiple_of(16) {
            bail!("l2 read-ahead: weights at {addr:#x} are not 16-byte aligned");
        }
        let mut off = 0u64;
        while off + 16 <= bytes {
            let len = (bytes - off).min(piece) / 16 * 16;
            let end = (pos + off + len).div_ceil(UNIT);
            if end > i32::MAX as u64 {
                bail!("l2 read-ahead: a step of more than 512 GiB of weights");
            }
            t.push(addr + off);
            t.push((end << 32) | len);
            off += len;
        }
        pos += bytes;
    }
    Ok(t)
}

impl CudaBackend {
    /// The weight log of the step being measured or captured (None: no
    /// step records).
    fn l2_log(&self) -> Result<std::sync::MutexGuard<'_, Option<L2Log>>> {
        self.l2_log
            .lock()
            .map_err(|_| anyhow::anyhow!("l2 log poisoned"))
    }

    /// Whether a capture with the read-ahead branch is under way (its
    /// CTAs will be resident beside every kernel captured now).
    pub(crate) fn l2_branch_live(&self) -> Result<bool> {
        Ok(self.l2_log()?.as_ref().is_some_and(L2Log::with_branch))
    }

    /// Whether decode graphs get the read-ahead branch: unless
    /// `matvec.l2_ahead_mb` is 0, on devices with bulk prefetches (sm_90+,
    /// where decode graphs have programmatic edges).
    pub(crate) fn l2_ahead_on(&self) -> bool {
        knobs(&self.tuning.matvec).0 != Ahead::Off && self.pdl_enabled()
    }

    /// A launch of the one-row matvec with job table `table` during a
    /// capture with the read-ahead: the jobs' weights join the stream and
    /// the table points the kernel's marks at the progress word.
    pub(super) fn l2_record(&self, jobs: &[MatJob<'_, Dev>], table: &mut MmJobs) -> Result<()> {
        let mut log = self.l2_log()?;
        let Some(log) = log.as_mut() else {
            return Ok(());
        };
        let Some(j0) = jobs.first() else {
            return Ok(());
        };
        // The row bytes of the type (as mm_dims: the buffer carries padding).
        let rb =
            j0.w.ty
                .row_bytes(j0.w.cols)
                .map_err(|e| anyhow::anyhow!("l2 read-ahead: {e}"))?;
        let s = self.stream();
        let start = log.pos;
        log.types_ok &= jobs.iter().all(|j| streams_ahead(j.w.ty));
        for j in jobs {
            let bytes = (j.w.rows * rb) as u64;
            log.segs.push((dev_ptr(&j.w.data, s), bytes));
            log.pos += bytes;
        }
        table.set_marks(log.mark_ptr, i32_of((start / UNIT) as usize, "l2 mark")?);
        // The read-ahead brings these weights into L2 before the chain
        // reads them, so the matvec's own prefetch before its wait
        // (mv_prefetch) only competes with the kernel before it: measured
        // on an H200 (2026-11-29, the 1B Q4_0, whose q/k/v and o matrices
        // are under the 4 MiB prefetch limit; tg128 / tg128@d512 tok/s,
        // prefetch on -> off, two pairs): 2,043.0 / 1,895.8 -> 2,068.2 /
        // 1,932.8 and 2,064.9 / 1,887.7 -> 2,069.9 / 1,935.1. SmolLM2,
        // without the read-ahead, keeps it (off: -6%).
        table.no_prefetch();
        Ok(())
    }

    /// Before a capture: the graph's read-ahead buffers, made or reused;
    /// false when the read-ahead is off, or its uncaptured step measured a
    /// distance of 0 (`measured`: `l2_measured`'s answer), so the graph gets
    /// no branch.
    pub(crate) fn l2_prepare(
        &self,
        bufs: &mut Option<L2Bufs>,
        measured: Option<u64>,
    ) -> Result<bool> {
        if !self.l2_ahead_on() || measured == Some(0) {
            return Ok(false);
        }
        if bufs.is_some() {
            return Ok(true);
        }
        let s = self.stream();
        let ctx = s.context();
        *bufs = Some(L2Bufs {
            head: drv(s.alloc_zeros::<u64>(3), "l2 read-ahead head")?,
            pieces: None,
            progress: drv(s.alloc_zeros::<i32>(4), "l2 read-ahead progress")?,
            end_units: 0,
            ahead_units: 0,
            side: drv(ctx.new_stream(), "l2 read-ahead stream")?,
            fork: drv(ctx.new_event(None), "l2 read-ahead event")?,
            join: drv(ctx.new_event(None), "l2 read-ahead event")?,
        });
        Ok(true)
    }

    /// In a capture, first: the progress word zeroed, then the read-ahead
    /// branch forked off the stream; the matvecs captured after this record
    /// their weights (`l2_record`).
    pub(crate) fn l2_begin(&self, b: &mut L2Bufs) -> Result<()> {
        let s = self.stream();
        drv(s.memset_zeros(&mut b.progress), "l2 read-ahead: progress")?;
        drv(b.fork.record(s), "l2 read-ahead: fork")?;
        drv(b.side.wait(&b.fork), "l2 read-ahead: fork")?;
        let ctas = knobs(&self.tuning.matvec).2;
        let cfg = LaunchConfig {
            grid_dim: (ctas, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = b.side.launch_builder(self.func("l2_ahead")?);
        l.arg(&b.head).arg(&b.progress);
        // SAFETY: matches l2_ahead (head, progress): head holds a piece
        // count, the address of that many (address, word) pairs and the
        // distance (a count of zero until l2_upload, which runs before any
        // replay, fills them), progress four i32.
        drv(
            unsafe { l.launch(cfg) },
            "l2 read-ahead: launching l2_ahead",
        )?;
        let mark_ptr = {
            use cudarc::driver::DevicePtr;
            b.progress.device_ptr(s).0
        };
        *self.l2_log()? = Some(L2Log::new(mark_ptr));
        Ok(())
    }

    /// Whether a decode graph of `rows` rows may get the read-ahead: with
    /// the automatic distance only one-row graphs (the only ones
    /// measured; batches of 8 or more rows run the tensor-core kernels,
    /// which publish no progress), with an explicit one any.
    pub(crate) fn l2_wants_rows(&self, rows: usize) -> bool {
        self.l2_ahead_on() && (knobs(&self.tuning.matvec).0 != Ahead::Auto || rows == 1)
    }

    /// Before an uncaptured step: its matvecs record their weights
    /// (without marks) so that `l2_measured` can tell whether the graph
    /// captured next wants the read-ahead at all.
    pub(crate) fn l2_measure(&self) -> Result<()> {
        if self.l2_ahead_on() {
            *self.l2_log()? = Some(L2Log::new(0));
        }
        Ok(())
    }

    /// After the step `l2_measure` came before (also a failed one): the
    /// read-ahead distance its weights call for (0: none; None: not
    /// measured).
    pub(crate) fn l2_measured(&self) -> Result<Option<u64>> {
        let t = &self.tuning.matvec;
        Ok(self
            .l2_log()?
            .take()
            .map(|l| distance(t, l.pos, l.types_ok)))
    }

    /// A diagnostic at `trace` level (RUST_LOG=quire::backend::cuda=trace;
    /// it synchronizes the stream, so it is off otherwise): after a replay,
    /// waits for it and logs where the chain's marks ended and whether
    /// read-ahead CTAs gave up waiting (a step that waits out the kernel's
    /// patience), for the first 4 replays of a graph and every 64th.
    pub(crate) fn l2_trace(&self, b: &L2Bufs, replay: u64) -> Result<()> {
        if !tracing::enabled!(tracing::Level::TRACE) {
            return Ok(());
        }
        if replay >= 4 && !replay.is_multiple_of(64) {
            return Ok(());
        }
        let v = drv(
            self.stream().clone_dtoh(&b.progress),
            "l2 read-ahead: trace",
        )?;
        tracing::trace!(
            "l2 read-ahead: replay {replay}: marks reached {} of {} units (ahead {}); {} CTAs gave up, on a piece ending at {}, at mark {}",
            v[0], b.end_units, b.ahead_units, v[1], v[2], v[3]
        );
        Ok(())
    }

    /// In a capture, last (also after a failed step, so the branch is
    /// joined): the branch joined back into the stream; the weights the
    /// step recorded.
    pub(crate) fn l2_end(&self, b: &L2Bufs) -> Result<L2Log> {
        let log = self.l2_log()?.take().unwrap_or_else(|| L2Log::new(0));
        drv(b.join.record(&b.side), "l2 read-ahead: join")?;
        drv(self.stream().wait(&b.join), "l2 read-ahead: join")?;
        Ok(log)
    }

    /// After a successful capture, before its first replay: the piece
    /// table of the recorded weights, on the stream.
    pub(crate) fn l2_upload(&self, b: &mut L2Bufs, log: &L2Log) -> Result<(usize, u64)> {
        let ahead = distance(&self.tuning.matvec, log.pos, log.types_ok);
        let mut t = if ahead == 0 {
            Vec::new()
        } else {
            piece_table(&log.segs, knobs(&self.tuning.matvec).1)?
        };
        let n = t.len() / 2;
        if t.is_empty() {
            t = vec![0, 0]; // no allocation of nothing; the count says 0
        }
        let s = self.stream();
        // A new table per capture (the old one is freed in stream order,
        // after the replays that read it).
        let pieces = drv(s.clone_htod(&t), "l2 read-ahead: pieces")?;
        let addr = {
            use cudarc::driver::DevicePtr;
            pieces.device_ptr(s).0
        };
        let units = ahead.div_ceil(UNIT).min(i32::MAX as u64);
        drv(
            s.memcpy_htod(&[n as u64, addr, units], &mut b.head),
            "l2 read-ahead: head",
        )?;
        b.pieces = Some(pieces);
        b.end_units = log.pos.div_ceil(UNIT);
        b.ahead_units = units;
        Ok((n, ahead))
    }
}

#[cfg(test)]
mod tests {
    use super::piece_table;

    #[test]
    fn pieces_cover_the_stream_in_order() {
        // Two matrices: 102,408 bytes, then 40,000 bytes; 64 KiB pieces.
        let a = 0x7000_0000u64;
        let b = 0x7100_0000u64;
        let t = piece_table(&[(a, 102_408), (b, 40_000)], 65_536).unwrap();
        assert_eq!(t.len(), 2 * 3);
        let p: Vec<(u64, u64, u64)> = t
            .chunks(2)
            .map(|c| (c[0], c[1] & 0xffff_ffff, c[1] >> 32))
            .collect();
        // (address, bytes, end in 256-byte units rounded up): the 8-byte
        // tail of the first matrix is left out, but the second one's stream
        // position counts it.
        assert_eq!(
            p,
            vec![
                (a, 65_536, 256),
                (a + 65_536, 36_864, 400),
                (b, 40_000, (102_408u64 + 40_000).div_ceil(256)),
            ]
        );
        // A piece size not a multiple of 16 is rounded down to one.
        let t = piece_table(&[(a, 4096)], 1000).unwrap();
        assert_eq!(t.len(), 2 * 5);
        assert_eq!(t[1] & 0xffff_ffff, 992);
        assert_eq!(t[2 * 4 + 1] & 0xffff_ffff, 4096 - 4 * 992);
    }

    #[test]
    fn auto_distance() {
        use super::{auto_ahead, streams_ahead};
        use crate::quant::GgmlType;
        let mib = 1u64 << 20;
        let of = |tys: &[GgmlType]| tys.iter().all(|&ty| streams_ahead(ty));
        // Q4_0, Q4_1 and Q8_0 alike (one cap since the H200's Q8_0 runs).
        let ok = of(&[GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]);
        assert!(ok);
        assert!(!of(&[GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::Q8_0]));
        assert!(!of(&[GgmlType::F16]));
        assert_eq!(auto_ahead(93 * mib, ok), 0); // SmolLM2-135M Q4_0
        assert_eq!(auto_ahead(256 * mib, ok), 16 * mib / 3);
        assert_eq!(auto_ahead(150 * mib, ok), 0);
        assert_eq!(auto_ahead(663 * mib, ok), 663 * mib / 48); // Llama-3.2-1B Q4_0
        assert_eq!(auto_ahead(4520 * mib, ok), 16 * mib); // Llama-3.1-8B Q4_0
        assert_eq!(auto_ahead(8540 * mib, ok), 16 * mib); // Llama-3.1-8B Q8_0
        assert_eq!(auto_ahead(16060 * mib, of(&[GgmlType::F16])), 0);
    }

    #[test]
    fn only_a_capture_with_the_branch_counts_as_live() {
        use super::L2Log;
        // The uncaptured measuring step's log has no progress word: its
        // attention may still run in clusters; a capture's log has one.
        assert!(!L2Log::new(0).with_branch());
        assert!(L2Log::new(0x7f00_0000_0100).with_branch());
    }

    #[test]
    fn settings_from_the_tuning_table() {
        use super::{distance, knobs, Ahead};
        let mut t = crate::backend::cuda::Tuning::for_arch("sm_90").matvec;
        assert_eq!(knobs(&t), (Ahead::Auto, 64 << 10, 32));
        let mib = 1u64 << 20;
        assert_eq!(distance(&t, 4520 * mib, true), 16 * mib);
        t.l2_ahead_mb = Some(0);
        assert_eq!(knobs(&t).0, Ahead::Off);
        assert_eq!(distance(&t, 4520 * mib, true), 0);
        t.l2_ahead_mb = Some(12);
        assert_eq!(distance(&t, 93 * mib, false), 12 * mib);
        // Pieces and CTAs kept within what the kernel takes.
        (t.l2_piece_kb, t.l2_ctas) = (1, 0);
        assert_eq!((knobs(&t).1, knobs(&t).2), (4 << 10, 1));
        (t.l2_piece_kb, t.l2_ctas) = (u64::MAX, 5000);
        assert_eq!((knobs(&t).1, knobs(&t).2), (1 << 30, 1024));
    }

    #[test]
    fn misaligned_weights_are_refused() {
        assert!(piece_table(&[(0x7000_0008, 4096)], 65_536).is_err());
    }
}
