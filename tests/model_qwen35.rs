//! The qwen35 hybrid graph on the cpu (Gated DeltaNet layers with a
//! recurrent state per sequence, gated attention over the paged cache):
//! the invariances the deterministic modes promise, bit for bit, on a
//! random-weight tiny model written by `quire synth` (qwen35-tiny: 3 GDN
//! layers and 1 attention layer, H_v = 2 H_k).

use quire::kv::SeqId;
use quire::quant::GgmlType;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn runner(dir: &std::path::Path, threads: usize, slots: usize) -> Runner {
    let path = dir.join("q35.gguf");
    if !path.exists() {
        let shape = quire::model::synth::find_shape("qwen35-tiny").unwrap();
        quire::model::synth::write_model(&path, shape, GgmlType::F32, 35).unwrap();
    }
    Runner::load(
        &path,
        &RunnerOptions {
            threads: Some(threads),
            kv_tokens: Some(1024),
            state_slots: slots,
            ..Default::default()
        },
    )
    .unwrap()
}

fn prompt(n: usize, seed: u64) -> Vec<u32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(0..384)).collect()
}

/// Every position's logits, feeding `toks` in chunks of `chunk`.
fn chunked(r: &mut Runner, seq: SeqId, toks: &[u32], chunk: usize) -> Vec<f32> {
    let mut out = Vec::new();
    let mut pos = 0;
    for c in toks.chunks(chunk) {
        let l = r
            .step(&[SeqWork {
                seq,
                tokens: c,
                start_pos: pos,
                logits: LogitsWanted::All,
            }])
            .unwrap();
        out.extend_from_slice(&l[0]);
        pos += c.len();
    }
    r.free(seq);
    out
}

#[test]
fn prefill_chunked_and_token_by_token_are_bitwise_equal() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = runner(dir.path(), 2, 4);
    let toks = prompt(45, 1);
    let whole = chunked(&mut r, SeqId(1), &toks, toks.len());
    assert!(whole.iter().all(|v| v.is_finite()));
    for chunk in [1, 3, 16, 17] {
        let c = chunked(&mut r, SeqId(2), &toks, chunk);
        assert!(
            c.iter()
                .zip(&whole)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "chunk {chunk}"
        );
    }
    // Thread count changes nothing either.
    let mut r1 = runner(dir.path(), 1, 4);
    assert_eq!(chunked(&mut r1, SeqId(3), &toks, 7), whole);
}

#[test]
fn a_sequence_alone_and_in_a_batch_is_bitwise_equal() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = runner(dir.path(), 2, 8);
    let a = prompt(20, 2);
    let alone = chunked(&mut r, SeqId(10), &a, a.len());
    // The same prompt beside strangers with different lengths, then decoded
    // row by row beside them.
    let others: Vec<Vec<u32>> = (0..3).map(|i| prompt(5 + 7 * i, 100 + i as u64)).collect();
    let head = 12;
    let mut work = vec![SeqWork {
        seq: SeqId(20),
        tokens: &a[..head],
        start_pos: 0,
        logits: LogitsWanted::All,
    }];
    for (i, o) in others.iter().enumerate() {
        work.push(SeqWork {
            seq: SeqId(30 + i as u64),
            tokens: o,
            start_pos: 0,
            logits: LogitsWanted::Last,
        });
    }
    let l = r.step(&work).unwrap();
    let mut batched = l[0].clone();
    for p in head..a.len() {
        let mut work = vec![SeqWork {
            seq: SeqId(20),
            tokens: &a[p..p + 1],
            start_pos: p,
            logits: LogitsWanted::All,
        }];
        for (i, o) in others.iter().enumerate() {
            work.push(SeqWork {
                seq: SeqId(30 + i as u64),
                tokens: &o[..1],
                start_pos: o.len() + p - head,
                logits: LogitsWanted::Last,
            });
        }
        batched.extend_from_slice(&r.step(&work).unwrap()[0]);
    }
    assert_eq!(batched.len(), alone.len());
    assert!(batched
        .iter()
        .zip(&alone)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn state_slots_are_reset_reused_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = runner(dir.path(), 1, 2);
    let a = prompt(10, 3);
    let first = chunked(&mut r, SeqId(1), &a, 4);
    // Freed slots come back zeroed: a later sequence gets the same bits.
    for s in 2..6 {
        assert_eq!(chunked(&mut r, SeqId(s), &a, 10), first);
    }
    // Two live sequences fill both slots; a third is refused clearly.
    for s in [7, 8] {
        r.step(&[SeqWork {
            seq: SeqId(s),
            tokens: &a[..2],
            start_pos: 0,
            logits: LogitsWanted::Last,
        }])
        .unwrap();
    }
    let err = r
        .step(&[SeqWork {
            seq: SeqId(9),
            tokens: &a[..2],
            start_pos: 0,
            logits: LogitsWanted::Last,
        }])
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("no free recurrent state slot"),
        "{err:#}"
    );
    // A sequence cannot resume without its state.
    r.free(SeqId(7));
    let err = r
        .step(&[SeqWork {
            seq: SeqId(7),
            tokens: &a[2..3],
            start_pos: 2,
            logits: LogitsWanted::Last,
        }])
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("without a recurrent state"),
        "{err:#}"
    );
}

