//! qwen35 (Qwen3.5 dense) config and weight loading: the synthetic tiny
//! model loads with the right hyper-parameters, layer schedule and tensor
//! shapes, and broken files are errors naming the key or tensor.

use std::path::{Path, PathBuf};

use quire::gguf::{GgufFile, GgufValue, GgufWriter};
use quire::model::weights::{Store, WeightRef};
use quire::model::{synth, Arch, GdnConfig, ModelConfig, Qwen35Model};
use quire::quant::GgmlType;

/// Writes `shape` (F32 matrices) with a random seed, once per directory.
fn synth_file(dir: &Path, shape: &str) -> PathBuf {
    let p = dir.join(format!("{shape}.gguf"));
    if !p.exists() {
        let seed: u64 = rand::random();
        eprintln!("{shape}: seed {seed}");
        synth::write_model(&p, synth::find_shape(shape).unwrap(), GgmlType::F32, seed).unwrap();
    }
    p
}

/// Metadata to set (Some) or remove (None).
type KvEdit = Vec<(&'static str, Option<GgufValue>)>;
/// Matrices (name, rows, cols) and vectors (f32 bits) a model holds.
type Contents = (Vec<(String, usize, usize)>, Vec<Vec<u32>>);

/// A change to a file: metadata to set (Some) or remove (None), tensors to
/// drop, and tensors to replace by zeros of new dims (F32).
#[derive(Default)]
struct Edit {
    kv: KvEdit,
    drop: Vec<&'static str>,
    reshape: Vec<(&'static str, Vec<u64>)>,
}

/// `shape`'s tiny model with `e` applied, written to its own file.
fn edited(dir: &Path, shape: &str, e: &Edit) -> GgufFile {
    let g = GgufFile::open(&synth_file(dir, shape)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        match e.kv.iter().find(|(key, _)| key == k) {
            Some((_, Some(nv))) => w.add_kv(k.clone(), nv.clone()),
            Some((_, None)) => {}
            None => w.add_kv(k.clone(), v.clone()),
        }
    }
    for (k, v) in &e.kv {
        if let Some(v) = v {
            w.add_kv(*k, v.clone()); // keys the file lacked (replacing is a no-op)
        }
    }
    for t in g.tensors() {
        if e.drop.contains(&t.name.as_str()) {
            continue;
        }
        match e.reshape.iter().find(|(n, _)| *n == t.name) {
            Some((_, dims)) => {
                let n: u64 = dims.iter().product();
                w.add_tensor(
                    t.name.clone(),
                    dims,
                    GgmlType::F32,
                    vec![0u8; 4 * n as usize],
                )
                .unwrap();
            }
            None => w
                .add_tensor(t.name.clone(), &t.dims, t.ty, g.data_of(t).to_vec())
                .unwrap(),
        }
    }
    let p = dir.join("case.gguf");
    w.write_to(&p).unwrap();
    GgufFile::open(&p).unwrap()
}

fn load(g: &GgufFile) -> anyhow::Result<Qwen35Model> {
    let cfg = ModelConfig::from_gguf(g)?;
    Qwen35Model::load(g, cfg, &|_, _| {})
}

/// The error of loading `g`, which must contain every one of `parts`.
fn assert_err(g: &GgufFile, parts: &[&str]) {
    let msg = match load(g) {
        Ok(_) => panic!("loaded, expected an error naming {parts:?}"),
        Err(e) => format!("{e:#}"),
    };
    for p in parts {
        assert!(msg.contains(p), "error should name {p:?}: {msg}");
    }
}

/// A store that records what `map` hands it: matrices by name and shape,
/// vectors by value.
struct Seen;
impl Store for Seen {
    type Mat = ();
    type Vec = ();
}

/// Every matrix (name, rows, cols) and vector of the loaded model, sorted,
/// as `Qwen35Weights::map` walks them.
fn contents(m: &Qwen35Model) -> Contents {
    let mut mats = Vec::new();
    let mut vecs = Vec::new();
    let layers = std::cell::Cell::new(0);
    m.weights
        .map::<Seen>(
            &mut |w: &WeightRef| {
                mats.push((w.name.clone(), w.rows, w.cols));
                Ok(())
            },
            &mut |v: &Vec<f32>| {
                vecs.push(v.iter().map(|x| x.to_bits()).collect());
                Ok(())
            },
            &|done, total| {
                assert_eq!(total, m.cfg.n_layers);
                layers.set(done);
            },
        )
        .unwrap();
    assert_eq!(layers.get(), m.cfg.n_layers);
    mats.sort();
    vecs.sort();
    (mats, vecs)
}

#[test]
fn tiny_loads_with_config_schedule_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let g = GgufFile::open(&synth_file(dir.path(), "qwen35-tiny")).unwrap();
    let m = load(&g).unwrap();
    let c = &m.cfg;
    assert_eq!(c.arch, Arch::Qwen35);
    assert!(c.arch.neox_rope());
    assert_eq!(
        (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim),
        (4, 64, 2, 1, 32)
    );
    assert_eq!((c.ffn_dim, c.vocab_size, c.rope_dim), (128, 384, 8));
    assert_eq!(c.rope_base, 1e7);
    let gdn = GdnConfig {
        conv_kernel: 4,
        d_k: 16,
        n_k_heads: 2,
        n_v_heads: 4,
        d_v: 16,
        full_attention_interval: 4,
        n_nextn: 0,
    };
    assert_eq!(c.gdn.as_ref(), Some(&gdn));
    assert_eq!(
        (gdn.key_dim(), gdn.value_dim(), gdn.conv_dim()),
        (32, 64, 128)
    );
    let schedule: Vec<bool> = (0..5).map(|i| c.is_recurrent(i)).collect();
    assert_eq!(schedule, [true, true, true, false, false]);

    let (mats, vecs) = contents(&m);
    let mut want = vec![
        ("token_embd.weight".to_string(), 384, 64),
        ("output.weight".to_string(), 384, 64),
    ];
    let mut want_vecs = vec![g.tensor_f32("output_norm.weight").unwrap()];
    for i in 0..4 {
        let n = |s: &str| format!("blk.{i}.{s}");
        let layer_mats = if i < 3 {
            vec![
                ("attn_qkv.weight", 128, 64),
                ("attn_gate.weight", 64, 64),
                ("ssm_beta.weight", 4, 64),
                ("ssm_alpha.weight", 4, 64),
                ("ssm_out.weight", 64, 64),
            ]
        } else {
            vec![
                ("attn_q.weight", 128, 64), // q and gate: 2 x 2 heads x 32
                ("attn_k.weight", 32, 64),
                ("attn_v.weight", 32, 64),
                ("attn_output.weight", 64, 64),
            ]
        };
        let layer_vecs: &[&str] = if i < 3 {
            &[
                "ssm_conv1d.weight",
                "ssm_dt.bias",
                "ssm_a",
                "ssm_norm.weight",
            ]
        } else {
            &["attn_q_norm.weight", "attn_k_norm.weight"]
        };
        for (t, r, cols) in layer_mats.into_iter().chain([
            ("ffn_gate.weight", 128, 64),
            ("ffn_up.weight", 128, 64),
            ("ffn_down.weight", 64, 128),
        ]) {
            want.push((n(t), r, cols));
        }
        for t in layer_vecs
            .iter()
            .chain(&["attn_norm.weight", "post_attention_norm.weight"])
        {
            want_vecs.push(g.tensor_f32(&n(t)).unwrap());
        }
        if i < 3 {
            let a = g.tensor_f32(&n("ssm_a")).unwrap();
            assert!(a.iter().all(|&x| x < 0.0), "ssm_a is -exp(A_log): {a:?}");
            assert_eq!(g.tensor(&n("ssm_conv1d.weight")).unwrap().dims, [4, 128]);
        }
    }
    // inv_freq over the 8 rotated dims: base^(-2i/8).
    let inv: Vec<f32> = (0..4)
        .map(|i| (1.0 / 1e7f64.powf(2.0 * i as f64 / 8.0)) as f32)
        .collect();
    want_vecs.push(inv);
    want.sort();
    let mut want_vecs: Vec<Vec<u32>> = want_vecs
        .iter()
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect();
    want_vecs.sort();
    assert_eq!(mats, want);
    assert_eq!(vecs, want_vecs);
}

#[test]
fn mtp_blocks_are_outside_the_trunk() {
    let dir = tempfile::tempdir().unwrap();
    let g = GgufFile::open(&synth_file(dir.path(), "qwen35-tiny-mtp")).unwrap();
    assert_eq!(g.get_u32("qwen35.block_count").unwrap(), 5);
    assert!(g.tensor("blk.4.nextn.eh_proj.weight").is_some());
    let m = load(&g).unwrap();
    assert_eq!(m.cfg.n_layers, 4);
    assert_eq!(m.cfg.gdn.as_ref().unwrap().n_nextn, 1);
    assert!(!m.cfg.is_recurrent(4));
    let (mats, _) = contents(&m);
    assert!(
        mats.iter().all(|(n, ..)| !n.starts_with("blk.4.")),
        "{mats:?}"
    );
    // Tied: the output head is the embedding table.
    let output: Vec<_> = mats
        .iter()
        .filter(|(n, ..)| n == "token_embd.weight")
        .collect();
    assert_eq!(output.len(), 2, "{mats:?}");
    // Without the key, block 4 is a trunk layer, (4 + 1) % 4 != 0 makes it
    // recurrent, and its GDN tensors are missing.
    let e = Edit {
        kv: vec![("qwen35.nextn_predict_layers", None)],
        ..Edit::default()
    };
    let g = edited(dir.path(), "qwen35-tiny-mtp", &e);
    assert_err(&g, &["missing tensor blk.4."]);
}

#[test]
fn broken_metadata_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let u = |v: u32| Some(GgufValue::U32(v));
    let cases: Vec<(KvEdit, Vec<&str>)> = vec![
        (
            vec![("qwen35.nextn_predict_layers", u(4))],
            vec!["qwen35.nextn_predict_layers", "qwen35.block_count", "4"],
        ),
        (
            vec![
                ("qwen35.ssm.time_step_rank", u(3)),
                ("qwen35.ssm.inner_size", u(48)),
            ],
            vec!["qwen35.ssm.time_step_rank", "qwen35.ssm.group_count", "3"],
        ),
        (
            vec![("qwen35.ssm.inner_size", u(128))],
            vec!["qwen35.ssm.inner_size", "qwen35.ssm.state_size"],
        ),
        (
            vec![("qwen35.ssm.conv_kernel", u(0))],
            vec!["qwen35.ssm.conv_kernel is 0"],
        ),
        (
            vec![("qwen35.ssm.group_count", u(0))],
            vec!["qwen35.ssm.group_count is 0"],
        ),
        (
            vec![("qwen35.full_attention_interval", u(0))],
            vec!["qwen35.full_attention_interval is 0"],
        ),
        (
            vec![("qwen35.ssm.state_size", None)],
            vec!["qwen35.ssm.state_size"],
        ),
        (
            vec![("qwen35.attention.key_length", None)],
            vec!["qwen35.attention.key_length"],
        ),
        // Consistent GDN counts that disagree with the tensors.
        (
            vec![("qwen35.ssm.group_count", u(1))],
            vec!["blk.0.attn_qkv.weight", "qwen35.ssm.group_count"],
        ),
        (
            vec![("qwen35.attention.head_count", u(4))],
            vec!["blk.3.attn_q.weight", "qwen35.attention.head_count"],
        ),
        // With interval 2, layer 1 would be attention: it holds GDN tensors.
        (
            vec![("qwen35.full_attention_interval", u(2))],
            vec!["blk.1.attn_q.weight"],
        ),
        (
            vec![("qwen35.expert_count", u(8))],
            vec!["qwen35.expert_count", "mixture-of-experts"],
        ),
    ];
    for (kv, parts) in cases {
        let g = edited(
            dir.path(),
            "qwen35-tiny",
            &Edit {
                kv,
                ..Edit::default()
            },
        );
        assert_err(&g, &parts);
    }
    for arch in ["qwen3next", "qwen35moe", "qwen3moe", "mixtral", "olmoe"] {
        let kv = vec![("general.architecture", Some(GgufValue::String(arch.into())))];
        let g = edited(
            dir.path(),
            "qwen35-tiny",
            &Edit {
                kv,
                ..Edit::default()
            },
        );
        assert_err(&g, &[arch, "mixture-of-experts"]);
    }
}

