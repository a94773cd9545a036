//! The op parity harness: runs every op, dtype and a grid of shapes on a
//! backend under test and on the `cpu` reference, and compares.
//!
//! Per case: seeded random inputs; the output buffers of the backend under
//! test sit between guard regions filled with a sentinel bit pattern, which
//! must be untouched afterwards; NaN/Inf positions must agree; the NMSE
//! `Σ(y - r)² / Σ r²` must be under the op's bound; in `exact` mode every
//! element must be bitwise equal (two NaNs count as equal: NaN payloads are
//! not part of the canonical arithmetic). A case the backend does not
//! support (its `supports_op` says no) is reported UNSUPPORTED, never as a
//! pass. Backend-agnostic: it only uses the `Backend` trait.

/// The runs of one case whose op writes a single output buffer: built by
/// `|$out| $op` around whichever buffer that run writes. `supports_op`,
/// then the cpu reference on `$r` and the backend on the guarded `$y`
/// (`$y.body_mut()`), and with `time $tmp` the timed backend runs (perf
/// mode) on `$tmp`. Evaluates to (supported, error text, seconds).
macro_rules! run_case {
    ($ctx:expr, $mode:expr, $y:expr, $r:expr, |$out:ident| $op:expr) => {{
        let (sup, err) = run_case!(@check $ctx, $mode, $y, $r, |$out| $op);
        (sup, err, None::<f64>)
    }};
    ($ctx:expr, $mode:expr, $y:expr, $r:expr, time $tmp:expr, |$out:ident| $op:expr) => {{
        let (sup, err) = run_case!(@check $ctx, $mode, $y, $r, |$out| $op);
        let be = $ctx.be;
        let t = if sup && err.is_none() {
            $ctx.time(|| {
                let $out = &mut $tmp[..];
                be.run($op, $mode)
            })
        } else {
            None
        };
        (sup, err, t)
    }};
    (@check $ctx:expr, $mode:expr, $y:expr, $r:expr, |$out:ident| $op:expr) => {{
        let sup = {
            let $out = $y.body_mut();
            $ctx.be.supports_op(&$op, $mode)
        };
        let err = if !sup {
            None
        } else {
            {
                let $out = &mut $r[..];
                $ctx.cpu.run($op, $mode)
            }
            .and_then(|_| {
                let $out = $y.body_mut();
                $ctx.be.run($op, $mode)
            })
            .err()
            .map(|e| format!("{e:#}"))
        };
        (sup, err)
    }};
}

mod attention;
mod elementwise;
pub mod hybrid;
pub mod invariance;
pub(crate) mod mat_muls;
pub mod mat_muls_glu;
mod mat_muls_norm;
pub mod norm_ahead;
mod rope_kv;
mod rows;

use crate::backend::{AttnBatch, Backend, KvLayer, KvLayerMut, Mode, Op, QMatrix};
use crate::quant::GgmlType;
use anyhow::Result;
use half::f16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// Outcome of one case.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    Pass,
    Fail(String),
    Unsupported,
}

/// One case's result line.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub op: &'static str,
    pub desc: String,
    pub status: Status,
    pub nmse: f64,
    pub bitwise: bool,
    /// (seconds per run on the backend under test, bytes, flops), with --perf.
    pub perf: Option<(f64, f64, f64)>,
}

impl std::fmt::Display for CaseResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = match &self.status {
            Status::Pass => "PASS".to_string(),
            Status::Fail(_) => "FAIL".to_string(),
            Status::Unsupported => "UNSUPPORTED".to_string(),
        };
        write!(f, "{st:11} {:16} {:44}", self.op, self.desc)?;
        if self.status != Status::Unsupported {
            write!(
                f,
                " nmse={:.2e} {}",
                self.nmse,
                if self.bitwise {
                    "bitwise"
                } else {
                    "not-bitwise"
                }
            )?;
        }
        if let Some((t, bytes, flops)) = self.perf {
            write!(
                f,
                "  {:9.1} us {:8.2} GB/s {:8.4} TFLOP/s",
                t * 1e6,
                bytes / t / 1e9,
                flops / t / 1e12
            )?;
        }
        if let Status::Fail(why) = &self.status {
            write!(f, "  -- {why}")?;
        }
        Ok(())
    }
}

