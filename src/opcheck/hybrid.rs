//! Parity cases of the hybrid (Gated DeltaNet) ops: conv1d_silu,
//! l2_norm_heads, gdn_gates, delta_rule, gated_rms_norm, split_heads,
//! sigmoid_mul. Every buffer an op writes is compared whole (the state
//! arrays too, so slots the step does not name must come back unchanged),
//! with guards around each, and bitwise in every mode: these ops have one
//! canonical kernel per backend, whatever the mode.
//!
//! Steps hold several slots with runs of different lengths (a run shorter
//! than the conv's K - 1 included) and decode-like steps of one row per
//! slot; head sizes of 128 and odd ones (48, 40, 33, 200) exercise the
//! 32-lane sums' tails. [`state_paths`] runs the state-carrying cases on
//! the cuda backend with its fused and its unfused state paths (tuning
//! `gdn.fused`) and requires the same bits of both.

use super::{compare, randv, specials, CaseResult, Ctx, Guarded, Options, Status};
use crate::backend::cpu::ops::gdn as cpu_gdn;
use crate::backend::cuda::CudaBackend;
use crate::backend::{Backend, Mode, Op};
use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Ask a backend whether it supports a case's op, or run it.
#[derive(Clone, Copy)]
enum Act {
    Ask,
    Run,
}

fn act(be: &dyn Backend, a: Act, op: Op<'_>, mode: Mode) -> Result<bool> {
    match a {
        Act::Ask => Ok(be.supports_op(&op, mode)),
        Act::Run => be.run(op, mode).map(|()| true),
    }
}

/// A case's op, built over its written buffers (in the order of the
/// case's `Buf`s) and asked about or run on a backend.
type OpRun<'a> = dyn Fn(&dyn Backend, Act, &mut [&mut [f32]]) -> Result<bool> + 'a;

/// A buffer the op writes: an output it overwrites whole (the backend's
/// starts as the guard sentinel, the reference's as zeros, so an element
/// the backend leaves unwritten shows), or an in-place input or state
/// (both start from these values).
enum Buf {
    Out(usize),
    In(Vec<f32>),
}

/// The slots of a step: runs of (slot, rows).
fn slots(runs: &[(u32, usize)]) -> Vec<u32> {
    runs.iter()
        .flat_map(|&(s, n)| std::iter::repeat_n(s, n))
        .collect()
}

/// A step's runs as `slot x rows, ...`.
fn runs_desc(runs: &[(u32, usize)]) -> String {
    let r: Vec<String> = runs.iter().map(|(s, n)| format!("{s}x{n}")).collect();
    format!("[{}]", r.join(","))
}

