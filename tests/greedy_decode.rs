//! `Runner::decode_greedy` and `decode_sampled_batch` on the CPU (the host
//! path; the device path is
//! checked on a GPU by `quire check-greedy`): the tokens of stepping and
//! sampling greedily by hand, `on_token` ending the run, and the sequence
//! usable again afterwards.

use quire::kv::SeqId;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use quire::sampler::{Sampler, SamplingParams};

fn runner() -> Runner {
    let path = quire::fetch::default_model_path().expect("default model");
    Runner::load(
        &path,
        &RunnerOptions {
            threads: Some(2),
            ..Default::default()
        },
    )
    .expect("loading the default model")
}

/// Prefills `prompt` minus its last token into `seq`.
fn prefill(r: &mut Runner, seq: SeqId, prompt: &[u32]) {
    r.step(&[SeqWork {
        seq,
        tokens: &prompt[..prompt.len() - 1],
        start_pos: 0,
        logits: LogitsWanted::None,
    }])
    .unwrap();
}

#[test]
fn greedy_matches_stepping_by_hand_and_stops_on_request() {
    let mut r = runner();
    let prompt: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 5046, 30];
    let (p, last) = (prompt.len() - 1, prompt[prompt.len() - 1]);
    let n = 12;

    // By hand: one step, then the sampler's greedy choice.
    prefill(&mut r, SeqId(1), &prompt);
    let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let (mut want, mut tok) = (Vec::new(), last);
    for i in 0..n {
        let l = r
            .step(&[SeqWork {
                seq: SeqId(1),
                tokens: &[tok],
                start_pos: p + i,
                logits: LogitsWanted::Last,
            }])
            .unwrap();
        tok = sampler.sample(&l[0], &[]).unwrap();
        want.push(tok);
    }
    r.free(SeqId(1));

    prefill(&mut r, SeqId(2), &prompt);
    let mut seen = Vec::new();
    let got = r
        .decode_greedy(SeqId(2), last, p, n, &mut |t| {
            seen.push(t);
            Ok(true)
        })
        .unwrap();
    r.free(SeqId(2));
    assert_eq!(got, want);
    assert_eq!(seen, want);
    // Not a constant stream: the check can fail.
    assert!(want.iter().any(|&t| t != want[0]), "{want:?}");

    // on_token ends the run: exactly the tokens it received.
    prefill(&mut r, SeqId(3), &prompt);
    let mut calls = 0;
    let got = r
        .decode_greedy(SeqId(3), last, p, n, &mut |_| {
            calls += 1;
            Ok(calls < 3)
        })
        .unwrap();
    assert_eq!(got, want[..3]);
    assert_eq!(calls, 3);
    r.free(SeqId(3));

    // An error from on_token comes back, and a later run is unaffected.
    prefill(&mut r, SeqId(4), &prompt);
    let e = r
        .decode_greedy(SeqId(4), last, p, n, &mut |_| anyhow::bail!("client gone"))
        .unwrap_err();
    assert!(format!("{e:#}").contains("client gone"), "{e:#}");
    r.free(SeqId(4));
    prefill(&mut r, SeqId(5), &prompt);
    let got = r
        .decode_greedy(SeqId(5), last, p, 4, &mut |_| Ok(true))
        .unwrap();
    assert_eq!(got, want[..4]);
}

#[test]
fn greedy_past_the_context_is_an_error() {
    let mut r = runner();
    let ctx = r.config().context_length;
    let e = r
        .decode_greedy(SeqId(9), 1, ctx, 1, &mut |_| Ok(true))
        .unwrap_err();
    assert!(format!("{e:#}").contains("context length"), "{e:#}");
}