/// Harness options.
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    /// Only ops whose kind contains this string.
    pub op_filter: Option<String>,
    pub perf: bool,
    pub seed: u64,
    /// A reduced grid (CI, quick checks).
    pub quick: bool,
    /// The backend plans a wgmma wave tail on every launch it can (CUDA
    /// tuning key `matmul.wr_tail_sms` set, for parity coverage), so fused
    /// and unfused MatMuls launches differ in bits by design: mat_muls
    /// skips its fused-vs-unfused bit check (the cpu comparison runs).
    pub wave_tail_forced: bool,
}

const GUARD: usize = 64;
const SENTINEL_F32: u32 = 0x7fa5_a5a5; // a signalling-NaN pattern no kernel writes
const SENTINEL_F16: u16 = 0x7d5a;

/// An f32 output buffer with guard regions on both sides.
struct Guarded {
    buf: Vec<f32>,
    len: usize,
}

impl Guarded {
    fn new(len: usize) -> Self {
        Guarded {
            buf: vec![f32::from_bits(SENTINEL_F32); len + 2 * GUARD],
            len,
        }
    }
    fn from(init: &[f32]) -> Self {
        let mut g = Guarded::new(init.len());
        g.body_mut().copy_from_slice(init);
        g
    }
    fn body(&self) -> &[f32] {
        &self.buf[GUARD..GUARD + self.len]
    }
    fn body_mut(&mut self) -> &mut [f32] {
        &mut self.buf[GUARD..GUARD + self.len]
    }
    fn guards_ok(&self) -> bool {
        self.buf[..GUARD]
            .iter()
            .chain(&self.buf[GUARD + self.len..])
            .all(|v| v.to_bits() == SENTINEL_F32)
    }
}

struct GuardedF16 {
    buf: Vec<f16>,
    len: usize,
}

impl GuardedF16 {
    fn from(init: &[f16]) -> Self {
        let mut buf = vec![f16::from_bits(SENTINEL_F16); init.len() + 2 * GUARD];
        buf[GUARD..GUARD + init.len()].copy_from_slice(init);
        GuardedF16 {
            buf,
            len: init.len(),
        }
    }
    fn body(&self) -> &[f16] {
        &self.buf[GUARD..GUARD + self.len]
    }
    fn body_mut(&mut self) -> &mut [f16] {
        &mut self.buf[GUARD..GUARD + self.len]
    }
    fn guards_ok(&self) -> bool {
        self.buf[..GUARD]
            .iter()
            .chain(&self.buf[GUARD + self.len..])
            .all(|v| v.to_bits() == SENTINEL_F16)
    }
}

/// Comparison of a result with the reference.
pub(crate) struct Cmp {
    pub(crate) nmse: f64,
    pub(crate) bitwise: bool,
    /// NaN, +Inf and -Inf at the same positions (exact mode).
    pub(crate) nan_inf_ok: bool,
    /// Non-finite at the same positions (fast and deterministic modes,
    /// whose faster math may turn an overflow into Inf where the canonical
    /// arithmetic gives NaN, or the reverse).
    pub(crate) finite_ok: bool,
    pub(crate) first_diff: Option<(usize, f32, f32)>,
}

