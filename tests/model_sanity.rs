//! Issue 59 F11: nonsense in a model file is a load error naming the key
//! and the value (float hyper-parameters, counts, token types, merges,
//! vocabulary sizes), and non-finite logits end the request that produced
//! them with an error instead of a silent stop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use quire::gguf::{GgufFile, GgufValue, GgufWriter};
use quire::model::{synth, LlamaModel, ModelConfig};
use quire::quant::GgmlType;
use quire::runner::{Runner, RunnerOptions};
use quire::sampler::SamplingParams;
use quire::serve::{EngineConfig, Event, GenRequest};
use quire::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The tiny synthetic llama (F32 weights, so a NaN weight reaches the
/// logits without an activation quantization in between).
fn base(dir: &Path) -> PathBuf {
    let p = dir.join("base.gguf");
    if !p.exists() {
        let shape = synth::find_shape("tiny-llama").unwrap();
        synth::write_model(&p, shape, GgmlType::F32, 7).unwrap();
    }
    p
}

/// A copy of the base model with metadata `key` set to `value` (None:
/// removed) and tensor data changed by `edit(name, f32 values)`.
fn variant(
    dir: &Path,
    key: &str,
    value: Option<GgufValue>,
    edit: &dyn Fn(&str, &mut [f32]),
) -> PathBuf {
    let g = GgufFile::open(&base(dir)).unwrap();
    let mut w = GgufWriter::new();
    let mut seen = false;
    for (k, v) in g.metadata() {
        if k == key {
            seen = true;
            if let Some(nv) = &value {
                w.add_kv(k.clone(), nv.clone());
            }
        } else {
            w.add_kv(k.clone(), v.clone());
        }
    }
    if !seen {
        if let Some(nv) = value {
            w.add_kv(key.to_string(), nv);
        }
    }
    for t in g.tensors() {
        assert_eq!(t.ty, GgmlType::F32);
        let mut x: Vec<f32> = g
            .data_of(t)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        edit(&t.name, &mut x);
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.add_tensor(t.name.clone(), &t.dims, t.ty, bytes).unwrap();
    }
    let p = dir.join(format!("case-{}.gguf", rand::rng().random::<u64>()));
    w.write_to(&p).unwrap();
    p
}

fn with_kv(dir: &Path, key: &str, value: GgufValue) -> GgufFile {
    GgufFile::open(&variant(dir, key, Some(value), &|_, _| {})).unwrap()
}

/// Config and weights, as the runner loads them.
fn load(g: &GgufFile) -> anyhow::Result<()> {
    let cfg = ModelConfig::from_gguf(g)?;
    LlamaModel::load(g, cfg, &|_, _| {})?;
    Ok(())
}

fn load_err(g: &GgufFile) -> String {
    format!("{:#}", load(g).expect_err("the model loaded"))
}

#[test]
fn float_hyperparameters_must_be_finite_and_positive() {
    let dir = tempfile::tempdir().unwrap();
    for key in [
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
    ] {
        for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0, 0.0, -0.0] {
            let msg = load_err(&with_kv(dir.path(), key, GgufValue::F32(v)));
            assert!(
                msg.contains(key) && msg.contains(&v.to_string()) && msg.contains("expected"),
                "{key} = {v}: {msg}"
            );
        }
        // F64 values that do not fit f32 are infinite once read.
        let msg = load_err(&with_kv(dir.path(), key, GgufValue::F64(1e300)));
        assert!(msg.contains(key) && msg.contains("inf"), "{msg}");
    }
    // An epsilon of 1 or more is not a small stabilizer.
    let key = "llama.attention.layer_norm_rms_epsilon";
    let msg = load_err(&with_kv(dir.path(), key, GgufValue::F32(3.0)));
    assert!(msg.contains(key) && msg.contains('3'), "{msg}");
    // Reasonable random values still load.
    let mut rng = ChaCha8Rng::seed_from_u64(59);
    for _ in 0..3 {
        let base = rng.random_range(100.0f32..1e6);
        load(&with_kv(
            dir.path(),
            "llama.rope.freq_base",
            GgufValue::F32(base),
        ))
        .unwrap();
        let eps = rng.random_range(1e-7f32..1e-3);
        load(&with_kv(dir.path(), key, GgufValue::F32(eps))).unwrap();
    }
}