/// Conv cases: (channels, kernel, runs, n_slots, specials, full grid only).
type ConvCase = (usize, usize, &'static [(u32, usize)], usize, bool, bool);
const CONV: &[ConvCase] = &[
    (96, 4, &[(2, 3), (0, 1), (5, 2)], 6, false, false),
    (200, 4, &[(3, 1), (1, 1), (4, 1)], 5, false, false),
    // A run of 2 < K - 1: the new state keeps one old value.
    (37, 4, &[(0, 2), (2, 1)], 3, false, false),
    (1000, 4, &[(1, 40)], 3, false, false),
    (70, 2, &[(1, 3), (0, 1)], 2, true, false),
    // Kernel 1: no state at all.
    (33, 1, &[(0, 1), (1, 2)], 2, false, false),
    (8192, 4, &[(0, 40), (3, 24)], 4, false, true),
];

/// Delta-rule cases: (h_k, h_v, d_k, d_v, runs, n_slots, full grid only).
type DeltaCase = (
    usize,
    usize,
    usize,
    usize,
    &'static [(u32, usize)],
    usize,
    bool,
);
const DELTA: &[DeltaCase] = &[
    (2, 4, 128, 128, &[(2, 3), (0, 1), (5, 2)], 6, false),
    (1, 2, 48, 40, &[(3, 1), (1, 1), (4, 1)], 5, false),
    (2, 4, 48, 40, &[(2, 3), (0, 1), (5, 2)], 6, false),
    (1, 2, 128, 128, &[(1, 33)], 3, false),
    // d_k over 128 (eight state registers per lane), with a tail.
    (1, 1, 200, 24, &[(0, 2), (1, 1)], 2, false),
    (3, 3, 32, 33, &[(1, 1)], 2, false),
    (4, 8, 128, 128, &[(0, 64), (6, 1), (2, 7)], 8, true),
];

/// The written bodies of `g`, as the op's buffers.
fn views(g: &mut [Guarded]) -> Vec<&mut [f32]> {
    g.iter_mut().map(|b| b.body_mut()).collect()
}

/// The written bodies of `g`, concatenated.
fn flat(g: &[Guarded]) -> Vec<f32> {
    g.iter().flat_map(|b| b.body().iter().copied()).collect()
}

impl Ctx<'_> {
    pub(super) fn hybrid(&mut self) {
        self.conv1d_silu();
        self.l2_norm_heads();
        self.gdn_gates();
        self.delta_rule();
        self.gated_rms_norm();
        self.split_heads();
        self.sigmoid_mul();
    }

    /// Runs one case on the reference and on the backend and records the
    /// comparison of every written buffer; returns the backend's buffers
    /// (concatenated) where it ran.
    fn hybrid_case(
        &mut self,
        op: &'static str,
        desc: String,
        bufs: Vec<Buf>,
        run: &OpRun<'_>,
    ) -> Option<Vec<f32>> {
        let mut g: Vec<Guarded> = bufs
            .iter()
            .map(|b| match b {
                Buf::Out(n) => Guarded::new(*n),
                Buf::In(v) => Guarded::from(v),
            })
            .collect();
        let mut r: Vec<Vec<f32>> = bufs
            .into_iter()
            .map(|b| match b {
                Buf::Out(n) => vec![0f32; n],
                Buf::In(v) => v,
            })
            .collect();
        let sup = run(self.be, Act::Ask, &mut views(&mut g)).unwrap_or(false);
        let mut err = None;
        if sup {
            let mut rv: Vec<&mut [f32]> = r.iter_mut().map(|v| &mut v[..]).collect();
            if let Err(e) = run(self.cpu, Act::Run, &mut rv) {
                err = Some(format!("cpu reference: {e:#}"));
            } else if let Err(e) = run(self.be, Act::Run, &mut views(&mut g)) {
                err = Some(format!("{e:#}"));
            }
        }
        let (y, rf) = (flat(&g), r.concat());
        let guards = g.iter().all(|b| b.guards_ok());
        let ran = sup && err.is_none();
        self.finish(op, desc, sup, err, &y, &rf, guards, None);
        if ran {
            // Bitwise in every mode, not only `exact` (NMSE would pass).
            if let Some((i, a, b)) = compare(&y, &rf).first_diff {
                self.fail_last(Some(format!(
                    "not bitwise equal to the cpu ({:?} runs the canonical kernel): first at \
                     {i}: {a:e} ({:#010x}) vs cpu {b:e} ({:#010x})",
                    self.opts.mode,
                    a.to_bits(),
                    b.to_bits()
                )));
            }
        }
        ran.then_some(y)
    }

    fn conv1d_silu(&mut self) {
        if self.want("conv1d_silu") {
            self.conv_cases();
        }
    }

    /// Every conv case: (description, the backend's buffers where it ran).
    fn conv_cases(&mut self) -> Vec<(String, Option<Vec<f32>>)> {
        let mode = self.opts.mode;
        let mut res = Vec::new();
        for &(ch, k, runs, ns, special, full) in CONV {
            if full && self.opts.quick {
                continue;
            }
            let rs = slots(runs);
            let n = rs.len();
            let mut x = randv(&mut self.rng, n * ch, 3.0);
            if special {
                specials(&mut self.rng, &mut x, true, true);
            }
            let w = randv(&mut self.rng, ch * k, 1.0);
            let state = randv(&mut self.rng, ns * cpu_gdn::conv_state_len(k, ch), 2.0);
            let desc = format!(
                "ch={ch} K={k} slots={}{}",
                runs_desc(runs),
                if special { " specials" } else { "" }
            );
            let run = |be: &dyn Backend, a: Act, b: &mut [&mut [f32]]| -> Result<bool> {
                let [st, out] = b else {
                    anyhow::bail!("conv1d_silu case: two buffers")
                };
                let op = Op::Conv1dSilu {
                    x: &x,
                    w: &w,
                    channels: ch,
                    kernel: k,
                    row_slots: &rs,
                    state: st,
                    out,
                };
                act(be, a, op, mode)
            };
            let y = self.hybrid_case(
                "conv1d_silu",
                desc.clone(),
                vec![Buf::In(state), Buf::Out(n * ch)],
                &run,
            );
            res.push((desc, y));
        }
        res
    }

    fn delta_rule(&mut self) {
        if self.want("delta_rule") {
            self.delta_cases();
        }
    }

    /// Every delta-rule case: (description, the backend's buffers where it ran).
    fn delta_cases(&mut self) -> Vec<(String, Option<Vec<f32>>)> {
        let mode = self.opts.mode;
        let mut res = Vec::new();
        for &(h_k, h_v, d_k, d_v, runs, ns, full) in DELTA {
            if full && self.opts.quick {
                continue;
            }
            let rs = slots(runs);
            let n = rs.len();
            let (kd, vd) = (h_k * d_k, h_v * d_v);
            // Rows [q | k | v] as the layer makes them: q and k
            // L2-normalized per head.
            let mut qkv = Vec::with_capacity(n * (2 * kd + vd));
            for _ in 0..n {
                for _ in 0..2 {
                    let mut qk = randv(&mut self.rng, kd, 1.0);
                    let _ = cpu_gdn::l2_norm_heads(&mut qk, h_k, d_k, 1e-6);
                    qkv.extend(qk);
                }
                qkv.extend(randv(&mut self.rng, vd, 2.0));
            }
            let g: Vec<f32> = (0..n * h_v)
                .map(|_| -self.rng.random_range(0.01f32..2.0))
                .collect();
            let beta: Vec<f32> = (0..n * h_v)
                .map(|_| self.rng.random_range(0.05f32..0.95))
                .collect();
            let state = randv(&mut self.rng, ns * h_v * d_k * d_v, 0.5);
            let desc = format!(
                "h={h_k}/{h_v} d_k={d_k} d_v={d_v} slots={}",
                runs_desc(runs)
            );
            let run = |be: &dyn Backend, a: Act, b: &mut [&mut [f32]]| -> Result<bool> {
                let [st, out] = b else {
                    anyhow::bail!("delta_rule case: two buffers")
                };
                let op = Op::DeltaRule {
                    qkv: &qkv,
                    g: &g,
                    beta: &beta,
                    h_k,
                    h_v,
                    d_k,
                    d_v,
                    row_slots: &rs,
                    state: st,
                    out,
                };
                act(be, a, op, mode)
            };
            let y = self.hybrid_case(
                "delta_rule",
                desc.clone(),
                vec![Buf::In(state), Buf::Out(n * vd)],
                &run,
            );
            res.push((desc, y));
        }
        res
    }

    fn l2_norm_heads(&mut self) {
        if !self.want("l2_norm_heads") {
            return;
        }
        let mode = self.opts.mode;
        // (rows, row_len, n_heads, head_dim, scale, specials): q and k of
        // a qkv row; odd heads; tiny values (norms under eps).
        for &(rows, row_len, nh, hd, scale, special) in &[
            (5usize, 1024usize, 4usize, 128usize, 1.0f32, false),
            (3, 300, 4, 48, 2.0, true),
            (7, 99, 3, 33, 1.0, false),
            (2, 64, 2, 32, 1e-20, false),
        ] {
            let mut x = randv(&mut self.rng, rows * row_len, scale);
            if special {
                specials(&mut self.rng, &mut x, true, true);
            }
            let run = |be: &dyn Backend, a: Act, b: &mut [&mut [f32]]| -> Result<bool> {
                let [x] = b else {
                    anyhow::bail!("l2_norm_heads case: one buffer")
                };
                let op = Op::L2NormHeads {
                    x,
                    row_len,
                    n_heads: nh,
                    head_dim: hd,
                    eps: 1e-6,
                };
                act(be, a, op, mode)
            };
            let desc = format!("rows={rows} row_len={row_len} heads={nh}x{hd} scale={scale:e}");
            self.hybrid_case("l2_norm_heads", desc, vec![Buf::In(x)], &run);
        }
    }

    fn gdn_gates(&mut self) {
        if !self.want("gdn_gates") {
            return;
        }
        let mode = self.opts.mode;
        for &(n, h_v, special) in &[(1usize, 32usize, false), (9, 12, true), (64, 32, false)] {
            // a over +-30: softplus's pass-through above 20 and its
            // e^x-only branch below about -17.
            let mut a = randv(&mut self.rng, n * h_v, 30.0);
            let mut b = randv(&mut self.rng, n * h_v, 12.0);
            if special {
                specials(&mut self.rng, &mut a, true, true);
                specials(&mut self.rng, &mut b, true, true);
            }
            let dt_bias = randv(&mut self.rng, h_v, 1.0);
            let ssm_a: Vec<f32> = (0..h_v)
                .map(|_| -(self.rng.random_range(-3.0f32..1.0)).exp())
                .collect();
            let run = |be: &dyn Backend, act_: Act, bufs: &mut [&mut [f32]]| -> Result<bool> {
                let [g, beta] = bufs else {
                    anyhow::bail!("gdn_gates case: two buffers")
                };
                let op = Op::GdnGates {
                    a: &a,
                    b: &b,
                    dt_bias: &dt_bias,
                    ssm_a: &ssm_a,
                    g,
                    beta,
                };
                act(be, act_, op, mode)
            };
            let desc = format!("n={n} h_v={h_v}{}", if special { " specials" } else { "" });
            let bufs = vec![Buf::Out(n * h_v), Buf::Out(n * h_v)];
            self.hybrid_case("gdn_gates", desc, bufs, &run);
        }
    }

    fn gated_rms_norm(&mut self) {
        if !self.want("gated_rms_norm") {
            return;
        }
        let mode = self.opts.mode;
        for &(rows, hd, special) in &[
            (12usize, 128usize, false),
            (7, 40, true),
            (5, 33, false),
            (1, 256, false),
        ] {
            let mut x = randv(&mut self.rng, rows * hd, 2.0);
            let z = randv(&mut self.rng, rows * hd, 4.0);
            if special {
                specials(&mut self.rng, &mut x, true, true);
            }
            let w = randv(&mut self.rng, hd, 1.5);
            let run = |be: &dyn Backend, a: Act, b: &mut [&mut [f32]]| -> Result<bool> {
                let [out] = b else {
                    anyhow::bail!("gated_rms_norm case: one buffer")
                };
                let op = Op::GatedRmsNorm {
                    x: &x,
                    z: &z,
                    w: &w,
                    head_dim: hd,
                    eps: 1e-6,
                    out,
                };
                act(be, a, op, mode)
            };
            let desc = format!(
                "rows={rows} head_dim={hd}{}",
                if special { " specials" } else { "" }
            );
            self.hybrid_case("gated_rms_norm", desc, vec![Buf::Out(rows * hd)], &run);
        }
    }

    fn split_heads(&mut self) {
        if !self.want("split_heads") {
            return;
        }
        let mode = self.opts.mode;
        for &(rows, hd) in &[(6usize, 256usize), (3, 40), (5, 1)] {
            let x = randv(&mut self.rng, rows * 2 * hd, 3.0);
            let run = |be: &dyn Backend, act_: Act, bufs: &mut [&mut [f32]]| -> Result<bool> {
                let [a, b] = bufs else {
                    anyhow::bail!("split_heads case: two buffers")
                };
                let op = Op::SplitHeads {
                    x: &x,
                    head_dim: hd,
                    a,
                    b,
                };
                act(be, act_, op, mode)
            };
            let bufs = vec![Buf::Out(rows * hd), Buf::Out(rows * hd)];
            self.hybrid_case(
                "split_heads",
                format!("rows={rows} head_dim={hd}"),
                bufs,
                &run,
            );
        }
    }

    fn sigmoid_mul(&mut self) {
        if !self.want("sigmoid_mul") {
            return;
        }
        let mode = self.opts.mode;
        for &(len, special) in &[(1000usize, false), (37, true), (4096, false)] {
            let mut x = randv(&mut self.rng, len, 3.0);
            // Gates over +-100: exp's overflow and underflow.
            let mut gate = randv(&mut self.rng, len, 100.0);
            if special {
                specials(&mut self.rng, &mut x, true, true);
                specials(&mut self.rng, &mut gate, true, true);
            }
            let run = |be: &dyn Backend, a: Act, b: &mut [&mut [f32]]| -> Result<bool> {
                let [x] = b else {
                    anyhow::bail!("sigmoid_mul case: one buffer")
                };
                act(be, a, Op::SigmoidMul { x, gate: &gate }, mode)
            };
            let desc = format!("len={len}{}", if special { " specials" } else { "" });
            self.hybrid_case("sigmoid_mul", desc, vec![Buf::In(x)], &run);
        }
    }
}

