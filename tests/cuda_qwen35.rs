//! Hybrid (qwen35, Gated DeltaNet) models on the device: `exact` logits
//! bitwise equal to the cpu over prefill and 256 decode steps (graphs
//! replayed); `deterministic` batch-invariant for B in {1, 8, 33},
//! chunk-invariant and run-to-run; the fused recurrent-state paths bitwise
//! equal to the unfused ones; `fast` reproducible and close to the cpu.
//! They need a CUDA device: `#[ignore]`d, run with `--ignored` (as
//! scripts/gpu-check.sh does), they fail without a usable one.

mod common;

use common::cuda::require_device;
use quire::backend::cuda::TuningOverrides;
use quire::backend::{GpuMode, Mode};
use quire::kv::SeqId;
use quire::model::synth;
use quire::quant::GgmlType;
use quire::runner::{Compute, LogitsWanted, Runner, RunnerOptions, SeqWork};
use std::path::{Path, PathBuf};

fn toks(seed: u32, n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 40_503)) % vocab)
        .collect()
}

fn opts(mode: Mode, gpu: GpuMode) -> RunnerOptions {
    RunnerOptions {
        threads: Some(2),
        kv_tokens: Some(4096),
        block_size: 16,
        mode,
        gpu,
        state_slots: 40,
        ..RunnerOptions::default()
    }
}

fn model(dir: &Path, shape: &str, ty: GgmlType) -> PathBuf {
    let path = dir.join(format!("{shape}-{ty:?}.gguf"));
    synth::write_model(&path, synth::find_shape(shape).unwrap(), ty, 17).unwrap();
    path
}

fn on_device(path: &Path, o: RunnerOptions) -> Runner {
    let r = Runner::load(path, &o)
        .unwrap_or_else(|e| panic!("this test needs a usable CUDA device: --gpu required: {e:#}"));
    assert!(
        matches!(r.compute, Compute::Device(_)),
        "--gpu required must put the model on the device"
    );
    r
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Three sequences prefilled together in chunks of 16 (so slots' rows sit
/// side by side in one step), then `steps` decode steps of all three fed
/// the cpu's greedy tokens: every logit of every step bitwise equal.
fn exact_scenario(gpu: &mut Runner, cpu: &mut Runner, steps: usize, what: &str) {
    let vocab = gpu.config().vocab_size as u32;
    let seqs = [SeqId(1), SeqId(2), SeqId(3)];
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| toks(i + 1, 37 + 5 * i as usize, vocab))
        .collect();
    let mut next = [0u32; 3];
    let mut pos = 0;
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    while pos < longest {
        let mut work = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            if pos < p.len() {
                let end = (pos + 16).min(p.len());
                work.push(SeqWork {
                    seq: seqs[i],
                    tokens: &p[pos..end],
                    start_pos: pos,
                    logits: LogitsWanted::Last,
                });
            }
        }
        let g = gpu.step(&work).unwrap();
        let c = cpu.step(&work).unwrap();
        for (k, (gl, cl)) in g.iter().zip(&c).enumerate() {
            assert_eq!(bits(gl), bits(cl), "{what}: prefill at {pos}, item {k}");
        }
        for (k, w) in work.iter().enumerate() {
            let i = seqs.iter().position(|&s| s == w.seq).unwrap();
            if w.start_pos + w.tokens.len() == prompts[i].len() {
                next[i] = argmax(&c[k]);
            }
        }
        pos += 16;
    }
    for t in 0..steps {
        let toks: Vec<[u32; 1]> = next.iter().map(|&x| [x]).collect();
        let work: Vec<SeqWork<'_>> = (0..3)
            .map(|i| SeqWork {
                seq: seqs[i],
                tokens: &toks[i],
                start_pos: prompts[i].len() + t,
                logits: LogitsWanted::Last,
            })
            .collect();
        let g = gpu.step(&work).unwrap();
        let c = cpu.step(&work).unwrap();
        for i in 0..3 {
            assert_eq!(
                bits(&g[i]),
                bits(&c[i]),
                "{what}: decode step {t}, sequence {i}"
            );
            next[i] = argmax(&c[i]);
        }
    }
    for s in seqs {
        gpu.free(s);
        cpu.free(s);
    }
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn qwen35_exact_device_is_bitwise_equal_to_cpu_for_256_steps() {
    require_device();
    let dir = tempfile::tempdir().unwrap();
    for (shape, ty, steps) in [
        ("qwen35-small", GgmlType::Q4_0, 256),
        ("qwen35-small", GgmlType::Q8_0, 64),
        ("qwen35-tiny", GgmlType::F16, 64),
    ] {
        let path = model(dir.path(), shape, ty);
        let mut cpu = Runner::load(&path, &opts(Mode::Exact, GpuMode::Off)).unwrap();
        let mut gpu = on_device(&path, opts(Mode::Exact, GpuMode::Required));
        exact_scenario(&mut gpu, &mut cpu, steps, &format!("{shape} {ty:?}"));
        // The unfused state paths (gather, out-of-place op, scatter): the
        // same bits.
        let unfused = RunnerOptions {
            tuning: TuningOverrides::none().set("gdn.fused", "false").unwrap(),
            ..opts(Mode::Exact, GpuMode::Required)
        };
        let mut gpu_u = on_device(&path, unfused);
        exact_scenario(&mut gpu_u, &mut cpu, 8, &format!("{shape} {ty:?} unfused"));
        eprintln!("{shape} {ty:?}: exact on the device bitwise equal to the cpu, {steps} steps");
    }
}

/// Logits of sequence 1 (prompt of 45, then 6 decode steps of fixed
/// tokens), prefilled in chunks of `chunk`, with `b - 1` other sequences in
/// every step of the same batch.
fn target(r: &mut Runner, chunk: usize, b: usize) -> Vec<Vec<u32>> {
    let vocab = r.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..b as u32).map(|i| toks(i + 1, 45, vocab)).collect();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < 45 {
        let end = (pos + chunk).min(45);
        let work: Vec<SeqWork<'_>> = (0..b)
            .map(|i| SeqWork {
                seq: SeqId(1 + i as u64),
                tokens: &prompts[i][pos..end],
                start_pos: pos,
                logits: LogitsWanted::Last,
            })
            .collect();
        let l = r.step(&work).unwrap();
        if end == 45 {
            out.push(bits(&l[0]));
        }
        pos = end;
    }
    for t in 0..6u32 {
        let fed: Vec<[u32; 1]> = (0..b as u32).map(|i| [(7 + t + 3 * i) % vocab]).collect();
        let work: Vec<SeqWork<'_>> = (0..b)
            .map(|i| SeqWork {
                seq: SeqId(1 + i as u64),
                tokens: &fed[i],
                start_pos: 45 + t as usize,
                logits: LogitsWanted::Last,
            })
            .collect();
        out.push(bits(&r.step(&work).unwrap()[0]));
    }
    for i in 0..b {
        r.free(SeqId(1 + i as u64));
    }
    out
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn qwen35_deterministic_is_batch_chunk_and_run_invariant() {
    require_device();
    let dir = tempfile::tempdir().unwrap();
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
        let path = model(dir.path(), "qwen35-small", ty);
        let mut det = on_device(&path, opts(Mode::Deterministic, GpuMode::Required));
        let alone = target(&mut det, 45, 1);
        for b in [8, 33] {
            assert_eq!(
                alone,
                target(&mut det, 45, b),
                "{ty:?}: batch {b} changed the bits"
            );
        }
        for chunk in [7, 16, 1] {
            assert_eq!(
                alone,
                target(&mut det, chunk, 1),
                "{ty:?}: chunks of {chunk}"
            );
        }
        assert_eq!(alone, target(&mut det, 45, 1), "{ty:?}: run to run");
        eprintln!("{ty:?}: deterministic batch (1, 8, 33), chunk (45, 16, 7, 1) and run invariant");
    }
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn qwen35_fast_is_reproducible_and_close_to_cpu() {
    require_device();
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "qwen35-small", GgmlType::Q4_0);
    let mut cpu = Runner::load(&path, &opts(Mode::Exact, GpuMode::Off)).unwrap();
    let want = target(&mut cpu, 45, 1);
    let mut fast = on_device(&path, opts(Mode::Fast, GpuMode::Required));
    let f = target(&mut fast, 16, 8);
    assert_eq!(f, target(&mut fast, 16, 8), "fast: run to run");
    for (g, w) in f.iter().zip(&want) {
        let (mut num, mut den) = (0f64, 0f64);
        for (&a, &b) in g.iter().zip(w) {
            let (a, b) = (f32::from_bits(a) as f64, f32::from_bits(b) as f64);
            num += (a - b).powi(2);
            den += b * b;
        }
        assert!(
            num / den < 1e-3,
            "fast: logits NMSE {:e} vs the cpu",
            num / den
        );
    }
}