#[test]
fn rope_frequency_divisors_must_be_finite_and_positive() {
    let dir = tempfile::tempdir().unwrap();
    let g = GgufFile::open(&base(dir.path())).unwrap();
    let half = ModelConfig::from_gguf(&g).unwrap().rope_dim / 2;
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for bad in [f32::NAN, 0.0, -2.0, f32::INFINITY] {
        let at = rng.random_range(0..half);
        let mut factors: Vec<f32> = (0..half).map(|_| rng.random_range(1.0f32..8.0)).collect();
        let ok = add_tensor(dir.path(), &g, "rope_freqs.weight", &factors);
        load(&GgufFile::open(&ok).unwrap()).unwrap();
        factors[at] = bad;
        let p = add_tensor(dir.path(), &g, "rope_freqs.weight", &factors);
        let msg = load_err(&GgufFile::open(&p).unwrap());
        assert!(
            msg.contains(&format!("rope_freqs.weight[{at}]")) && msg.contains(&bad.to_string()),
            "{bad}: {msg}"
        );
    }
}

/// `g`'s file plus one F32 tensor.
fn add_tensor(dir: &Path, g: &GgufFile, name: &str, x: &[f32]) -> PathBuf {
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_kv(k.clone(), v.clone());
    }
    for t in g.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.ty, g.data_of(t).to_vec())
            .unwrap();
    }
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.add_tensor(name.to_string(), &[x.len() as u64], GgmlType::F32, bytes)
        .unwrap();
    let p = dir.join(format!("plus-{}.gguf", rand::rng().random::<u64>()));
    w.write_to(&p).unwrap();
    p
}

#[test]
fn zero_and_inconsistent_counts_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for key in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.attention.key_length",
        "llama.feed_forward_length",
        "llama.context_length",
        "llama.rope.dimension_count",
    ] {
        let msg = load_err(&with_kv(dir.path(), key, GgufValue::U32(0)));
        assert!(msg.contains(key) && msg.contains(" 0"), "{key}: {msg}");
    }
    // 4 heads over 3 kv heads.
    let msg = load_err(&with_kv(
        dir.path(),
        "llama.attention.head_count_kv",
        GgufValue::U32(3),
    ));
    assert!(
        msg.contains("llama.attention.head_count_kv") && msg.contains("multiple"),
        "{msg}"
    );
    // Values of another size than keys.
    let msg = load_err(&with_kv(
        dir.path(),
        "llama.attention.value_length",
        GgufValue::U32(32),
    ));
    assert!(
        msg.contains("llama.attention.value_length") && msg.contains("32"),
        "{msg}"
    );
    // Counts that disagree with the tensors' shapes.
    for (key, v) in [
        ("llama.embedding_length", 128),
        ("llama.feed_forward_length", 1024),
        ("llama.attention.key_length", 32),
        ("llama.attention.head_count", 8),
    ] {
        let msg = load_err(&with_kv(dir.path(), key, GgufValue::U32(v)));
        assert!(
            msg.contains("expected") || msg.contains(key),
            "{key}: {msg}"
        );
    }
}

fn tokenizer_err(g: &GgufFile) -> String {
    format!(
        "{:#}",
        Tokenizer::from_gguf(g).expect_err("the tokenizer built")
    )
}

fn base_array(dir: &Path, key: &str) -> Vec<GgufValue> {
    let g = GgufFile::open(&base(dir)).unwrap();
    g.get(key).unwrap().as_array().unwrap().to_vec()
}

