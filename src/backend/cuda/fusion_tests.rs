//! Table tests of the fusion pass: the op lists the Llama graph
//! (model/arch/llama.rs, `forward_bufs`) issues for SmolLM2, Llama 1B / 8B
//! and Qwen3 shapes, by mode and rows, against the expected annotations.

use super::*;
use crate::backend::cuda::Tuning;

/// Buffers of the step, as `forward_bufs` allocates them.
const X: BufId = 0;
const H: BufId = 1;
const Q: BufId = 2;
const K: BufId = 3;
const V: BufId = 4;
const Q_RAW: BufId = 5;
const K_RAW: BufId = 6;
const ATT: BufId = 7;
const GATE: BufId = 8;
const UP: BufId = 9;
const ACT: BufId = 10;
const SEL: BufId = 11;
const NORMED: BufId = 12;
const LOGITS: BufId = 13;
const OUT_NORM: ParamId = 1_000_000;
const EPS: u32 = 0x3727_c5ac; // 1e-5

fn attn_norm(l: usize) -> ParamId {
    2 * l
}
fn ffn_norm(l: usize) -> ParamId {
    2 * l + 1
}

/// A model's shapes and weight types.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) dim: usize,
    pub(crate) q_dim: usize,
    pub(crate) kv_dim: usize,
    pub(crate) ffn: usize,
    pub(crate) layers: usize,
    pub(crate) vocab: usize,
    pub(crate) head_dim: usize,
    /// Qwen3's per-head q/k norms.
    pub(crate) qk_norm: bool,
    /// Qwen2's q/k/v biases.
    pub(crate) bias: bool,
    /// q/k/o/gate/up, v, down, output.
    pub(crate) ty: GgmlType,
    pub(crate) ty_v: GgmlType,
    pub(crate) ty_down: GgmlType,
    pub(crate) ty_out: GgmlType,
}

const SMOL: Shape = Shape {
    dim: 576,
    q_dim: 576,
    kv_dim: 192,
    ffn: 1536,
    layers: 30,
    vocab: 49152,
    head_dim: 64,
    qk_norm: false,
    bias: false,
    ty: GgmlType::Q8_0,
    ty_v: GgmlType::Q8_0,
    ty_down: GgmlType::Q8_0,
    ty_out: GgmlType::Q8_0,
};
const L1B: Shape = Shape {
    dim: 2048,
    q_dim: 2048,
    kv_dim: 512,
    ffn: 8192,
    layers: 16,
    vocab: 128256,
    head_dim: 64,
    qk_norm: false,
    bias: false,
    ty: GgmlType::Q4_0,
    ty_v: GgmlType::Q4_0,
    ty_down: GgmlType::Q4_0,
    ty_out: GgmlType::Q6_K,
};
/// Llama 8B Q4_K_M: v and down in Q6_K.
const L8B_KM: Shape = Shape {
    dim: 4096,
    q_dim: 4096,
    kv_dim: 1024,
    ffn: 14336,
    layers: 32,
    vocab: 128256,
    head_dim: 128,
    qk_norm: false,
    bias: false,
    ty: GgmlType::Q4_K,
    ty_v: GgmlType::Q6_K,
    ty_down: GgmlType::Q6_K,
    ty_out: GgmlType::Q6_K,
};
const QWEN3: Shape = Shape {
    dim: 1024,
    q_dim: 2048,
    kv_dim: 1024,
    ffn: 3072,
    layers: 28,
    vocab: 151936,
    head_dim: 128,
    qk_norm: true,
    bias: false,
    ty: GgmlType::Q8_0,
    ty_v: GgmlType::Q8_0,
    ty_down: GgmlType::Q8_0,
    ty_out: GgmlType::Q8_0,
};