fn collect(rx: &mut tokio::sync::mpsc::UnboundedReceiver<quire::serve::Event>) -> Vec<u32> {
    let mut toks = Vec::new();
    loop {
        match rx.blocking_recv().expect("the engine dropped the request") {
            quire::serve::Event::Token { token, .. } => toks.push(token),
            quire::serve::Event::Finished { .. } => return toks,
            quire::serve::Event::Error { message, .. } => panic!("{message}"),
        }
    }
}

/// Serving a hybrid: 24 concurrent greedy requests (more than the 4 state
/// slots, so slots are reused, and under a tight KV pool, so some are
/// preempted and recomputed) each produce the tokens they produce alone.
#[test]
fn serving_a_hybrid_matches_one_request_at_a_time() {
    use quire::sampler::SamplingParams;
    use quire::serve::{EngineConfig, GenRequest};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q35.gguf");
    let shape = quire::model::synth::find_shape("qwen35-tiny").unwrap();
    quire::model::synth::write_model(&path, shape, GgmlType::F32, 35).unwrap();
    let opts = RunnerOptions {
        threads: Some(2),
        kv_tokens: Some(64),
        block_size: 16,
        state_slots: 4,
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = (0..24)
        .map(|i| prompt(10 + i % 13, 500 + i as u64))
        .collect();
    let req = |p: &Vec<u32>| GenRequest {
        prompt: p.clone(),
        params: SamplingParams::greedy(),
        max_tokens: 12,
        stop_ids: vec![],
        top_logprobs: None,
        n: 1,
        adjust: Default::default(),
        grammar: None,
    };
    let alone: Vec<Vec<u32>> = {
        let (engine, join) =
            quire::serve::spawn(Runner::load(&path, &opts).unwrap(), EngineConfig::default())
                .unwrap();
        let out = prompts
            .iter()
            .map(|p| collect(&mut engine.submit(req(p)).unwrap().events))
            .collect();
        drop(engine);
        join.join().unwrap();
        out
    };
    let (engine, join) =
        quire::serve::spawn(Runner::load(&path, &opts).unwrap(), EngineConfig::default()).unwrap();
    let mut handles: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(req(p)).unwrap())
        .collect();
    for (i, h) in handles.iter_mut().enumerate() {
        assert_eq!(collect(&mut h.events), alone[i], "request {i}");
    }
    assert!(
        engine.metrics.snapshot().preemptions_total > 0,
        "no preemption happened"
    );
    // n = 3 greedy choices of one prompt (this runner keeps no state
    // snapshots, so siblings prefill themselves): each is the prompt's
    // tokens alone.
    let mut h = engine
        .submit(GenRequest {
            n: 3,
            ..req(&prompts[5])
        })
        .unwrap();
    let mut choices = vec![Vec::new(); 3];
    let mut done = 0;
    while done < 3 {
        match h
            .events
            .blocking_recv()
            .expect("the engine dropped the request")
        {
            quire::serve::Event::Token { index, token, .. } => choices[index].push(token),
            quire::serve::Event::Finished { .. } => done += 1,
            quire::serve::Event::Error { message, .. } => panic!("{message}"),
        }
    }
    for c in &choices {
        assert_eq!(c, &alone[5]);
    }
    // Blocks return as the engine reaps the finished sequences.
    let t0 = std::time::Instant::now();
    while engine.metrics.snapshot().kv_blocks_used != 0 {
        assert!(t0.elapsed().as_secs() < 10, "KV blocks were not returned");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(handles);
    drop(engine);
    join.join().unwrap();
}

/// State snapshots and forks on the runner: a sequence resumed from a
/// snapshot of another's state at position 32 (with that prefix's KV
/// blocks forked) gives the logits of computing it from scratch, bit for
/// bit; a forked child continues exactly as its parent would.
#[test]
fn snapshot_restore_and_fork_are_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q35.gguf");
    let shape = quire::model::synth::find_shape("qwen35-tiny").unwrap();
    quire::model::synth::write_model(&path, shape, GgmlType::F32, 35).unwrap();
    let mut r = Runner::load(
        &path,
        &RunnerOptions {
            threads: Some(2),
            kv_tokens: Some(1024),
            state_slots: 4,
            state_snapshots: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(r.state_snapshots(), 2);
    let p = prompt(48, 77);
    let want = chunked(&mut r, SeqId(9), &p, 48);
    let (a, b, c) = (SeqId(1), SeqId(2), SeqId(3));
    let step = |r: &mut Runner, seq, toks: &[u32], pos| {
        r.step(&[SeqWork {
            seq,
            tokens: toks,
            start_pos: pos,
            logits: LogitsWanted::All,
        }])
        .unwrap()
        .remove(0)
    };
    step(&mut r, a, &p[..32], 0);
    r.save_state(a, 1).unwrap();
    // Scribble on a's state past the snapshot, then free it.
    step(&mut r, a, &p[40..44], 32);
    r.free(a);
    // b: the KV of positions 0..32 (recomputed here; the serving engine
    // takes them from the prefix cache), the state from the snapshot.
    step(&mut r, b, &p[..32], 0);
    r.restore_state(b, 1).unwrap();
    let got = step(&mut r, b, &p[32..], 32);
    let v = 384;
    assert_eq!(
        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want[32 * v..]
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        "resumed from a snapshot"
    );
    // Fork: c gets b's blocks and state at 48; both step the same token.
    r.kv.fork(b, c).unwrap();
    r.fork_state(b, c).unwrap();
    let lb = step(&mut r, b, &[5], 48);
    let lc = step(&mut r, c, &[5], 48);
    assert_eq!(
        lb.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        lc.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "a forked child continues as its parent"
    );
    assert!(
        r.restore_state(c, 2).is_err(),
        "snapshot 2 of 2 is out of range"
    );
}

/// Serving a hybrid with prefix caching: a second request sharing a
/// 96-token prefix resumes from a state snapshot (prefix hits counted) and
/// produces the tokens it produces alone.
#[test]
fn serving_a_hybrid_resumes_cached_prefixes_from_snapshots() {
    use quire::sampler::SamplingParams;
    use quire::serve::{EngineConfig, GenRequest};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q35.gguf");
    let shape = quire::model::synth::find_shape("qwen35-tiny").unwrap();
    quire::model::synth::write_model(&path, shape, GgmlType::F32, 35).unwrap();
    let opts = RunnerOptions {
        threads: Some(2),
        kv_tokens: Some(1024),
        block_size: 16,
        state_slots: 4,
        state_snapshots: 4,
        ..Default::default()
    };
    let cfg = EngineConfig {
        state_snapshot_stride: 32,
        ..EngineConfig::default()
    };
    let first = prompt(100, 1);
    let mut second = first[..96].to_vec();
    second.extend(prompt(9, 2));
    let req = |p: &Vec<u32>| GenRequest {
        prompt: p.clone(),
        params: SamplingParams::greedy(),
        max_tokens: 10,
        stop_ids: vec![],
        top_logprobs: None,
        n: 1,
        adjust: Default::default(),
        grammar: None,
    };
    let alone = {
        let no_cache = EngineConfig {
            prefix_caching: false,
            ..cfg.clone()
        };
        let (engine, join) =
            quire::serve::spawn(Runner::load(&path, &opts).unwrap(), no_cache).unwrap();
        let out = collect(&mut engine.submit(req(&second)).unwrap().events);
        assert_eq!(engine.metrics.snapshot().prefix_hit_tokens, 0);
        drop(engine);
        join.join().unwrap();
        out
    };
    let (engine, join) = quire::serve::spawn(Runner::load(&path, &opts).unwrap(), cfg).unwrap();
    collect(&mut engine.submit(req(&first)).unwrap().events);
    let got = collect(&mut engine.submit(req(&second)).unwrap().events);
    assert_eq!(got, alone, "resumed from a snapshot");
    let t0 = std::time::Instant::now();
    while engine.metrics.snapshot().prefix_hit_tokens < 96 {
        assert!(t0.elapsed().as_secs() < 10, "no prefix hit of 96 tokens");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(engine);
    join.join().unwrap();
}
