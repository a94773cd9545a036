//! The invariance grid (`quire check-invariance`): paged attention over
//! head dims, KV lengths, batches, GQA ratios, masks and score options,
//! and the RMS norm and matmuls around it, checking that a row's bits
//! depend on its own inputs only:
//! * **batch**: a decode row alone = the same row among strangers;
//! * **chunked**: a sequence's rows prefilled at once = in three chunks
//!   (the middle one sharing its launch with strangers' decode rows);
//! * **token**: = one row per launch (sampled positions);
//! * **rerun**: the same launch twice;
//! * **cpu** (`exact` on another backend): = the cpu reference.
//!
//! Backend-agnostic (the `Backend` trait over host slices). Its negative
//! control is a backend whose results do depend on the batch
//! ([`control::BatchVariant`], or cuda's `fast` mode): the grid must find
//! differences there, which shows that the checks can fail.

pub mod control;

use super::randv;
use crate::backend::{alibi_slopes, AttnBatch, AttnOpts, Backend, KvLayer, Mode, Op, QMatrix};
use crate::quant::GgmlType;
use half::f16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Score options a cell adds to the mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    None,
    Alibi,
    Sinks,
    Softcap,
}

/// One point of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    pub head_dim: usize,
    pub kv_len: usize,
    pub batch: usize,
    /// Query heads per KV head (two KV heads).
    pub gqa: usize,
    pub sliding: bool,
    pub feature: Feature,
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hd={} kv={} batch={} gqa={} mask={} {:?}",
            self.head_dim,
            self.kv_len,
            self.batch,
            self.gqa,
            if self.sliding { "sliding" } else { "causal" },
            self.feature
        )
    }
}

/// The grid's axes: the full grid, or the reduced one (cpu CI).
pub fn cells(full: bool) -> Vec<Cell> {
    let (hds, kvs, batches, gqas): (&[usize], &[usize], &[usize], &[usize]) = if full {
        (
            &[64, 80, 96, 112, 128, 256],
            &[256, 1024],
            &[1, 8, 33],
            &[1, 2, 4, 8],
        )
    } else {
        (&[64, 80, 256], &[256], &[1, 8], &[1, 8])
    };
    let features = [
        Feature::None,
        Feature::Alibi,
        Feature::Sinks,
        Feature::Softcap,
    ];
    let mut v = Vec::new();
    for &head_dim in hds {
        for &kv_len in kvs {
            for &batch in batches {
                for &gqa in gqas {
                    for sliding in [false, true] {
                        for feature in features {
                            v.push(Cell {
                                head_dim,
                                kv_len,
                                batch,
                                gqa,
                                sliding,
                                feature,
                            });
                        }
                    }
                }
            }
        }
    }
    v
}

/// Query heads share KV heads in pairs of this many KV heads.
const KV_HEADS: usize = 2;
const BLOCK: usize = 16;

/// One difference or error the grid found.
#[derive(Clone, Debug)]
pub struct Finding {
    pub what: String,
    pub check: &'static str,
    pub detail: String,
}

/// What a run of the grid found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub cells: usize,
    /// Comparisons made (each bitwise).
    pub checks: usize,
    pub diffs: Vec<Finding>,
    pub errors: Vec<Finding>,
    /// Launches the backend does not support (counted, never passed).
    pub unsupported: usize,
}

/// The attention of one cell: its cache, sequences and query rows.
struct AttnCell {
    nh: usize,
    hd: usize,
    k: Vec<f16>,
    v: Vec<f16>,
    tables: Vec<Vec<u32>>,
    /// Length of each sequence (0: the target of kv_len).
    lens: Vec<usize>,
    /// The target's query rows, one per position: (kv_len, nh, hd).
    q_target: Vec<f32>,
    /// One decode row per stranger (at its last position): (batch - 1, nh, hd).
    q_strangers: Vec<f32>,
    scale: f32,
    window: u32,
    softcap: f32,
    slopes: Option<Vec<f32>>,
    sinks: Option<Vec<f32>>,
}

/// Rows of one launch: (sequence, position, query row).
type Rows<'a> = Vec<(u32, u32, &'a [f32])>;

