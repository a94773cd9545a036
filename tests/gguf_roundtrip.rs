//! GgufWriter -> GgufFile round trips: every weight type, every metadata
//! value type (arrays of strings and nested arrays included), typed getters.

use quire::gguf::{GgufError, GgufFile, GgufValue, GgufWriter};
use quire::quant::{dequantize, quantize, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_f32(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

fn all_value_kinds(rng: &mut ChaCha8Rng) -> Vec<(String, GgufValue)> {
    let s = |x: &str| GgufValue::String(x.to_string());
    vec![
        ("general.architecture".into(), s("llama")),
        ("t.u8".into(), GgufValue::U8(rng.random())),
        ("t.i8".into(), GgufValue::I8(rng.random())),
        ("t.u16".into(), GgufValue::U16(rng.random())),
        ("t.i16".into(), GgufValue::I16(rng.random())),
        ("t.u32".into(), GgufValue::U32(rng.random())),
        ("t.i32".into(), GgufValue::I32(rng.random())),
        ("t.u64".into(), GgufValue::U64(rng.random())),
        ("t.i64".into(), GgufValue::I64(rng.random())),
        (
            "t.f32".into(),
            GgufValue::F32(rng.random_range(-1e6f32..1e6)),
        ),
        (
            "t.f64".into(),
            GgufValue::F64(rng.random_range(-1e6f64..1e6)),
        ),
        ("t.bool".into(), GgufValue::Bool(rng.random())),
        ("t.string".into(), s("héllo wörld ✓")),
        ("t.empty_string".into(), s("")),
        (
            "t.strings".into(),
            GgufValue::Array(vec![s("a"), s(""), s("Ġthe"), s("<|im_start|>")]),
        ),
        (
            "t.f32s".into(),
            GgufValue::Array((0..7).map(|_| GgufValue::F32(rng.random())).collect()),
        ),
        (
            "t.i32s".into(),
            GgufValue::Array((0..9).map(|_| GgufValue::I32(rng.random())).collect()),
        ),
        (
            "t.u8s".into(),
            GgufValue::Array((0..5).map(|_| GgufValue::U8(rng.random())).collect()),
        ),
        (
            "t.i16s".into(),
            GgufValue::Array((0..5).map(|_| GgufValue::I16(rng.random())).collect()),
        ),
        (
            "t.bools".into(),
            GgufValue::Array(vec![GgufValue::Bool(true), GgufValue::Bool(false)]),
        ),
        (
            "t.f64s".into(),
            GgufValue::Array(vec![GgufValue::F64(0.1), GgufValue::F64(-2.5)]),
        ),
        (
            "t.u64s".into(),
            GgufValue::Array(vec![GgufValue::U64(u64::MAX), GgufValue::U64(3)]),
        ),
        ("t.empty".into(), GgufValue::Array(vec![])),
        (
            "t.nested".into(),
            GgufValue::Array(vec![
                GgufValue::Array(vec![GgufValue::U32(1), GgufValue::U32(2)]),
                GgufValue::Array(vec![GgufValue::U32(3)]),
            ]),
        ),
    ]
}

#[test]
fn round_trip_every_type_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rt.gguf");
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let kvs = all_value_kinds(&mut rng);
    let mut w = GgufWriter::new();
    for (k, v) in &kvs {
        w.add_kv(k.as_str(), v.clone());
    }
    let mut expect = Vec::new();
    for (i, ty) in GgmlType::WEIGHT_TYPES.into_iter().enumerate() {
        // Odd row counts and a 3D tensor exercise padding and dim order.
        let dims: Vec<u64> = if i % 3 == 2 {
            vec![256, 3, 2]
        } else {
            vec![256, 1 + i as u64]
        };
        let n: u64 = dims.iter().product();
        let x = random_f32(&mut rng, n as usize);
        let data = quantize(ty, &x).unwrap();
        let name = format!("blk.{i}.{}", ty.name());
        w.add_tensor(name.as_str(), &dims, ty, data.clone())
            .unwrap();
        expect.push((name, dims, ty, data));
    }
    // A 1D tensor whose size is not a multiple of the alignment.
    let norm = random_f32(&mut rng, 7);
    w.add_tensor(
        "norm",
        &[7],
        GgmlType::F32,
        quantize(GgmlType::F32, &norm).unwrap(),
    )
    .unwrap();
    w.write_to(&path).unwrap();

    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.metadata(), &kvs[..], "metadata differs or lost its order");
    for (k, v) in &kvs {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.arch().unwrap(), "llama");
    assert_eq!(f.tensors().len(), expect.len() + 1);
    for (i, (name, dims, ty, data)) in expect.iter().enumerate() {
        let t = f.tensor(name).unwrap();
        assert_eq!(&f.tensors()[i], t, "tensor order");
        assert_eq!(&t.dims, dims, "{name}");
        assert_eq!(t.ty, *ty, "{name}");
        assert_eq!(t.offset % 32, 0, "{name}");
        assert_eq!(t.n_bytes, data.len(), "{name}");
        assert_eq!(t.cols(), 256);
        assert_eq!(t.rows(), dims[1..].iter().product::<u64>());
        assert_eq!(t.n_elements(), dims.iter().product::<u64>());
        assert_eq!(t.row_bytes() as u64 * t.rows(), data.len() as u64);
        assert_eq!(f.tensor_data(name).unwrap(), &data[..], "{name}");
        let mut want = vec![0f32; t.n_elements() as usize];
        dequantize(*ty, data, &mut want).unwrap();
        assert_eq!(f.tensor_f32(name).unwrap(), want, "{name}");
    }
    assert_eq!(f.tensor_f32("norm").unwrap(), norm);
    assert!(matches!(
        f.tensor_data("nope"),
        Err(GgufError::MissingTensor { .. })
    ));
}