/// The hybrid ops' cases alone (`run` holds them too).
pub fn run(be: &dyn Backend, cpu: &dyn Backend, opts: &Options) -> Vec<CaseResult> {
    let mut c = Ctx {
        be,
        cpu,
        opts,
        rng: ChaCha8Rng::seed_from_u64(opts.seed),
        keep: Vec::new(),
        results: Vec::new(),
    };
    c.hybrid();
    c.results
}

/// The state-carrying cases (conv1d_silu, delta_rule) on `cuda` with the
/// fused state path and with the unfused one (tuning `gdn.fused`; the
/// backend's own setting is restored): each against the cpu (the unfused
/// run's results are named `<op>_unfused`), and the two runs' buffers
/// bitwise equal to each other (`<op>_paths`).
pub fn state_paths(cuda: &mut CudaBackend, cpu: &dyn Backend, opts: &Options) -> Vec<CaseResult> {
    let was = cuda.tuning.gdn.fused;
    let mut results = Vec::new();
    let mut outs = Vec::new();
    for fused in [true, false] {
        cuda.tuning.gdn.fused = fused;
        let mut c = Ctx {
            be: &*cuda,
            cpu,
            opts,
            // The same inputs in both runs.
            rng: ChaCha8Rng::seed_from_u64(opts.seed ^ 0x0067_646e),
            keep: Vec::new(),
            results: Vec::new(),
        };
        let mut o = Vec::new();
        if c.want("conv1d_silu") {
            o.extend(
                c.conv_cases()
                    .into_iter()
                    .map(|(d, y)| ("conv1d_silu", d, y)),
            );
        }
        if c.want("delta_rule") {
            o.extend(
                c.delta_cases()
                    .into_iter()
                    .map(|(d, y)| ("delta_rule", d, y)),
            );
        }
        for r in &mut c.results {
            r.op = match (fused, r.op) {
                (false, "conv1d_silu") => "conv1d_silu_unfused",
                (false, "delta_rule") => "delta_rule_unfused",
                (_, op) => op,
            };
        }
        results.extend(c.results);
        outs.push(o);
    }
    cuda.tuning.gdn.fused = was;
    let (fused, unfused) = (&outs[0], &outs[1]);
    for ((op, desc, a), (_, _, b)) in fused.iter().zip(unfused) {
        let status = match (a, b) {
            (Some(a), Some(b)) => match compare(a, b).first_diff {
                None => Status::Pass,
                Some((i, x, y)) => Status::Fail(format!(
                    "fused and unfused state paths differ: first at {i}: {x:e} ({:#010x}) vs \
                     {y:e} ({:#010x})",
                    x.to_bits(),
                    y.to_bits()
                )),
            },
            _ => Status::Fail("a state path did not run (see its case)".into()),
        };
        results.push(CaseResult {
            op: if *op == "conv1d_silu" {
                "conv1d_silu_paths"
            } else {
                "delta_rule_paths"
            },
            desc: desc.clone(),
            bitwise: status == Status::Pass,
            status,
            nmse: 0.0,
            perf: None,
        });
    }
    results
}