impl AttnCell {
    fn new(c: &Cell, rng: &mut ChaCha8Rng) -> AttnCell {
        let (hd, nh) = (c.head_dim, KV_HEADS * c.gqa);
        let mut lens = vec![c.kv_len];
        for _ in 1..c.batch {
            lens.push(rng.random_range(1..=c.kv_len));
        }
        let need: Vec<usize> = lens.iter().map(|l| l.div_ceil(BLOCK)).collect();
        let total = need.iter().sum::<usize>() + 3;
        let mut pool: Vec<u32> = (0..total as u32).collect();
        pool.shuffle(rng);
        let mut tables = Vec::new();
        let mut at = 0;
        for &n in &need {
            tables.push(pool[at..at + n].to_vec());
            at += n;
        }
        let cells = total * BLOCK * KV_HEADS * hd;
        let kv = |rng: &mut ChaCha8Rng| -> Vec<f16> {
            (0..cells)
                .map(|_| f16::from_f32(rng.random_range(-2.0f32..2.0)))
                .collect()
        };
        let (k, v) = (kv(rng), kv(rng));
        let q_target = randv(rng, c.kv_len * nh * hd, 2.0);
        let q_strangers = randv(rng, (c.batch - 1) * nh * hd, 2.0);
        AttnCell {
            nh,
            hd,
            k,
            v,
            tables,
            lens,
            q_target,
            q_strangers,
            scale: 1.0 / (hd as f32).sqrt(),
            // Not a multiple of the chunk or the block.
            window: if c.sliding {
                (c.kv_len / 4 + 3) as u32
            } else {
                0
            },
            softcap: if c.feature == Feature::Softcap {
                2.0
            } else {
                0.0
            },
            slopes: (c.feature == Feature::Alibi).then(|| alibi_slopes(nh, 8.0)),
            sinks: (c.feature == Feature::Sinks).then(|| randv(rng, nh, 3.0)),
        }
    }

    fn row(&self) -> usize {
        self.nh * self.hd
    }

    fn target(&self, p: usize) -> (u32, u32, &[f32]) {
        (
            0,
            p as u32,
            &self.q_target[p * self.row()..(p + 1) * self.row()],
        )
    }

    /// Stranger `s` (1..batch) at its last position.
    fn stranger(&self, s: usize) -> (u32, u32, &[f32]) {
        let r = self.row();
        (
            s as u32,
            (self.lens[s] - 1) as u32,
            &self.q_strangers[(s - 1) * r..s * r],
        )
    }

    /// Runs one launch of `rows` on `be`; Ok(None) if unsupported.
    fn launch(
        &self,
        be: &dyn Backend,
        mode: Mode,
        rows: &Rows<'_>,
    ) -> anyhow::Result<Option<Vec<f32>>> {
        let q: Vec<f32> = rows.iter().flat_map(|r| r.2.iter().copied()).collect();
        let row_seq: Vec<u32> = rows.iter().map(|r| r.0).collect();
        let positions: Vec<u32> = rows.iter().map(|r| r.1).collect();
        let trefs: Vec<&[u32]> = self.tables.iter().map(|t| &t[..]).collect();
        let mut out = vec![f32::NAN; q.len()];
        macro_rules! op {
            ($out:expr) => {
                Op::PagedAttention {
                    q: &q,
                    n_heads: self.nh,
                    scale: self.scale,
                    cache: KvLayer {
                        k: &self.k,
                        v: &self.v,
                        block_size: BLOCK,
                        n_kv_heads: KV_HEADS,
                        head_dim: self.hd,
                        ty: crate::backend::KvType::F16,
                    },
                    batch: AttnBatch {
                        block_tables: &trefs,
                        row_seq: &row_seq,
                        positions: &positions,
                    },
                    opts: AttnOpts {
                        window: self.window,
                        softcap: self.softcap,
                        alibi: self.slopes.as_deref(),
                        sinks: self.sinks.as_deref(),
                    },
                    out: $out,
                }
            };
        }
        if !be.supports_op(&op!(&mut out), mode) {
            return Ok(None);
        }
        be.run(op!(&mut out), mode)?;
        Ok(Some(out))
    }
}