#[test]
fn typed_getters() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("get.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("u8", 200u8);
    w.add_kv("i64", 123_456i64);
    w.add_kv("neg", -1i32);
    w.add_kv("big", u64::MAX);
    w.add_kv("f32", 1.5f32);
    w.add_kv("f64", 0.25f64);
    w.add_kv("flag", true);
    w.add_kv("name", "smollm");
    w.add_kv("toks", vec!["a", "b"]);
    w.add_kv("scores", vec![0.5f32, -1.0]);
    w.add_kv("types", vec![1u8, 3, 6]);
    w.add_kv("i64s", vec![5i64, -7]);
    w.add_kv("bigs", vec![u64::MAX]);
    w.add_kv("name", "smollm2"); // replaces, keeps position
    w.write_to(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.metadata()[7].0, "name");
    assert_eq!(f.get_str("name").unwrap(), "smollm2");
    assert_eq!(f.get_u32("u8").unwrap(), 200);
    assert_eq!(f.get_u32("i64").unwrap(), 123_456);
    assert_eq!(f.get_u64("big").unwrap(), u64::MAX);
    assert_eq!(f.get_f32("f32").unwrap(), 1.5);
    assert_eq!(f.get_f32("f64").unwrap(), 0.25);
    assert!(f.get_bool("flag").unwrap());
    assert_eq!(f.get_str_array("toks").unwrap(), vec!["a", "b"]);
    assert_eq!(f.get_f32_array("scores").unwrap(), vec![0.5, -1.0]);
    assert_eq!(f.get_i32_array("types").unwrap(), vec![1, 3, 6]);
    assert_eq!(f.get_i32_array("i64s").unwrap(), vec![5, -7]);
    assert_eq!(f.opt_u32("missing").unwrap(), None);
    assert_eq!(f.opt_u32("u8").unwrap(), Some(200));
    assert_eq!(f.opt_f32("f32").unwrap(), Some(1.5));
    assert_eq!(f.opt_bool("flag").unwrap(), Some(true));
    assert_eq!(f.opt_str("name").unwrap(), Some("smollm2"));
    assert_eq!(f.opt_str("nothing").unwrap(), None);

    // Errors name the file and the key.
    let errs = [
        f.get_u32("neg").unwrap_err(),
        f.get_u32("big").unwrap_err(),
        f.get_u32("f32").unwrap_err(),
        f.get_str("u8").unwrap_err(),
        f.get_f32("u8").unwrap_err(),
        f.get_bool("name").unwrap_err(),
        f.get_str_array("scores").unwrap_err(),
        f.get_f32_array("toks").unwrap_err(),
        f.get_i32_array("bigs").unwrap_err(),
        f.get_u32("absent").unwrap_err(),
        f.opt_u32("name").unwrap_err(),
        f.opt_str("u8").unwrap_err(),
        f.arch().unwrap_err(),
    ];
    for e in errs {
        let msg = e.to_string();
        assert!(msg.contains("get.gguf"), "no file in: {msg}");
        assert!(matches!(e, GgufError::Metadata { .. }), "{msg}");
        let GgufError::Metadata { key, .. } = &e else {
            unreachable!()
        };
        assert!(msg.contains(&format!("'{key}'")), "no key in: {msg}");
    }
    // The error works with anyhow.
    let a: anyhow::Error = f.get_str("u8").unwrap_err().into();
    assert!(a.to_string().contains("expected string"));
}