#[test]
fn greedy_batch_rows_match_each_sequence_alone() {
    let mut r = runner();
    let a: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 5046, 30];
    let b: Vec<u32> = vec![1, 9690, 28, 1691, 8801, 1390, 43];
    let n = 6;
    let mut alone = Vec::new();
    for (i, p) in [&a, &b].into_iter().enumerate() {
        let seq = SeqId(20 + i as u64);
        prefill(&mut r, seq, p);
        alone.push(
            r.decode_greedy(seq, p[p.len() - 1], p.len() - 1, n, &mut |_| Ok(true))
                .unwrap(),
        );
        r.free(seq);
    }
    assert_ne!(alone[0], alone[1]);
    let seqs = [SeqId(30), SeqId(31)];
    prefill(&mut r, seqs[0], &a);
    prefill(&mut r, seqs[1], &b);
    let mut steps = 0;
    let got = r
        .decode_greedy_batch(
            &seqs,
            &[a[a.len() - 1], b[b.len() - 1]],
            &[a.len() - 1, b.len() - 1],
            n,
            &mut |t| {
                assert_eq!(t.len(), 2);
                steps += 1;
                Ok(true)
            },
        )
        .unwrap();
    assert_eq!(steps, n);
    assert_eq!(got, alone);
    // Mismatched inputs are an error, not a panic.
    assert!(r
        .decode_greedy_batch(&seqs, &[1], &[9, 9], 1, &mut |_| Ok(true))
        .is_err());
}

/// Sampled rows (no repetition penalty) through `decode_sampled_batch`:
/// the tokens of stepping by hand with samplers of the same seeds, and a
/// sampler's stream continued with pre-drawn uniforms (the server's
/// fallback) the same as drawing them in `sample`.
#[test]
fn sampled_batch_matches_stepping_by_hand() {
    let mut r = runner();
    let prompts: [Vec<u32>; 2] = [
        vec![1, 504, 3458, 282, 4649, 314, 5046, 30],
        vec![1, 2683, 314, 253, 1345, 30],
    ];
    let params = [
        SamplingParams {
            temperature: 1.2,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repeat_last_n: 0,
            seed: 7,
        },
        SamplingParams {
            seed: 8,
            repetition_penalty: 1.0,
            ..SamplingParams::default()
        },
    ];
    let n = 10;
    let mut want = vec![Vec::new(), Vec::new()];
    for (k, prompt) in prompts.iter().enumerate() {
        let seq = SeqId(10 + k as u64);
        prefill(&mut r, seq, prompt);
        let mut s = Sampler::new(params[k]).unwrap();
        let (p, mut tok) = (prompt.len() - 1, prompt[prompt.len() - 1]);
        for i in 0..n {
            let l = r
                .step(&[SeqWork {
                    seq,
                    tokens: &[tok],
                    start_pos: p + i,
                    logits: LogitsWanted::Last,
                }])
                .unwrap();
            // Every other step with the uniform drawn first.
            tok = if i % 2 == 0 {
                s.sample(&l[0], &[]).unwrap()
            } else {
                let u = s.next_uniform();
                s.sample_with(&l[0], &[], Some(u)).unwrap()
            };
            want[k].push(tok);
        }
        r.free(seq);
    }
    let seqs = [SeqId(20), SeqId(21)];
    for (s, p) in seqs.iter().zip(&prompts) {
        prefill(&mut r, *s, p);
    }
    let mut samplers: Vec<Sampler> = params.iter().map(|p| Sampler::new(*p).unwrap()).collect();
    let firsts: Vec<u32> = prompts.iter().map(|p| p[p.len() - 1]).collect();
    let starts: Vec<usize> = prompts.iter().map(|p| p.len() - 1).collect();
    let got = r
        .decode_sampled_batch(&seqs, &firsts, &starts, n, &mut samplers, &mut |_| Ok(true))
        .unwrap();
    assert_eq!(got, want);
    // The draws really are random: not the greedy tokens.
    assert!(want[0].iter().any(|&t| t != want[0][0]), "{want:?}");
    // A repetition penalty reads the history: not chained.
    let mut pen = vec![Sampler::new(SamplingParams {
        repetition_penalty: 1.1,
        repeat_last_n: 8,
        ..params[0]
    })
    .unwrap()];
    assert!(r
        .decode_sampled_batch(
            &seqs[..1],
            &firsts[..1],
            &starts[..1],
            2,
            &mut pen,
            &mut |_| Ok(true)
        )
        .is_err());
}
