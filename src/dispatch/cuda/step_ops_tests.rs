//! The recorded op list of the real Llama graph (model/arch/llama.rs,
//! `forward_bufs`) over tiny synthetic models, against the op lists the
//! fusion pass's table tests build for the real models' shapes: the same
//! kinds in the same order, and the same annotations.

use super::*;
use crate::backend::cuda::fusion::tests::{reads, step, tuning, Shape};
use crate::backend::cuda::fusion::{plan, StepFusion};
use crate::backend::Mode;
use crate::dispatch::weights::{HostStore, WeightRef};
use crate::gguf::GgufFile;
use crate::model::arch::llama::{forward_bufs, LlamaModel};
use crate::model::config::{Arch, ModelConfig};
use crate::model::synth;

fn shape_of(w: &WeightRef) -> MatShape {
    MatShape {
        ty: w.ty,
        rows: w.rows,
        cols: w.cols,
    }
}

fn load(name: &str, ty: GgmlType, dir: &std::path::Path) -> LlamaModel {
    let path = dir.join(format!("{name}.gguf"));
    synth::write_model(&path, synth::find_shape(name).unwrap(), ty, 3).unwrap();
    let g = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(&g).unwrap();
    LlamaModel::load(&g, cfg, &|_, _| {}).unwrap()
}

/// The step's ops as the graph issues them, `n` rows, `m` with logits.
fn recorded(model: &LlamaModel, mode: Mode, n: usize, m: usize) -> Vec<StepOp> {
    let c = &model.cfg;
    let r = |n: usize, ty: GgmlType, k: usize, _rows: &[usize]| reads(mode, n, ty, k);
    let e = ShapeExec::<HostStore>::new(shape_of, &r);
    let mut kv = KvShape {
        geometry: (16, c.n_kv_heads, c.head_dim),
        cells: 1024,
        layers: c.n_layers,
        states: None,
    };
    let bufs = ShapeExec::<HostStore>::step_bufs(n, m, m == n, false);
    forward_bufs(c, &model.weights, &e, &mut kv, &bufs).unwrap();
    e.into_ops()
}

/// The table tests' description of the same model.
fn described(model: &LlamaModel, out_ty: GgmlType) -> Shape {
    let (c, l) = (&model.cfg, &model.weights.layers[0]);
    Shape {
        dim: c.dim,
        q_dim: c.q_dim(),
        kv_dim: c.kv_dim(),
        ffn: c.ffn_dim,
        layers: c.n_layers,
        vocab: c.vocab_size,
        head_dim: c.head_dim,
        qk_norm: c.arch == Arch::Qwen3,
        bias: l.bq.is_some(),
        ty: l.wq.ty,
        ty_v: l.wv.ty,
        ty_down: l.w_down.ty,
        ty_out: out_ty,
    }
}

fn kind(op: &StepOp) -> &'static str {
    match op {
        StepOp::MatMuls(_) => "mat_muls",
        StepOp::RmsNorm { .. } => "rms_norm",
        StepOp::SwiGlu { .. } => "swiglu",
        StepOp::PagedAttention { .. } => "paged_attention",
        StepOp::Other { kind } => kind,
    }
}

#[test]
fn the_graph_issues_the_ops_the_pass_tables_describe() {
    let dir = tempfile::tempdir().unwrap();
    let t = tuning();
    for name in ["tiny-llama", "tiny-llama-tied", "tiny-qwen2", "tiny-qwen3"] {
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K] {
            let model = load(name, ty, dir.path());
            for mode in [Mode::Exact, Mode::Deterministic, Mode::Fast] {
                for (n, m) in [(1, 1), (5, 5), (16, 16), (300, 1), (300, 300)] {
                    let got = recorded(&model, mode, n, m);
                    let out_ty = match got.last() {
                        Some(StepOp::MatMuls(h)) => h.ty,
                        other => panic!("{name}: the step ends with {other:?}"),
                    };
                    let (want, _) = step(&described(&model, out_ty), mode, n, m);
                    let case = format!("{name} {ty:?} {mode:?} n={n} m={m}");
                    let kinds = |v: &[StepOp]| v.iter().map(kind).collect::<Vec<_>>();
                    assert_eq!(kinds(&got), kinds(&want), "{case}");
                    let (fg, fw): (StepFusion, StepFusion) =
                        (plan(&got, mode, &t), plan(&want, mode, &t));
                    assert_eq!(fg, fw, "{case}");
                }
            }
        }
    }
}

#[test]
fn norm_ahead_pairs_follow_the_graph_hints() {
    // tiny-llama's 256-wide residual takes norm-ahead by default in `fast`
    // at one row: every o and down but the last produce, the op after
    // each consumes.
    let dir = tempfile::tempdir().unwrap();
    let model = load("tiny-llama", GgmlType::Q4_0, dir.path());
    let ops = recorded(&model, Mode::Fast, 1, 1);
    let f = plan(&ops, Mode::Fast, &tuning()).ops;
    let producers: Vec<usize> = (0..f.len()).filter(|&i| f[i].ahead_producer).collect();
    let consumers: Vec<usize> = (0..f.len()).filter(|&i| f[i].ahead_consumer).collect();
    let layers = model.cfg.n_layers;
    assert_eq!(producers.len(), 2 * layers - 1);
    assert_eq!(
        consumers,
        producers.iter().map(|i| i + 1).collect::<Vec<_>>()
    );
}

#[test]
fn the_cursor_hands_out_annotations_in_order_until_an_op_differs() {
    // tiny-llama's recorded step (one row, `fast`): the executor issuing
    // the same ops gets each one's annotation; a step whose op differs
    // from the plan runs on without any.
    let dir = tempfile::tempdir().unwrap();
    let model = load("tiny-llama", GgmlType::Q4_0, dir.path());
    let c = &model.cfg;
    let r = |n: usize, ty: GgmlType, k: usize, _rows: &[usize]| reads(Mode::Fast, n, ty, k);
    let e = ShapeExec::<HostStore>::new(shape_of, &r);
    let mut kv = KvShape {
        geometry: (16, c.n_kv_heads, c.head_dim),
        cells: 1024,
        layers: c.n_layers,
        states: None,
    };
    let bufs = ShapeExec::<HostStore>::step_bufs(1, 1, true, false);
    forward_bufs(c, &model.weights, &e, &mut kv, &bufs).unwrap();
    let (ops, keys) = e.into_parts();
    let want = plan(&ops, Mode::Fast, &tuning()).ops;
    let planned = Arc::new(Planned::new(ops, keys.clone(), Mode::Fast, &tuning()));
    let mut cursor = Cursor::default();
    cursor.start(Some(planned.clone()));
    let got: Vec<Option<OpFusion>> = keys.iter().map(|&k| cursor.take_key(k)).collect();
    assert_eq!(got, want.iter().copied().map(Some).collect::<Vec<_>>());
    // An op the plan does not have: no annotation, then none for the rest.
    cursor.start(Some(planned.clone()));
    assert_eq!(cursor.take_key(keys[0]), Some(want[0]));
    assert_eq!(cursor.take_key(("add", None)), None);
    assert_eq!(cursor.take_key(keys[2]), None);
    // A matmul of other rows is another op.
    cursor.start(Some(planned.clone()));
    assert_eq!(cursor.take_key((keys[0].0, Some(2))), None);
    // No plan: no annotations.
    cursor.start(None);
    assert_eq!(cursor.take_key(keys[0]), None);
}