#[test]
fn garbage_token_types_name_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let key = "tokenizer.ggml.token_type";
    let types = base_array(dir.path(), key);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for bad in [7i32, -1, 1000, i32::MIN] {
        let at = rng.random_range(0..types.len());
        let mut t = types.clone();
        t[at] = GgufValue::I32(bad);
        let msg = tokenizer_err(&with_kv(dir.path(), key, GgufValue::Array(t)));
        assert!(
            msg.contains(&format!("{key}[{at}]")) && msg.contains(&bad.to_string()),
            "{bad} at {at}: {msg}"
        );
    }
    // One type short.
    let mut t = types.clone();
    t.pop();
    let msg = tokenizer_err(&with_kv(dir.path(), key, GgufValue::Array(t)));
    assert!(
        msg.contains(key) && msg.contains(&(types.len() - 1).to_string()),
        "{msg}"
    );
    // Strings instead of integers.
    let t: Vec<GgufValue> = types
        .iter()
        .map(|_| GgufValue::String("x".into()))
        .collect();
    let msg = tokenizer_err(&with_kv(dir.path(), key, GgufValue::Array(t)));
    assert!(msg.contains(key) && msg.contains("index 0"), "{msg}");
    // Floats instead of integers.
    let t: Vec<GgufValue> = types.iter().map(|_| GgufValue::F32(1.0)).collect();
    let msg = tokenizer_err(&with_kv(dir.path(), key, GgufValue::Array(t)));
    assert!(msg.contains(key) && msg.contains("index 0"), "{msg}");
    // Every known type value builds.
    let t: Vec<GgufValue> = (0..types.len())
        .map(|i| GgufValue::I32(if i < 256 { 1 } else { rng.random_range(0..=6) }))
        .collect();
    Tokenizer::from_gguf(&with_kv(dir.path(), key, GgufValue::Array(t))).unwrap();
}

#[test]
fn empty_merges_of_a_bpe_tokenizer_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let key = "tokenizer.ggml.merges";
    let msg = tokenizer_err(&with_kv(dir.path(), key, GgufValue::Array(vec![])));
    assert!(msg.contains(key) && msg.contains("empty"), "{msg}");
}

#[test]
fn vocabulary_sizes_and_special_ids_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let key = "tokenizer.ggml.tokens";
    let tokens = base_array(dir.path(), key);
    let n = tokens.len();
    // One token more, and one fewer, than token_embd.weight has rows.
    let mut more = tokens.clone();
    more.push(GgufValue::String("<extra>".into()));
    let mut fewer = tokens.clone();
    fewer.pop();
    for (t, len) in [(more, n + 1), (fewer, n - 1)] {
        let g = with_kv(dir.path(), key, GgufValue::Array(t));
        let msg = load_err(&g);
        assert!(
            msg.contains(key) && msg.contains(&len.to_string()) && msg.contains(&n.to_string()),
            "{msg}"
        );
    }
    for id_key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
        for id in [n as u32, u32::MAX] {
            let msg = tokenizer_err(&with_kv(dir.path(), id_key, GgufValue::U32(id)));
            assert!(
                msg.contains(id_key) && msg.contains(&id.to_string()),
                "{msg}"
            );
        }
    }
}

/// Events of one choice until it ends: its tokens and the last event.
fn collect(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<u32>, Event) {
    let mut toks = Vec::new();
    loop {
        let ev = rx.blocking_recv().expect("the engine dropped the request");
        match ev {
            Event::Token { token, .. } => toks.push(token),
            other => return (toks, other),
        }
    }
}