/// What the matmul planner answers at the defaults on an sm_90 device with
/// cuBLAS, as these tests assume it (`wgmma`: the prefill GEMM takes the
/// type): `exact` the canonical rows; `deterministic` the warp-per-row
/// int8 kernels; `fast` those at one row, mm_q8_mma up to 64 rows, then
/// the wgmma GEMM or cuBLAS.
pub(crate) fn reads(mode: Mode, n: usize, ty: GgmlType, k: usize) -> ActRead {
    let float = !q8_type(ty);
    match mode {
        // quant_actk's blocks (256-value types) are the op's own.
        Mode::Exact if float || ty.block_size() == 256 => ActRead::Raw,
        Mode::Exact => ActRead::Canon,
        Mode::Deterministic if float => ActRead::Raw,
        Mode::Deterministic => ActRead::Q8,
        Mode::Fast if n > 64 => {
            let wgmma = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1) && k.is_multiple_of(256);
            if wgmma {
                ActRead::F16Wr
            } else {
                ActRead::F16
            }
        }
        Mode::Fast if float => ActRead::Raw,
        Mode::Fast => ActRead::Q8,
    }
}

/// `mat_muls` of llama.rs: one `MatMuls` per weight type (in order of
/// first appearance); a norm on the op where it is one, else an `RmsNorm`
/// op first; the glu on the op where it is one, else a `SwiGlu` after.
#[allow(clippy::too_many_arguments)]
fn mat_muls(
    ops: &mut Vec<StepOp>,
    mode: Mode,
    x: BufId,
    n: usize,
    k: usize,
    jobs: &[(GgmlType, usize, BufId, bool)],
    norm: Option<(ParamId, BufId)>,
    next_norm: Option<ParamId>,
    glu: Option<BufId>,
) {
    let mut groups: Vec<(GgmlType, Vec<JobDesc>)> = Vec::new();
    for &(ty, m, out, add) in jobs {
        let j = JobDesc { m, add, out };
        match groups.iter_mut().find(|g| g.0 == ty) {
            Some(g) => g.1.push(j),
            None => groups.push((ty, vec![j])),
        }
    }
    let one = groups.len() == 1;
    let op =
        |x: BufId, ty: GgmlType, jobs: Vec<JobDesc>, norm: Option<NormDesc>, glu: Option<BufId>| {
            StepOp::MatMuls(MatOp {
                x,
                n,
                k,
                ty,
                jobs,
                norm,
                next_norm: next_norm.map(|p| (p, EPS)),
                glu,
                reads: reads(mode, n, ty, k),
            })
        };
    match norm {
        Some((_, scratch)) if !one => {
            ops.push(StepOp::RmsNorm {
                out: scratch,
                n,
                dim: k,
            });
            for (ty, jobs) in groups {
                ops.push(op(scratch, ty, jobs, None, None));
            }
        }
        norm => {
            let nd = norm.map(|(w, scratch)| NormDesc {
                w,
                eps: EPS,
                scratch,
            });
            for (gi, (ty, jobs)) in groups.into_iter().enumerate() {
                let g = if one { glu } else { None };
                ops.push(op(x, ty, jobs, nd.filter(|_| gi == 0), g));
            }
        }
    }
    if let (Some(out), false) = (glu, one) {
        ops.push(StepOp::SwiGlu {
            out,
            len: n * jobs[0].1,
        });
    }
}