/// Runs the grid on `be` in `mode`; `cpu`: the reference for `exact`
/// (None when `be` is the cpu). `progress(done, total)` after each cell.
pub fn run(
    be: &dyn Backend,
    cpu: Option<&dyn Backend>,
    mode: Mode,
    cells: &[Cell],
    seed: u64,
    mut progress: impl FnMut(usize, usize),
) -> Report {
    let mut rep = Report::default();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (i, c) in cells.iter().enumerate() {
        let ac = AttnCell::new(c, &mut rng);
        if let Err(e) = attention_cell(be, cpu, mode, c, &ac, &mut rng, &mut rep) {
            rep.errors.push(Finding {
                what: c.to_string(),
                check: "run",
                detail: format!("{e:#}"),
            });
        }
        rep.cells += 1;
        progress(i + 1, cells.len());
    }
    rows_grid(be, mode, cells, &mut rng, &mut rep);
    rep
}

/// The first element whose bits differ, as a finding's detail.
fn first_diff(a: &[f32], b: &[f32], row: usize) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{} values against {}", a.len(), b.len()));
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .map(|i| {
            format!(
                "row {} value {}: {:e} against {:e}",
                i / row,
                i % row,
                a[i],
                b[i]
            )
        })
}

fn compare(rep: &mut Report, what: &str, check: &'static str, a: &[f32], b: &[f32], row: usize) {
    rep.checks += 1;
    if let Some(detail) = first_diff(a, b, row) {
        rep.diffs.push(Finding {
            what: what.to_string(),
            check,
            detail,
        });
    }
}

fn attention_cell(
    be: &dyn Backend,
    cpu: Option<&dyn Backend>,
    mode: Mode,
    c: &Cell,
    ac: &AttnCell,
    rng: &mut ChaCha8Rng,
    rep: &mut Report,
) -> anyhow::Result<()> {
    let (l, row, what) = (c.kv_len, ac.row(), c.to_string());
    let go = |rows: &Rows<'_>| ac.launch(be, mode, rows);
    // Batch: the target's last row alone, then in the middle of the
    // strangers' decode rows.
    let alone_rows: Rows<'_> = vec![ac.target(l - 1)];
    let mut mixed_rows: Rows<'_> = (1..c.batch).map(|s| ac.stranger(s)).collect();
    let at = mixed_rows.len() / 2;
    mixed_rows.insert(at, ac.target(l - 1));
    let (Some(alone), Some(mixed)) = (go(&alone_rows)?, go(&mixed_rows)?) else {
        rep.unsupported += 1;
        return Ok(());
    };
    compare(
        rep,
        &what,
        "batch",
        &alone,
        &mixed[at * row..(at + 1) * row],
        row,
    );
    // A stranger alone against its row in the batch.
    if c.batch > 1 {
        let s_at = if at == 0 { 1 } else { 0 };
        let s_alone = go(&vec![mixed_rows[s_at]])?.unwrap_or_default();
        compare(
            rep,
            &what,
            "batch",
            &s_alone,
            &mixed[s_at * row..(s_at + 1) * row],
            row,
        );
    }
    // Chunked = at once = token by token.
    let all: Rows<'_> = (0..l).map(|p| ac.target(p)).collect();
    let once = go(&all)?.unwrap_or_default();
    let c1 = rng.random_range(1..l / 2);
    let c2 = rng.random_range(c1 + 1..l - 1);
    let mut chunked = Vec::with_capacity(once.len());
    for (a, b) in [(0, c1), (c1, c2), (c2, l)] {
        let mut rows: Rows<'_> = (a..b).map(|p| ac.target(p)).collect();
        let own = rows.len();
        if a == c1 {
            rows.extend((1..c.batch).map(|s| ac.stranger(s)));
        }
        let out = go(&rows)?.unwrap_or_default();
        chunked.extend_from_slice(&out[..(own * row).min(out.len())]);
    }
    compare(rep, &what, "chunked", &chunked, &once, row);
    let mut sample = vec![
        0,
        1,
        31,
        32,
        33,
        l / 2,
        l - 2,
        l - 1,
        rng.random_range(0..l),
    ];
    sample.sort_unstable();
    sample.dedup();
    let mut token = Vec::new();
    let mut want = Vec::new();
    for &p in &sample {
        token.extend(go(&vec![ac.target(p)])?.unwrap_or_default());
        want.extend_from_slice(&once[p * row..(p + 1) * row]);
    }
    compare(rep, &what, "token", &token, &want, row);
    // Run to run.
    let again = go(&all)?.unwrap_or_default();
    compare(rep, &what, "rerun", &again, &once, row);
    let mixed_again = go(&mixed_rows)?.unwrap_or_default();
    compare(rep, &what, "rerun", &mixed_again, &mixed, row);
    // Exact: the cpu's bits.
    if let (Mode::Exact, Some(cpu)) = (mode, cpu) {
        let r = ac.launch(cpu, mode, &all)?.unwrap_or_default();
        compare(rep, &what, "cpu", &once, &r, row);
    }
    Ok(())
}