pub(crate) fn compare(y: &[f32], r: &[f32]) -> Cmp {
    let (mut num, mut den) = (0f64, 0f64);
    let mut bitwise = y.len() == r.len();
    let mut nan_inf_ok = y.len() == r.len();
    let mut finite_ok = y.len() == r.len();
    let mut first_diff = None;
    for (i, (&a, &b)) in y.iter().zip(r).enumerate() {
        let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        if !same {
            bitwise = false;
            if first_diff.is_none() {
                first_diff = Some((i, a, b));
            }
        }
        if a.is_finite() != b.is_finite() {
            if finite_ok && first_diff.is_none_or(|(j, _, _)| j != i) {
                // Keep the first finiteness mismatch for the message.
                first_diff = Some((i, a, b));
            }
            finite_ok = false;
        }
        if a.is_nan() != b.is_nan() || (b.is_infinite() && a != b) || (a.is_infinite() && a != b) {
            nan_inf_ok = false;
            continue;
        }
        if a.is_finite() && b.is_finite() {
            let d = a as f64 - b as f64;
            num += d * d;
            den += (b as f64) * (b as f64);
        }
    }
    let nmse = if den > 0.0 {
        num / den
    } else if num > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    Cmp {
        nmse,
        bitwise,
        nan_inf_ok,
        finite_ok,
        first_diff,
    }
}

/// Per-op NMSE bound for non-exact modes (FMA, int8 or f16 activations
/// instead of the canonical 16-bit integer ones, __expf). Quantized matmul
/// rounds activations to int8 per block of 32 (step amax/127): its error
/// variance is ~amax²/(12·127²) per value, an NMSE of 1e-5 to 3e-5 on
/// random data, so it gets 1e-4.
pub(crate) fn nmse_bound(op: &str) -> f64 {
    match op {
        "mat_mul" | "mat_muls" | "mat_muls_norm" | "norm_ahead" => 1e-4,
        // silu(gate) * up carries both products' errors (relative errors
        // add): measured up to 1.4e-4 on random data in `fast` (norm-ahead's
        // SwiGlu: 1.04e-4 on an H200, 2026-11-29).
        "mat_muls_glu" | "norm_ahead_glu" => 3e-4,
        "paged_attention" => 1e-5,
        "rms_norm" | "rope" | "swiglu" | "rope_kv_write" => 1e-6,
        _ => 1e-7, // get_rows, add, add_bias, kv_write: pure conversions/adds
    }
}

/// A run's result `y` against the reference `r` for `op` in `mode`: guard
/// bytes, non-finite positions (NaN/Inf in exact mode), bits (exact mode)
/// and the op's NMSE bound.
pub(crate) fn graded(
    op: &'static str,
    desc: String,
    mode: Mode,
    y: &[f32],
    r: &[f32],
    guards_ok: bool,
    perf: Option<(f64, f64, f64)>,
) -> CaseResult {
    let c = compare(y, r);
    let exact = mode == Mode::Exact;
    let status = if !guards_ok {
        Status::Fail("guard bytes around the output were overwritten".into())
    } else if exact && !c.nan_inf_ok {
        Status::Fail("NaN/Inf positions differ from the reference".into())
    } else if !c.finite_ok {
        let (i, a, b) = c.first_diff.unwrap_or((0, 0.0, 0.0));
        Status::Fail(format!(
            "non-finite positions differ from the reference (e.g. at {i}: {a:e} vs cpu {b:e})"
        ))
    } else if exact && !c.bitwise {
        let (i, a, b) = c.first_diff.unwrap_or((0, 0.0, 0.0));
        Status::Fail(format!(
            "not bitwise equal: first at {i}: {a:e} ({:#010x}) vs cpu {b:e} ({:#010x})",
            a.to_bits(),
            b.to_bits()
        ))
    } else if c.nmse.is_nan() || c.nmse > nmse_bound(op) {
        Status::Fail(format!(
            "nmse {:.3e} over bound {:.1e}",
            c.nmse,
            nmse_bound(op)
        ))
    } else {
        Status::Pass
    };
    CaseResult {
        op,
        desc,
        status,
        nmse: c.nmse,
        bitwise: c.bitwise,
        perf,
    }
}

/// (head_dim, n_kv_heads, gqa ratio, block_size, per-sequence (start, n_rows)).
type AttnCase = (usize, usize, usize, usize, Vec<(usize, usize)>);

/// A case's attention options: (window, softcap, ALiBi max bias (0: none),
/// sinks).
type AttnCaseOpts = (u32, f32, f32, bool);