/// A NaN in one token's embedding row makes every sequence that reads the
/// token produce NaN logits: that request gets an error naming the
/// position, the others run to their end, and the failed sequence's KV
/// blocks return to the pool.
#[test]
fn nan_logits_end_that_request_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let g = GgufFile::open(&base(dir.path())).unwrap();
    let dim = ModelConfig::from_gguf(&g).unwrap().dim;
    let poisoned = 300u32;
    let p = variant(dir.path(), "general.name", None, &|name, x| {
        if name == "token_embd.weight" {
            let row = poisoned as usize * dim;
            x[row + 17] = f32::NAN;
        }
    });
    let opts = RunnerOptions {
        threads: Some(2),
        ..Default::default()
    };
    let runner = Runner::load(&p, &opts).unwrap();
    let (engine, join) = quire::serve::spawn(runner, EngineConfig::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut prompt = || -> Vec<u32> { (0..6).map(|_| rng.random_range(0..256)).collect() };
    // The poisoned token is a stop token, so a healthy sequence that picks
    // it ends instead of reading its row.
    let req = |prompt: Vec<u32>, params: SamplingParams| GenRequest {
        prompt,
        params,
        max_tokens: 6,
        stop_ids: vec![poisoned],
        top_logprobs: None,
        n: 1,
        adjust: Default::default(),
        grammar: None,
    };
    let sampled = SamplingParams {
        seed: 9,
        ..Default::default()
    };
    for params in [SamplingParams::greedy(), sampled] {
        let (good1, good2) = (prompt(), prompt());
        let mut bad = prompt();
        bad[3] = poisoned;
        let mut h_good1 = engine.submit(req(good1, params)).unwrap();
        let mut h_bad = engine.submit(req(bad.clone(), params)).unwrap();
        let mut h_good2 = engine.submit(req(good2, params)).unwrap();
        let (toks, last) = collect(&mut h_bad.events);
        assert!(toks.is_empty(), "{toks:?}");
        match last {
            Event::Error { index, message } => {
                assert_eq!(index, 0);
                assert!(
                    message.contains(&format!("NaN logits at position {}", bad.len())),
                    "{message}"
                );
            }
            other => panic!("expected an error, got {other:?}"),
        }
        for h in [&mut h_good1, &mut h_good2] {
            let (toks, last) = collect(&mut h.events);
            match last {
                Event::Finished {
                    completion_tokens, ..
                } => assert!(completion_tokens <= 6 && completion_tokens >= toks.len()),
                other => panic!("a healthy request ended with {other:?}"),
            }
        }
    }
    // Every sequence ended: no block is held.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while engine.metrics.snapshot().kv_blocks_used != 0 {
        assert!(std::time::Instant::now() < deadline, "blocks still held");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(engine);
    join.join().unwrap();
}

/// `quire run` on the same model: the NaN is an error naming the position,
/// with a non-zero exit, not an end of generation.
#[test]
fn quire_run_fails_on_nan_logits() {
    let dir = tempfile::tempdir().unwrap();
    let g = GgufFile::open(&base(dir.path())).unwrap();
    let dim = ModelConfig::from_gguf(&g).unwrap().dim;
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let at = rng.random_range(0..dim);
    let p = variant(dir.path(), "general.name", None, &|name, x| {
        if name == "output_norm.weight" {
            x[at] = f32::NAN;
        }
    });
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
        .args([
            "run",
            "--raw",
            "-p",
            "hello",
            "--temperature",
            "0",
            "-t",
            "2",
            "-m",
        ])
        .arg(&p)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // "hello" is 5 byte-level tokens (no merge applies, no BOS).
    assert!(stderr.contains("NaN logits at position 5"), "{stderr}");
}

/// One HTTP/1.1 request to `addr` (the connection closes after it):
/// the status and the body.
fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// `quire serve` on a model whose logits are NaN: a completion answers 500
/// with OpenAI's error object, a streamed one an error event, both naming
/// the position.
#[test]
fn serve_answers_nan_logits_with_an_error() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let g = GgufFile::open(&base(dir.path())).unwrap();
    let dim = ModelConfig::from_gguf(&g).unwrap().dim;
    let at = ChaCha8Rng::seed_from_u64(8).random_range(0..dim);
    let p = variant(dir.path(), "general.name", None, &|name, x| {
        if name == "output_norm.weight" {
            x[at] = f32::NAN;
        }
    });
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "-t",
            "2",
            "--model",
        ])
        .arg(&p)
        .env_remove("QUIRE_API_KEY")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let _ = tx.send(rest.trim().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(120));
    let result = std::panic::catch_unwind(|| {
        let addr = addr.expect("quire serve did not start");
        let model = p.file_stem().unwrap().to_string_lossy();
        let req = format!(
            r#"{{"model": "{model}", "prompt": "hello", "max_tokens": 4, "temperature": 0}}"#
        );
        let (status, body) = post(&addr, "/v1/completions", &req);
        assert_eq!(status, 500, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("NaN logits at position 5"), "{body}");
        let req = req.replace("\"temperature\"", "\"stream\": true, \"temperature\"");
        let (status, body) = post(&addr, "/v1/completions", &req);
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains("\"error\"") && body.contains("NaN logits at position 5"),
            "{body}"
        );
    });
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