/// The op list of one step of `n` rows, `m` of them wanting logits
/// (`forward_bufs`), and the index of each layer's first op.
pub(crate) fn step(s: &Shape, mode: Mode, n: usize, m: usize) -> (Vec<StepOp>, Vec<usize>) {
    let mut ops = vec![StepOp::Other { kind: "get_rows" }];
    let mut starts = Vec::new();
    for l in 0..s.layers {
        starts.push(ops.len());
        let (qd, kd) = if s.qk_norm { (Q_RAW, K_RAW) } else { (Q, K) };
        let qkv = [
            (s.ty, s.q_dim, qd, false),
            (s.ty, s.kv_dim, kd, false),
            (s.ty_v, s.kv_dim, V, false),
        ];
        mat_muls(
            &mut ops,
            mode,
            X,
            n,
            s.dim,
            &qkv,
            Some((attn_norm(l), H)),
            None,
            None,
        );
        if s.bias {
            for _ in 0..3 {
                ops.push(StepOp::Other { kind: "add_bias" });
            }
        }
        if s.qk_norm {
            let hd = s.head_dim;
            ops.push(StepOp::RmsNorm {
                out: Q,
                n: n * s.q_dim / hd,
                dim: hd,
            });
            ops.push(StepOp::RmsNorm {
                out: K,
                n: n * s.kv_dim / hd,
                dim: hd,
            });
        }
        ops.push(StepOp::Other {
            kind: "rope_kv_write",
        });
        ops.push(StepOp::PagedAttention {
            out: ATT,
            n,
            width: s.q_dim,
        });
        let wo = [(s.ty, s.dim, X, true)];
        mat_muls(
            &mut ops,
            mode,
            ATT,
            n,
            s.q_dim,
            &wo,
            None,
            Some(ffn_norm(l)),
            None,
        );
        let gu = [(s.ty, s.ffn, GATE, false), (s.ty, s.ffn, UP, false)];
        let ffn = Some((ffn_norm(l), H));
        mat_muls(&mut ops, mode, X, n, s.dim, &gu, ffn, None, Some(ACT));
        let next = (l + 1 < s.layers).then(|| attn_norm(l + 1));
        let down = [(s.ty_down, s.dim, X, true)];
        mat_muls(&mut ops, mode, ACT, n, s.ffn, &down, None, next, None);
    }
    if m > 0 {
        let x = if m == n {
            X
        } else {
            ops.push(StepOp::Other {
                kind: "select_rows",
            });
            SEL
        };
        let head = [(s.ty_out, s.vocab, LOGITS, false)];
        mat_muls(
            &mut ops,
            mode,
            x,
            m,
            s.dim,
            &head,
            Some((OUT_NORM, NORMED)),
            None,
            None,
        );
    }
    (ops, starts)
}

pub(crate) fn tuning() -> MatvecTuning {
    Tuning::for_arch("sm_90").matvec
}

fn fused(
    s: &Shape,
    mode: Mode,
    n: usize,
    m: usize,
    t: &MatvecTuning,
) -> (Vec<OpFusion>, Vec<usize>) {
    let (ops, starts) = step(s, mode, n, m);
    let f = plan(&ops, mode, t);
    assert_eq!(f.ops.len(), ops.len());
    (f.ops, starts)
}

const NONE: OpFusion = OpFusion {
    norm_for_self: None,
    out_for_next: None,
    input_from: None,
    ahead_producer: false,
    ahead_consumer: false,
};

/// A layer of one `MatMuls` per matmul group (no qk-norm), from its first
/// op `s`: qkv, rope_kv_write, attention, o, gate/up, down.
fn plain_layer(f: &[OpFusion], s: usize, read: Option<ActRead>) {
    let qkv = OpFusion {
        norm_for_self: read,
        input_from: read.map(|_| s),
        ..NONE
    };
    assert_eq!(f[s], qkv, "qkv at {s}");
    assert_eq!(f[s + 1], NONE, "rope_kv_write at {s}");
    let att = OpFusion {
        out_for_next: read,
        ..NONE
    };
    assert_eq!(f[s + 2], att, "attention at {s}");
    let o = OpFusion {
        input_from: read.map(|_| s + 2),
        ..NONE
    };
    assert_eq!(f[s + 3], o, "o at {s}");
    let gu = OpFusion {
        norm_for_self: read,
        out_for_next: read,
        input_from: read.map(|_| s + 4),
        ..NONE
    };
    assert_eq!(f[s + 4], gu, "gate/up at {s}");
    let down = OpFusion {
        input_from: read.map(|_| s + 4),
        ..NONE
    };
    assert_eq!(f[s + 5], down, "down at {s}");
}