struct Ctx<'a> {
    be: &'a dyn Backend,
    cpu: &'a dyn Backend,
    opts: &'a Options,
    rng: ChaCha8Rng,
    /// Weight buffers stay alive for the whole run, so no two cases share
    /// an address (backends may cache uploads by address).
    keep: Vec<Vec<u8>>,
    results: Vec<CaseResult>,
}

/// Overwrites about 1/16 of `v` (at least 4 entries) with special values:
/// ±Inf, NaN, ±0, subnormal, and (with `huge`) finite values near the
/// f32 limit. Only exact mode gets the huge ones: where a sum of products
/// of such values overflows depends on the order and grouping of the
/// arithmetic, which exact mode fixes and the faster modes do not.
/// `nan` = false leaves NaN out too (quantized matmul outside exact mode:
/// the canonical 16-bit activation quantization reads a NaN activation as
/// 0, the faster modes propagate it; see DETERMINISM.md).
fn specials(rng: &mut ChaCha8Rng, v: &mut [f32], huge: bool, nan: bool) {
    const S: [f32; 8] = [
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        3.0e38,
        -1.0e30,
        1.0e-40,
    ];
    if v.is_empty() {
        return;
    }
    let pool: Vec<f32> = S
        .iter()
        .copied()
        .filter(|x| (huge || x.abs() < 1e20) && (nan || !x.is_nan()))
        .collect();
    for _ in 0..(v.len() / 16).max(4) {
        let i = rng.random_range(0..v.len());
        v[i] = pool[rng.random_range(0..pool.len())];
    }
}

/// A KV cache layer of `cells` token cells of `row` f16 values, random in
/// [-1, 1), and `n` distinct random cells (slots) for a write into it.
fn kv_cells(rng: &mut ChaCha8Rng, cells: usize, row: usize, n: usize) -> (Vec<u32>, Vec<f16>) {
    let mut all: Vec<u32> = (0..cells as u32).collect();
    all.shuffle(rng);
    let slots: Vec<u32> = all[..n].to_vec();
    let init: Vec<f16> = (0..cells * row)
        .map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0)))
        .collect();
    (slots, init)
}

fn randv(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect()
}