/// The RMS norm and the matmuls (Q4_0, Q8_0) at each cell's width (n_heads
/// x head_dim): a row alone = the same row among 7 and 32 others.
fn rows_grid(be: &dyn Backend, mode: Mode, cells: &[Cell], rng: &mut ChaCha8Rng, rep: &mut Report) {
    let mut dims: Vec<usize> = cells
        .iter()
        .map(|c| KV_HEADS * c.gqa * c.head_dim)
        .collect();
    dims.sort_unstable();
    dims.dedup();
    let mut batches: Vec<usize> = cells.iter().map(|c| c.batch).filter(|&b| b > 1).collect();
    batches.extend([8, 33]);
    batches.sort_unstable();
    batches.dedup();
    let nmax = *batches.last().unwrap_or(&1);
    for dim in dims {
        let x = randv(rng, nmax * dim, 2.0);
        let g = randv(rng, dim, 1.0);
        let norm = |n: usize, out: &mut [f32]| {
            macro_rules! op {
                ($out:expr) => {
                    Op::RmsNorm {
                        x: &x[..n * dim],
                        w: &g,
                        dim,
                        eps: 1e-5,
                        out: $out,
                    }
                };
            }
            if !be.supports_op(&op!(&mut *out), mode) {
                return Ok(false);
            }
            be.run(op!(out), mode).map(|_| true)
        };
        rows_check(rep, &format!("rms_norm dim={dim}"), dim, &batches, norm);
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let m = 256;
            let w = match crate::quant::quantize(ty, &randv(rng, m * dim, 1.0)) {
                Ok(w) => w,
                Err(e) => {
                    rep.errors.push(Finding {
                        what: format!("mat_mul {ty:?} {m}x{dim}"),
                        check: "run",
                        detail: e.to_string(),
                    });
                    continue;
                }
            };
            let mat = |n: usize, out: &mut [f32]| {
                macro_rules! op {
                    ($out:expr) => {
                        Op::MatMul {
                            x: &x[..n * dim],
                            w: QMatrix {
                                ty,
                                rows: m,
                                cols: dim,
                                data: &w,
                            },
                            n,
                            out: $out,
                        }
                    };
                }
                if !be.supports_op(&op!(&mut *out), mode) {
                    return Ok(false);
                }
                be.run(op!(out), mode).map(|_| true)
            };
            rows_check(rep, &format!("mat_mul {ty:?} {m}x{dim}"), m, &batches, mat);
        }
    }
}

/// Row 0 of `f(1)` against row 0 of `f(n)` for every batch n (`width`
/// outputs a row).
fn rows_check(
    rep: &mut Report,
    what: &str,
    width: usize,
    batches: &[usize],
    mut f: impl FnMut(usize, &mut [f32]) -> anyhow::Result<bool>,
) {
    let mut alone = vec![f32::NAN; width];
    match f(1, &mut alone) {
        Ok(true) => {}
        Ok(false) => {
            rep.unsupported += 1;
            return;
        }
        Err(e) => {
            rep.errors.push(Finding {
                what: what.into(),
                check: "run",
                detail: format!("{e:#}"),
            });
            return;
        }
    }
    for &n in batches {
        let mut out = vec![f32::NAN; n * width];
        match f(n, &mut out) {
            Ok(_) => compare(
                rep,
                &format!("{what} batch={n}"),
                "batch",
                &alone,
                &out[..width],
                width,
            ),
            Err(e) => rep.errors.push(Finding {
                what: what.into(),
                check: "run",
                detail: format!("{e:#}"),
            }),
        }
    }
}
