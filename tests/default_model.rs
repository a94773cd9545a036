//! End-to-end checks on the default model (SmolLM2-135M-Instruct Q4_1).

use quire::engine::{generate, GenerateOptions};
use quire::gguf::GgufFile;
use quire::kv::SeqId;
use quire::runner::{Runner, RunnerOptions};
use quire::sampler::SamplingParams;
use quire::tokenizer::{ChatMessage, Tokenizer};

#[test]
fn answers_paris() {
    let path = quire::fetch::default_model_path().expect("default model");
    let mut r = Runner::load(&path, &RunnerOptions::default()).unwrap();
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let text = tok
        .apply_chat_template(
            &[ChatMessage {
                role: "user".into(),
                content: "What is the capital of France?".into(),
            }],
            true,
        )
        .unwrap();
    let prompt = tok.encode(&text, false, true).unwrap();
    let opts = GenerateOptions {
        max_tokens: 24,
        sampling: SamplingParams::greedy(),
        n_ubatch: 512,
        stop_ids: tok.stop_ids().to_vec(),
    };
    let (out, stats) = generate(&mut r, SeqId(0), &prompt, &opts, &mut |_| Ok(true)).unwrap();
    let answer = tok.decode(&out, true).unwrap();
    eprintln!("answer: {answer:?} ({stats:?})");
    assert!(answer.contains("Paris"), "answer was {answer:?}");
    // Blocks are freed after generation.
    assert_eq!(r.kv.num_used_blocks(), 0);
}

#[test]
fn prompt_over_context_is_an_error() {
    let path = quire::fetch::default_model_path().expect("default model");
    let mut r = Runner::load(
        &path,
        &RunnerOptions {
            kv_tokens: Some(512),
            ..Default::default()
        },
    )
    .unwrap();
    let opts = GenerateOptions {
        max_tokens: 4,
        sampling: SamplingParams::greedy(),
        n_ubatch: 512,
        stop_ids: vec![],
    };
    let prompt = vec![1u32; 9000];
    let err = generate(&mut r, SeqId(0), &prompt, &opts, &mut |_| Ok(true)).unwrap_err();
    assert!(format!("{err:#}").contains("context"), "{err:#}");
    // KV exhaustion is an error too, and leaves nothing allocated.
    let prompt = vec![1u32; 1000];
    let err = generate(&mut r, SeqId(1), &prompt, &opts, &mut |_| Ok(true)).unwrap_err();
    assert!(format!("{err:#}").contains("KV"), "{err:#}");
    assert_eq!(r.kv.num_used_blocks(), 0);
}