#[test]
fn one_row_fast_and_deterministic_prequantize_every_matmul_input() {
    let t = tuning();
    for (s, mode) in [
        (L1B, Mode::Fast),
        (L1B, Mode::Deterministic),
        (SMOL, Mode::Deterministic),
    ] {
        let (f, starts) = fused(&s, mode, 1, 1, &t);
        for &st in &starts {
            plain_layer(&f, st, Some(ActRead::Q8));
        }
        // The output head: its norm quantizes for it.
        let h = f.len() - 1;
        assert_eq!(f[h].norm_for_self, Some(ActRead::Q8));
        assert_eq!(f[h].input_from, Some(h));
    }
}

#[test]
fn exact_prepares_nothing_ahead() {
    let t = tuning();
    for s in [SMOL, L1B] {
        let (f, starts) = fused(&s, Mode::Exact, 1, 1, &t);
        for &st in &starts {
            plain_layer(&f, st, None);
        }
    }
}

#[test]
fn norm_ahead_on_narrow_residuals_in_fast_one_row_only() {
    let t = tuning();
    let (f, starts) = fused(&SMOL, Mode::Fast, 1, 1, &t);
    for (l, &s) in starts.iter().enumerate() {
        // qkv: the down projection before left its blocks (not layer 0).
        let qkv = if l == 0 {
            OpFusion {
                norm_for_self: Some(ActRead::Q8),
                input_from: Some(s),
                ..NONE
            }
        } else {
            OpFusion {
                ahead_consumer: true,
                ..NONE
            }
        };
        assert_eq!(f[s], qkv, "layer {l}");
        assert_eq!(f[s + 2].out_for_next, Some(ActRead::Q8));
        let o = OpFusion {
            input_from: Some(s + 2),
            ahead_producer: true,
            ..NONE
        };
        assert_eq!(f[s + 3], o, "layer {l}");
        // gate/up consumes, and its SwiGlu quantizes for the down.
        let gu = OpFusion {
            out_for_next: Some(ActRead::Q8),
            ahead_consumer: true,
            ..NONE
        };
        assert_eq!(f[s + 4], gu, "layer {l}");
        // The last down has no hint (the output norm may follow a row
        // selection).
        let down = OpFusion {
            input_from: Some(s + 4),
            ahead_producer: l + 1 < SMOL.layers,
            ..NONE
        };
        assert_eq!(f[s + 5], down, "layer {l}");
    }
    // Off by default on the 1B's 2,048 (see the previous test); forced on.
    let mut on = t.clone();
    on.norm_ahead = Switch::On;
    let (f, starts) = fused(&L1B, Mode::Fast, 1, 1, &on);
    assert!(f[starts[1]].ahead_consumer && f[starts[1] + 3].ahead_producer);
    // Forced off on SmolLM2: the plain fusions.
    let mut off = t.clone();
    off.norm_ahead = Switch::Off;
    let (f, starts) = fused(&SMOL, Mode::Fast, 1, 1, &off);
    for &st in &starts {
        plain_layer(&f, st, Some(ActRead::Q8));
    }
    // Not past one row, nor outside `fast`.
    for (mode, n) in [(Mode::Fast, 2), (Mode::Fast, 16), (Mode::Deterministic, 1)] {
        let (f, _) = fused(&SMOL, mode, n, n, &t);
        assert!(
            f.iter().all(|o| !o.ahead_producer && !o.ahead_consumer),
            "{mode:?} n={n}"
        );
    }
}