impl Ctx<'_> {
    /// Runs `make(false)` on the reference and `make(true)` on the backend
    /// (through closures that build the op over their own buffers), then
    /// records the comparison.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        op: &'static str,
        desc: String,
        supported: bool,
        run_err: Option<String>,
        y: &[f32],
        r: &[f32],
        guards_ok: bool,
        perf: Option<(f64, f64, f64)>,
    ) {
        if !supported {
            self.results.push(CaseResult {
                op,
                desc,
                status: Status::Unsupported,
                nmse: 0.0,
                bitwise: false,
                perf: None,
            });
            return;
        }
        if let Some(e) = run_err {
            self.results.push(CaseResult {
                op,
                desc,
                status: Status::Fail(format!("error: {e}")),
                nmse: f64::NAN,
                bitwise: false,
                perf: None,
            });
            return;
        }
        self.results
            .push(graded(op, desc, self.opts.mode, y, r, guards_ok, perf));
    }

    /// Fails the last recorded case with `why`, if any, where it passed
    /// (a fused op's bits against its unfused ops).
    fn fail_last(&mut self, why: Option<String>) {
        if let (Some(why), Some(last)) = (why, self.results.last_mut()) {
            if last.status == Status::Pass {
                last.status = Status::Fail(why);
            }
        }
    }

    fn want(&self, op: &str) -> bool {
        self.opts
            .op_filter
            .as_deref()
            .is_none_or(|f| op.contains(f))
    }

    /// Times `f` (already run once): median of several runs.
    fn time(&self, mut f: impl FnMut() -> Result<()>) -> Option<f64> {
        if !self.opts.perf {
            return None;
        }
        let mut ts = Vec::new();
        let t_all = Instant::now();
        for _ in 0..20 {
            let t = Instant::now();
            if f().is_err() {
                return None;
            }
            ts.push(t.elapsed().as_secs_f64());
            if t_all.elapsed().as_secs_f64() > 0.5 && ts.len() >= 3 {
                break;
            }
        }
        ts.sort_by(|a, b| a.total_cmp(b));
        Some(ts[ts.len() / 2])
    }

    fn matmul(&mut self) {
        if !self.want("mat_mul") {
            return;
        }
        use GgmlType::*;
        let types = [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
        ];
        for ty in types {
            let bs = ty.block_size().max(1);
            let kmul = if bs == 1 { 1 } else { bs };
            // The smallest case has 8 outputs: with one output, non-exact
            // modes' NMSE is just that dot product's cancellation luck.
            let mut shapes: Vec<(usize, usize, usize)> = vec![
                (4, kmul, 2),
                (7, 3 * kmul, 3),
                (49, if bs == 256 { 768 } else { 576 }, 1),
                (193, if bs == 256 { 1536 } else { 576 }, 8),
                (64, 2048, 33),
                // Batched-decode shape with a partial weight tile, a
                // partial activation tile and (32-blocks) a partial k chunk.
                (97, if bs == 256 { 768 } else { 576 }, 17),
                (40, 512, 130),
                // Many k splits over one row tile (fast mode's int8 MMA
                // kernel: k a multiple of 256), a partial activation tile.
                (300, 1024, 9),
                // One activation row over 16-byte-multiple weight rows:
                // fast mode's bulk-copy matvec (sm_90+), 8 rows per CTA at
                // k = 1024 and 4 or 2 rows (2 or 4 warps each) at 14,336,
                // partial last CTAs.
                (37, 1024, 1),
                (22, 14336, 1),
            ];
            if bs == 1 {
                shapes.push((5, 33, 2));
                shapes.push((31, 1000, 5));
            }
            if !self.opts.quick {
                shapes.push((2049, 2048, 1));
                shapes.push((576, 1536, 64));
                // Several CTA rows by several token tiles, both partial:
                // with matmul.wr_tail_sms=4 or 7 every wgmma CTA shape
                // takes a wave tail (ops/matmul/wr.rs, wr_tail).
                shapes.push((520, 1024, 300));
            }
            let mut shapes: Vec<(usize, usize, usize, bool)> = shapes
                .into_iter()
                .map(|(m, k, n)| (m, k, n, false))
                .collect();
            shapes.push((33, 4 * kmul, 5, true));
            for (m, k, n, special) in shapes {
                let wf = randv(&mut self.rng, m * k, 1.0);
                let data = match crate::quant::quantize(ty, &wf) {
                    Ok(d) => d,
                    Err(e) => {
                        self.results.push(CaseResult {
                            op: "mat_mul",
                            desc: format!("{ty:?} m={m} k={k} n={n}"),
                            status: Status::Fail(format!("quantizing the weights: {e}")),
                            nmse: f64::NAN,
                            bitwise: false,
                            perf: None,
                        });
                        continue;
                    }
                };
                let w = QMatrix {
                    ty,
                    rows: m,
                    cols: k,
                    data: &data,
                };
                let mut x = randv(&mut self.rng, n * k, 2.0);
                if special {
                    let exact = self.opts.mode == Mode::Exact;
                    specials(&mut self.rng, &mut x, exact, exact);
                }
                let mut r = vec![0f32; n * m];
                let mut y = Guarded::new(n * m);
                let desc = format!(
                    "{ty:?} m={m} k={k} n={n}{}",
                    if special { " specials" } else { "" }
                );
                let supported = self.be.supports_op(
                    &Op::MatMul {
                        w,
                        x: &x,
                        n,
                        out: y.body_mut(),
                    },
                    self.opts.mode,
                );
                let mode = self.opts.mode;
                let mut err = None;
                let mut perf = None;
                if supported {
                    if let Err(e) = self.cpu.run(
                        Op::MatMul {
                            w,
                            x: &x,
                            n,
                            out: &mut r,
                        },
                        mode,
                    ) {
                        err = Some(format!("cpu reference: {e:#}"));
                    } else if let Err(e) = self.be.run(
                        Op::MatMul {
                            w,
                            x: &x,
                            n,
                            out: y.body_mut(),
                        },
                        mode,
                    ) {
                        err = Some(format!("{e:#}"));
                    } else {
                        let mut tmp = vec![0f32; n * m];
                        let be = self.be;
                        let t = self.time(|| {
                            be.run(
                                Op::MatMul {
                                    w,
                                    x: &x,
                                    n,
                                    out: &mut tmp,
                                },
                                mode,
                            )
                        });
                        let bytes = (data.len() + 4 * (x.len() + n * m)) as f64;
                        perf = t.map(|t| (t, bytes, 2.0 * (m * k * n) as f64));
                    }
                }
                let g = y.guards_ok();
                self.finish("mat_mul", desc, supported, err, y.body(), &r, g, perf);
                // The weights outlive any backend cache entry keyed by address.
                self.keep.push(data);
            }
        }
    }

    fn get_rows(&mut self) {
        if !self.want("get_rows") {
            return;
        }
        use GgmlType::*;
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
        ] {
            let bs = ty.block_size().max(1);
            for (rows, cols, nids) in [
                (3, bs, 1),
                (50, 2 * bs.max(32), 7),
                (1000, 576usize.div_ceil(bs) * bs, 33),
            ] {
                let wf = randv(&mut self.rng, rows * cols, 1.0);
                let Ok(data) = crate::quant::quantize(ty, &wf) else {
                    continue;
                };
                let ids: Vec<u32> = (0..nids)
                    .map(|_| self.rng.random_range(0..rows as u32))
                    .collect();
                let t = QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &data,
                };
                let mut r = vec![0f32; nids * cols];
                let mut y = Guarded::new(nids * cols);
                let mode = self.opts.mode;
                let sup = self.be.supports_op(
                    &Op::GetRows {
                        table: t,
                        ids: &ids,
                        out: y.body_mut(),
                    },
                    mode,
                );
                let mut err = None;
                if sup {
                    if let Err(e) = self.cpu.run(
                        Op::GetRows {
                            table: t,
                            ids: &ids,
                            out: &mut r,
                        },
                        mode,
                    ) {
                        err = Some(format!("cpu reference: {e:#}"));
                    } else if let Err(e) = self.be.run(
                        Op::GetRows {
                            table: t,
                            ids: &ids,
                            out: y.body_mut(),
                        },
                        mode,
                    ) {
                        err = Some(format!("{e:#}"));
                    }
                }
                let g = y.guards_ok();
                self.finish(
                    "get_rows",
                    format!("{ty:?} rows={rows} cols={cols} ids={nids}"),
                    sup,
                    err,
                    y.body(),
                    &r,
                    g,
                    None,
                );
                self.keep.push(data);
            }
        }
    }
}

/// Runs the whole grid on `be` against `cpu`.
pub fn run(be: &dyn Backend, cpu: &dyn Backend, opts: &Options) -> Vec<CaseResult> {
    let mut c = Ctx {
        be,
        cpu,
        opts,
        rng: ChaCha8Rng::seed_from_u64(opts.seed),
        keep: Vec::new(),
        results: Vec::new(),
    };
    c.matmul();
    c.mat_muls();
    c.mat_muls_norm();
    c.mat_muls_glu();
    c.get_rows();
    c.select_rows();
    c.elementwise();
    c.kv_write();
    c.rope_kv_write();
    c.attention();
    c.hybrid();
    c.results
}

/// (passed, failed, unsupported).
pub fn summary(results: &[CaseResult]) -> (usize, usize, usize) {
    let mut s = (0, 0, 0);
    for r in results {
        match r.status {
            Status::Pass => s.0 += 1,
            Status::Fail(_) => s.1 += 1,
            Status::Unsupported => s.2 += 1,
        }
    }
    s
}
