//! Decode graphs for every batch size a server forms: stepping batch sizes
//! 1 to 64 in the order a filling, draining and churning server visits
//! them, every size replays a captured graph, no capture fails and no
//! decode step falls back to running op by op, with long prompts prefilled
//! in between. The model has Llama 3's 128k vocabulary, so each size's
//! logits (0.5 MiB a row) dominate its buffers: a buffer pool keyed by
//! exact length pinned about 1 GiB across the sizes and then, past its cap
//! (filled with prefill activations), freed the buffers a capture needed.
//! Needs a CUDA device: `#[ignore]`d, run with `--ignored`
//! (scripts/gpu-check.sh).

mod common;

use common::cuda::require_device;
use quire::backend::{GpuMode, Mode};
use quire::kv::SeqId;
use quire::model::synth;
use quire::quant::GgmlType;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};

const MAX: usize = 64;

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn every_decode_batch_size_replays_a_graph() {
    require_device();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    synth::write_model(
        &path,
        synth::find_shape("tiny-llama-128k").unwrap(),
        GgmlType::Q4_0,
        7,
    )
    .unwrap();
    // Filling up, draining, then sizes in a scrambled order.
    let mut order: Vec<usize> = (1..=MAX).collect();
    order.extend((1..=MAX).rev());
    order.extend((0..MAX).map(|i| (i * 37) % MAX + 1));
    for mode in [Mode::Fast, Mode::Deterministic] {
        let mut r = Runner::load(
            &path,
            &RunnerOptions {
                gpu: GpuMode::Required,
                mode,
                kv_tokens: Some(MAX * 256 + 1024),
                ..RunnerOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("this test needs a usable CUDA device: {e:#}"));
        let vocab = r.config().vocab_size as u32;
        let seqs: Vec<SeqId> = (0..MAX).map(|i| SeqId(i as u64 + 1)).collect();
        let prompts: Vec<Vec<u32>> = (0..MAX as u32)
            .map(|i| vec![(i * 7919 + 1) % vocab, (i * 104_729 + 3) % vocab])
            .collect();
        let work: Vec<SeqWork> = seqs
            .iter()
            .zip(&prompts)
            .map(|(&seq, p)| SeqWork {
                seq,
                tokens: p,
                start_pos: 0,
                logits: LogitsWanted::None,
            })
            .collect();
        r.step(&work).unwrap();
        let mut pos = vec![2usize; MAX];
        let mut first = 0usize;
        // The third pass's (graph replays, warm-ups).
        let mut last_pass = (0u64, 0u64);
        let start = r.step_paths().expect("a device model counts its steps");
        let mut replayed = [false; MAX + 1];
        for (k, &b) in order.iter().enumerate() {
            if k % 16 == 15 {
                // A long prompt with every row's logits between decode
                // steps, as a server prefills while it decodes: 350 MiB of
                // activations through the pool.
                let seq = SeqId(1000 + k as u64);
                let long: Vec<u32> = (0..700u32).map(|i| (i * 31 + k as u32) % vocab).collect();
                r.step(&[SeqWork {
                    seq,
                    tokens: &long,
                    start_pos: 0,
                    logits: LogitsWanted::All,
                }])
                .unwrap();
                r.free(seq);
            }
            let before = r.step_paths().unwrap();
            let toks: Vec<[u32; 1]> = (0..b)
                .map(|i| [((k * 131 + i * 17) as u32) % vocab])
                .collect();
            // The step's sequences rotate through all of them, so that
            // every position stays below 128 (one split-KV bucket: each
            // size keeps one graph key over the three passes).
            let rows: Vec<usize> = (0..b).map(|i| (first + i) % MAX).collect();
            first = (first + b) % MAX;
            let work: Vec<SeqWork> = rows
                .iter()
                .zip(&toks)
                .map(|(&s, t)| SeqWork {
                    seq: seqs[s],
                    tokens: t,
                    start_pos: pos[s],
                    logits: LogitsWanted::Last,
                })
                .collect();
            let out = r.step(&work).unwrap();
            assert_eq!(
                out.len(),
                b,
                "{mode:?} batch {b}: one logits row a sequence"
            );
            for (i, &s) in rows.iter().enumerate() {
                assert!(
                    out[i].iter().all(|x| x.is_finite()),
                    "{mode:?} batch {b}: row {i} has a non-finite logit"
                );
                pos[s] += 1;
            }
            let after = r.step_paths().unwrap();
            replayed[b] |= after.graph > before.graph;
            if k >= 2 * MAX {
                last_pass.0 += after.graph - before.graph;
                last_pass.1 += after.warmup - before.warmup;
            }
        }
        let p = r.step_paths().unwrap();
        let steps = order.len() as u64;
        let why = match &r.compute {
            quire::runner::Compute::Device(d) => d.cuda().and_then(|c| c.last_capture_error()),
            _ => None,
        };
        eprintln!("{mode:?}: {p:?} over {steps} decode steps; last capture failure: {why:?}");
        assert_eq!(
            p.capture_failures, start.capture_failures,
            "{mode:?}: {p:?}; the last failure: {why:?}"
        );
        assert_eq!(
            p.eager, start.eager,
            "{mode:?}: no decode step op by op: {p:?}"
        );
        assert_eq!(
            (p.graph - start.graph) + (p.warmup - start.warmup),
            steps,
            "{mode:?}: every decode step replayed a graph or warmed one up: {p:?}"
        );
        // Every size has its graph after the first two passes (a scratch
        // arena grown by the first long prompt drops the graphs captured
        // before it, once): the third pass only replays.
        assert!(*pos.iter().max().unwrap() < 128, "positions {pos:?}");
        assert_eq!(
            last_pass,
            (MAX as u64, 0),
            "{mode:?}: the third pass's (replays, warm-ups); {p:?}"
        );
        assert!(p.warmup - start.warmup <= 2 * MAX as u64, "{mode:?}: {p:?}");
        let missing: Vec<usize> = (1..=MAX).filter(|&b| !replayed[b]).collect();
        assert!(
            missing.is_empty(),
            "{mode:?}: batch sizes that never replayed a graph: {missing:?}"
        );
    }
}