#[test]
fn broken_tensors_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Edit {
                drop: vec!["blk.1.ssm_a"],
                ..Edit::default()
            },
            vec!["blk.1.ssm_a"],
        ),
        // The first GDN layer's conv is checked against the metadata...
        (
            Edit {
                reshape: vec![("blk.0.ssm_conv1d.weight", vec![5, 128])],
                ..Edit::default()
            },
            vec!["blk.0.ssm_conv1d.weight", "qwen35.ssm.conv_kernel"],
        ),
        // ...every layer's by the loader, transposed ones included.
        (
            Edit {
                reshape: vec![("blk.2.ssm_conv1d.weight", vec![128, 4])],
                ..Edit::default()
            },
            vec!["blk.2.ssm_conv1d.weight"],
        ),
        (
            Edit {
                reshape: vec![("blk.1.ssm_beta.weight", vec![64, 2])],
                ..Edit::default()
            },
            vec!["blk.1.ssm_beta.weight"],
        ),
        (
            Edit {
                reshape: vec![("blk.2.ssm_norm.weight", vec![64])],
                ..Edit::default()
            },
            vec!["blk.2.ssm_norm.weight"],
        ),
        (
            Edit {
                drop: vec!["blk.3.attn_q_norm.weight"],
                ..Edit::default()
            },
            vec!["blk.3.attn_q_norm.weight"],
        ),
        (
            Edit {
                drop: vec!["blk.2.post_attention_norm.weight"],
                ..Edit::default()
            },
            vec!["blk.2.post_attention_norm.weight"],
        ),
    ];
    for (e, parts) in cases {
        let g = edited(dir.path(), "qwen35-tiny", &e);
        assert_err(&g, &parts);
    }
    // The untouched file still loads through the same rewrite.
    let g = edited(dir.path(), "qwen35-tiny", &Edit::default());
    load(&g).unwrap();
}

#[test]
fn llama_family_has_no_gdn() {
    let dir = tempfile::tempdir().unwrap();
    for shape in ["tiny-llama", "tiny-qwen3"] {
        let g = GgufFile::open(&synth_file(dir.path(), shape)).unwrap();
        let c = ModelConfig::from_gguf(&g).unwrap();
        assert!(c.gdn.is_none());
        assert!((0..c.n_layers).all(|i| !c.is_recurrent(i)));
        assert_err(&g, &["qwen35"]);
    }
    // Mixtral-style: arch llama with experts.
    let kv = vec![("llama.expert_count", Some(GgufValue::U32(8)))];
    let g = edited(
        dir.path(),
        "tiny-llama",
        &Edit {
            kv,
            ..Edit::default()
        },
    );
    let msg = format!("{:#}", ModelConfig::from_gguf(&g).unwrap_err());
    assert!(
        msg.contains("llama.expert_count") && msg.contains("mixture-of-experts"),
        "{msg}"
    );
}