#[test]
fn custom_alignment_and_empty_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("al.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", 256u32);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let a = quantize(GgmlType::Q8_0, &random_f32(&mut rng, 64)).unwrap();
    let b = quantize(GgmlType::F16, &random_f32(&mut rng, 3)).unwrap();
    w.add_tensor("a", &[64], GgmlType::Q8_0, a.clone()).unwrap();
    w.add_tensor("b", &[3], GgmlType::F16, b.clone()).unwrap();
    w.write_to(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.alignment(), 256);
    assert_eq!(f.data_offset() % 256, 0);
    assert_eq!(f.tensor("b").unwrap().offset, 256);
    assert_eq!(f.tensor_data("a").unwrap(), &a[..]);
    assert_eq!(f.tensor_data("b").unwrap(), &b[..]);

    // Metadata only, no tensors.
    let path = dir.path().join("empty.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("k", 1u32);
    w.write_to(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert!(f.tensors().is_empty());
    assert_eq!(f.get_u32("k").unwrap(), 1);
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    let err = |r: Result<(), GgufError>| r.unwrap_err().to_string();
    let e = err(w.add_tensor("x", &[32, 2], GgmlType::Q4_0, vec![0; 35]));
    assert!(e.contains("'x'") && e.contains("36"), "{e}");
    let e = err(w.add_tensor("x", &[16, 2], GgmlType::Q4_0, vec![0; 18]));
    assert!(e.contains("multiple"), "{e}");
    let e = err(w.add_tensor("x", &[], GgmlType::F32, vec![]));
    assert!(e.contains("dims"), "{e}");
    let e = err(w.add_tensor("x", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]));
    assert!(e.contains("dims"), "{e}");
    let e = err(w.add_tensor("x", &[u64::MAX, 2], GgmlType::F32, vec![]));
    assert!(e.contains("overflow"), "{e}");
    let e = err(w.add_tensor("x", &[256], GgmlType::Q8_K, vec![0; 292]));
    assert!(e.contains("Q8_K"), "{e}");
    w.add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 34])
        .unwrap();
    let e = err(w.add_tensor("x", &[32], GgmlType::Q8_0, vec![0; 34]));
    assert!(e.contains("duplicate"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.add_kv("general.alignment", 48u32);
    assert!(w.write_to(&dir.path().join("a.gguf")).is_err());
    let mut w = GgufWriter::new();
    w.add_kv(
        "mixed",
        GgufValue::Array(vec![GgufValue::U32(1), GgufValue::I32(1)]),
    );
    let e = w
        .write_to(&dir.path().join("b.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("mixed"), "{e}");
}

#[test]
fn errors_are_send_sync_static() {
    fn check<T: Send + Sync + 'static + std::error::Error>() {}
    check::<GgufError>();
    check::<quire::quant::QuantError>();
    // Display of values elides long arrays.
    let v = GgufValue::from((0..20u32).collect::<Vec<_>>());
    let s = v.to_string();
    assert!(s.starts_with("[0, 1,") && s.contains("(20 items)"), "{s}");
    assert_eq!(v.type_name(), "array of u32");
}