#[test]
fn prequant_off_leaves_every_matmul_to_quantize_its_input() {
    let mut t = tuning();
    t.prequant = false;
    t.norm_ahead = Switch::Off;
    for (s, mode, n) in [
        (L1B, Mode::Fast, 1),
        (SMOL, Mode::Deterministic, 5),
        (L1B, Mode::Fast, 512),
    ] {
        let (f, starts) = fused(&s, mode, n, 1, &t);
        for &st in &starts {
            assert_eq!(f[st + 2], NONE);
            assert_eq!(f[st + 3], NONE);
            assert_eq!(f[st + 4].norm_for_self, None);
            assert_eq!(f[st + 4].out_for_next, None);
        }
    }
}

#[test]
fn prefill_writes_the_wgmma_tiles_where_k_allows() {
    let t = tuning();
    // The 1B Q4_0 prefill: every input in to_f16_wr's tiles (2,048 and
    // 8,192 are multiples of 256); one logit row: its head at one row.
    let (f, starts) = fused(&L1B, Mode::Fast, 512, 1, &t);
    for &st in &starts {
        plain_layer(&f, st, Some(ActRead::F16Wr));
    }
    let h = f.len() - 1;
    assert_eq!(f[h - 1], NONE, "select_rows");
    assert_eq!(f[h].norm_for_self, Some(ActRead::Q8), "the head at one row");
    // SmolLM2's 576 is not a multiple of 256, and its Q8_0 goes through
    // cuBLAS (f16 rows the GEMM converts itself): nothing prepared.
    let (f, starts) = fused(&SMOL, Mode::Fast, 512, 1, &t);
    for &st in &starts {
        assert_eq!(f[st], NONE);
        assert_eq!(f[st + 2], NONE);
        assert_eq!(f[st + 4], NONE);
    }
}

#[test]
fn split_groups_share_one_quantized_input() {
    // Q4_K_M: q/k in Q4_K and v in Q6_K: an RmsNorm op, then two MatMuls
    // of its output; the norm quantizes once for both (one row, `fast`).
    let t = tuning();
    let (ops, starts) = step(&L8B_KM, Mode::Fast, 1, 1);
    let f = plan(&ops, Mode::Fast, &t).ops;
    let s = starts[3];
    assert!(matches!(ops[s], StepOp::RmsNorm { .. }));
    assert_eq!(f[s].out_for_next, Some(ActRead::Q8));
    assert_eq!(f[s + 1].input_from, Some(s));
    assert_eq!(f[s + 2].input_from, Some(s));
    // `exact`: the K-quant canonical kernel quantizes per job (quant_actk)
    // and keeps nothing: each op prepares its own.
    let f = plan(&step(&L8B_KM, Mode::Exact, 1, 1).0, Mode::Exact, &t).ops;
    assert_eq!(f[s], NONE);
    assert_eq!(f[s + 1].input_from, None);
    assert_eq!(f[s + 2].input_from, None);
    // A 32-block type split across ops (q/k in Q8_0, v in Q4_0): the
    // first matmul quantizes (canonical rows), the second reads them.
    let split = Shape {
        ty: GgmlType::Q8_0,
        ty_v: GgmlType::Q4_0,
        ty_down: GgmlType::Q8_0,
        ty_out: GgmlType::Q8_0,
        ..L8B_KM
    };
    let f = plan(&step(&split, Mode::Exact, 1, 1).0, Mode::Exact, &t).ops;
    assert_eq!(f[s], NONE);
    assert_eq!(f[s + 1].input_from, None);
    assert_eq!(f[s + 2].input_from, Some(s + 1));
}

