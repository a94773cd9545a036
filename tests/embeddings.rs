//! Embeddings of the default model (`Runner::embed_with_kv`) and
//! `POST /v1/embeddings` on `quire serve`: unit vectors of the model's
//! width; the same bits alone or batched with other inputs, and in one
//! step or cut in chunks; mean and last pooling differ; the HTTP shapes,
//! base64, token-id inputs and the 400s.

mod server_util;

use quire::kv::KvManager;
use quire::runner::{Pooling, Runner, RunnerOptions};
use server_util::{default_model, http, Server};

fn norm(v: &[f32]) -> f64 {
    v.iter()
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt()
}

#[test]
fn embeddings_are_unit_vectors_batch_and_chunk_invariant() {
    let Some(path) = default_model("embeddings_are_unit_vectors_batch_and_chunk_invariant") else {
        return;
    };
    let mut r = Runner::load(
        &path,
        &RunnerOptions {
            threads: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let dim = r.config().dim;
    let vocab = r.config().vocab_size as u32;
    let mut kv = KvManager::new(r.kv.num_blocks(), r.kv.block_size()).unwrap();
    // Random-looking ids, three inputs of different lengths.
    let ids = |seed: u32, n: usize| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 40_503)) % vocab)
            .collect()
    };
    let (a, b, c) = (ids(1, 37), ids(2, 5), ids(3, 70));
    for pooling in [Pooling::Mean, Pooling::Last] {
        let all = r
            .embed_with_kv(&mut kv, &[&a, &b, &c], pooling, 512)
            .unwrap();
        assert_eq!(all.len(), 3);
        for v in &all {
            assert_eq!(v.len(), dim);
            assert!(v.iter().all(|x| x.is_finite()));
            assert!(
                (norm(v) - 1.0).abs() < 1e-5,
                "{pooling:?}: norm {}",
                norm(v)
            );
        }
        // Alone = batched, bit for bit.
        for (inp, want) in [(&a, &all[0]), (&b, &all[1]), (&c, &all[2])] {
            let one = r.embed_with_kv(&mut kv, &[inp], pooling, 512).unwrap();
            assert_eq!(&one[0], want, "{pooling:?}: alone != batched");
        }
        // Cut in chunks of 16 tokens (several steps, inputs split across
        // them) = in one step.
        let chunked = r
            .embed_with_kv(&mut kv, &[&a, &b, &c], pooling, 16)
            .unwrap();
        assert_eq!(chunked, all, "{pooling:?}: chunked != one step");
        // Every block is back.
        assert_eq!(kv.num_used_blocks(), 0);
    }
    let mean = r.embed_with_kv(&mut kv, &[&a], Pooling::Mean, 512).unwrap();
    let last = r.embed_with_kv(&mut kv, &[&a], Pooling::Last, 512).unwrap();
    assert_ne!(mean, last);
    // Different inputs give different vectors.
    let other = r.embed_with_kv(&mut kv, &[&b], Pooling::Mean, 512).unwrap();
    assert_ne!(mean, other);
    // Bad inputs are errors, and leave nothing allocated.
    assert!(r
        .embed_with_kv(&mut kv, &[&a, &[]], Pooling::Mean, 512)
        .is_err());
    let too_long = vec![1u32; r.config().context_length + 1];
    assert!(r
        .embed_with_kv(&mut kv, &[&too_long], Pooling::Mean, 512)
        .is_err());
    assert_eq!(kv.num_used_blocks(), 0);
}

fn decode_b64_f32(s: &str) -> Vec<f32> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut bytes = Vec::new();
    for q in s.as_bytes().chunks(4) {
        let pad = q.iter().filter(|&&c| c == b'=').count();
        let n = q
            .iter()
            .map(|&c| if c == b'=' { 0 } else { val(c) })
            .fold(0u32, |a, x| a << 6 | x);
        bytes.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn embeddings_endpoint() {
    let Some(srv) = Server::start("embeddings_endpoint", None, &[]) else {
        return;
    };
    let post = |body: serde_json::Value| {
        http(
            &srv.addr,
            "POST",
            "/v1/embeddings",
            &[],
            Some(&body.to_string()),
        )
    };
    let model = srv.model_id.clone();
    let r = post(serde_json::json!({
        "model": model, "input": ["The quick brown fox", "jumps over the lazy dog"]
    }));
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(j["object"], "list");
    let data = j["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let v0: Vec<f32> = serde_json::from_value(data[0]["embedding"].clone()).unwrap();
    let v1: Vec<f32> = serde_json::from_value(data[1]["embedding"].clone()).unwrap();
    assert_eq!(data[1]["index"], 1);
    assert_eq!(v0.len(), 576, "SmolLM2-135M's width");
    assert!((norm(&v0) - 1.0).abs() < 1e-4 && (norm(&v1) - 1.0).abs() < 1e-4);
    assert_ne!(v0, v1);
    assert!(j["usage"]["prompt_tokens"].as_u64().unwrap() >= 8);
    // One string alone gives the same vector (batch-invariant), and base64
    // carries the same floats.
    let r = post(serde_json::json!({
        "model": model, "input": "The quick brown fox", "encoding_format": "base64"
    }));
    assert_eq!(r.status, 200, "{}", r.body);
    let b = decode_b64_f32(r.json()["data"][0]["embedding"].as_str().unwrap());
    assert_eq!(b, v0);
    // Token ids, one list and several; last-token pooling.
    let r = post(serde_json::json!({ "model": model, "input": [1, 2, 3, 4] }));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(serde_json::json!({
        "model": model, "input": [[5, 6], [7, 8, 9]], "pooling": "last"
    }));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    // The 400s name their parameter; a wrong model is a 404.
    for (body, param) in [
        (
            serde_json::json!({ "model": model, "input": "x", "dimensions": 8 }),
            "dimensions",
        ),
        (
            serde_json::json!({ "model": model, "input": "x", "encoding_format": "hex" }),
            "encoding_format",
        ),
        (
            serde_json::json!({ "model": model, "input": "x", "pooling": "max" }),
            "pooling",
        ),
        (serde_json::json!({ "model": model, "input": [] }), "input"),
        (
            serde_json::json!({ "model": model, "input": [[]] }),
            "input",
        ),
        (
            serde_json::json!({ "model": model, "input": [999_999_999] }),
            "input",
        ),
    ] {
        let r = post(body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{body}: {}", r.body);
    }
    let r = post(serde_json::json!({ "model": "nope", "input": "x" }));
    assert_eq!(r.status, 404, "{}", r.body);
}
