//! The default model (SmolLM2-135M-Instruct Q4_1) opens and has the
//! expected header. Skipped when the model is not cached (no network use).

use quire::gguf::GgufFile;
use quire::quant::GgmlType;

#[test]
fn default_model_opens() {
    let path = quire::fetch::cache_dir()
        .join("models")
        .join(quire::fetch::DEFAULT_MODEL_FILE);
    if !path.is_file() {
        println!("SKIPPED: default model not cached at {}", path.display());
        return;
    }
    let f = GgufFile::open(&path).unwrap();
    assert!(f.version() == 2 || f.version() == 3);
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.arch().unwrap(), "llama");
    let t = f.tensor("token_embd.weight").unwrap();
    assert_eq!(t.ty, GgmlType::Q8_0);
    assert_eq!(t.dims, vec![576, 49152]);
    assert_eq!((t.cols(), t.rows()), (576, 49152));
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_u32("llama.feed_forward_length").unwrap(), 1536);
    assert_eq!(f.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );

    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.ty, GgmlType::Q4_1);
    assert_eq!(q.dims, vec![576, 576]);
    let norm = f.tensor("blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm.ty, GgmlType::F32);
    // Real weights dequantize to finite, non-constant values of weight scale.
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.29.ffn_down.weight",
    ] {
        let w = f.tensor_f32(name).unwrap();
        assert!(w.iter().all(|v| v.is_finite()), "{name}");
        let rms = (w.iter().map(|v| (v * v) as f64).sum::<f64>() / w.len() as f64).sqrt();
        assert!(rms > 1e-3 && rms < 10.0, "{name}: rms {rms}");
    }
}