#[test]
fn wgmma_tiles_only_from_ops_that_know_their_rows() {
    // A bare `SwiGlu` op has no rows: the wgmma reader after it converts
    // its own input; q8 blocks need no rows. A norm before the same
    // reader writes the tiles.
    let t = tuning();
    let (n, k) = (128, 8192);
    let reader = |reads| {
        StepOp::MatMuls(MatOp {
            x: ACT,
            n,
            k,
            ty: GgmlType::Q4_0,
            jobs: vec![JobDesc {
                m: 4096,
                add: true,
                out: X,
            }],
            norm: None,
            next_norm: None,
            glu: None,
            reads,
        })
    };
    for (producer, read, want) in [
        (
            StepOp::SwiGlu {
                out: ACT,
                len: n * k,
            },
            ActRead::F16Wr,
            None,
        ),
        (
            StepOp::SwiGlu {
                out: ACT,
                len: n * k,
            },
            ActRead::Q8,
            Some(ActRead::Q8),
        ),
        (
            StepOp::RmsNorm {
                out: ACT,
                n,
                dim: k,
            },
            ActRead::F16Wr,
            Some(ActRead::F16Wr),
        ),
    ] {
        let f = plan(&[producer, reader(read)], Mode::Fast, &t).ops;
        assert_eq!(f[0].out_for_next, want, "{read:?}");
        assert_eq!(f[1].input_from, want.map(|_| 0), "{read:?}");
    }
}

#[test]
fn qk_norms_feed_no_matmul() {
    // Qwen3's per-head norms precede rope_kv_write: nothing prepared for
    // it; the rest of the layer as any other.
    let t = tuning();
    let (ops, starts) = step(&QWEN3, Mode::Fast, 1, 1);
    let f = plan(&ops, Mode::Fast, &t).ops;
    for &s in &starts {
        assert!(matches!(ops[s + 1], StepOp::RmsNorm { .. }));
        assert_eq!(f[s + 1], NONE);
        assert_eq!(f[s + 2], NONE);
        assert_eq!(f[s].norm_for_self.is_some(), s == starts[0]);
    }
}

#[test]
fn bitwise_modes_keep_their_fusions_whatever_the_rows() {
    // `exact` and `deterministic` fuse only what keeps the bits (never
    // norm-ahead), and the same ops whatever the batch: a row's result
    // cannot depend on how many rows the step has.
    let t = tuning();
    for s in [SMOL, L1B, L8B_KM, QWEN3] {
        for mode in [Mode::Exact, Mode::Deterministic] {
            let one = fused(&s, mode, 1, 1, &t).0;
            for n in 2..=80 {
                let f = fused(&s, mode, n, n, &t).0;
                assert_eq!(f, one, "{mode:?} n={n}");
            }
        }
    }
}

#[test]
fn norm_ahead_by_default_on_narrow_residuals_only() {
    // SmolLM2's 576 and the bound itself: on; the 1B's 2,048 and the
    // 8B's 4,096: off.
    assert!(norm_ahead_rule(Switch::Auto, 576));
    assert!(norm_ahead_rule(Switch::Auto, 1024));
    assert!(!norm_ahead_rule(Switch::Auto, 1056));
    assert!(!norm_ahead_rule(Switch::Auto, 2048));
    assert!(!norm_ahead_rule(Switch::Auto, 4096));
    // The switch wins both ways.
    assert!(norm_ahead_rule(Switch::On, 4096));
    assert!(!norm_ahead_rule(Switch::Off, 576));
}

#[test]
fn producer_in_clusters_of_four_where_the_device_has_them() {
    // No clusters: one CTA of 1,024 threads per 32 rows.
    assert_eq!(
        producer_form(false, 2048, 2048),
        ("mv_q8_r1_na", 1024, 32, 1)
    );
    // The 1B's o projection (k = m): a warp per row, 8 rows per CTA.
    assert_eq!(
        producer_form(true, 2048, 2048),
        ("mv_q8_r1_na_c4", 256, 8, 4)
    );
    // Its down projection (k = 4 m): two warps per row.
    assert_eq!(
        producer_form(true, 8192, 2048),
        ("mv_q8_r1_na_w2c4", 512, 8, 4)
    );
    // SmolLM2's down projection (1,536 < 3 x 576): one warp per row.
    assert_eq!(
        producer_form(true, 1536, 576),
        ("mv_q8_r1_na_c4", 256, 8, 4)
    );
}