/// State copies on the device (snapshot save and restore, fork): the same
/// logits as the cpu doing the same, bit for bit, in `exact`.
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn qwen35_state_snapshots_and_forks_on_the_device() {
    require_device();
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), "qwen35-small", GgmlType::Q8_0);
    let with_snaps = |gpu| RunnerOptions {
        state_snapshots: 2,
        ..opts(Mode::Exact, gpu)
    };
    let mut cpu = Runner::load(&path, &with_snaps(GpuMode::Off)).unwrap();
    let mut gpu = on_device(&path, with_snaps(GpuMode::Required));
    let vocab = cpu.config().vocab_size as u32;
    let p = toks(5, 48, vocab);
    let run = |r: &mut Runner| -> Vec<Vec<u32>> {
        let step = |r: &mut Runner, seq, t: &[u32], pos| {
            bits(
                &r.step(&[SeqWork {
                    seq,
                    tokens: t,
                    start_pos: pos,
                    logits: LogitsWanted::All,
                }])
                .unwrap()[0],
            )
        };
        let (a, b, c) = (SeqId(1), SeqId(2), SeqId(3));
        let mut out = vec![step(r, a, &p[..32], 0)];
        r.save_state(a, 1).unwrap();
        out.push(step(r, a, &p[40..44], 32));
        r.free(a);
        out.push(step(r, b, &p[..32], 0));
        r.restore_state(b, 1).unwrap();
        out.push(step(r, b, &p[32..], 32));
        r.kv.fork(b, c).unwrap();
        r.fork_state(b, c).unwrap();
        out.push(step(r, b, &[5], 48));
        out.push(step(r, c, &[5], 48));
        r.free(b);
        r.free(c);
        out
    };
    let want = run(&mut cpu);
    let got = run(&mut gpu);
    assert_eq!(want[4], want[5], "cpu: a fork continues as its parent");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "step {i}: device state copies differ from the cpu's");
    }
}
