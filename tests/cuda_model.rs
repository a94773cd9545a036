//! Whole-model device path: a model step with weights, activations and the
//! paged KV cache resident on the GPU gives logits bitwise equal to the cpu
//! backend in `exact` mode, across batched prefill, scattered blocks,
//! fork + copy-on-write and decode; and `deterministic` and `fast` on the
//! device. Those need a CUDA device: `#[ignore]`d, run with `--ignored` (as
//! scripts/gpu-check.sh does), they fail without a usable one. Without a
//! GPU (CI): `--gpu required` fails naming cuda.

mod common;

use common::cuda::require_device;
use quire::backend::{GpuMode, Mode};
use quire::kv::SeqId;
use quire::model::synth;
use quire::quant::GgmlType;
use quire::runner::{Compute, LogitsWanted, Runner, RunnerOptions, SeqWork};
use std::path::Path;

/// The model at `path` on the device (`opts.gpu` must be `Required`);
/// panics, naming the reason, where there is no usable device.
fn load_on_device(path: &Path, opts: &RunnerOptions) -> Runner {
    assert_eq!(opts.gpu, GpuMode::Required);
    Runner::load(path, opts)
        .unwrap_or_else(|e| panic!("this test needs a usable CUDA device: --gpu required: {e:#}"))
}

fn toks(seed: u32, n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 40_503)) % vocab)
        .collect()
}

/// One sequence's work in a scripted step: (seq, tokens, start, logits).
type Item = (SeqId, Vec<u32>, usize, LogitsWanted);

/// Runs the same scripted steps on both runners, comparing every logit bit.
fn scenario(gpu: &mut Runner, cpu: &mut Runner, what: &str) {
    let vocab = gpu.config().vocab_size as u32;
    let (a, b, c, junk) = (SeqId(1), SeqId(2), SeqId(3), SeqId(9));
    let pa = toks(1, 37, vocab);
    let pb = toks(2, 20, vocab);
    for r in [&mut *gpu, &mut *cpu] {
        // Scatter the physical blocks: a freed sequence leaves holes.
        r.step(&[SeqWork {
            seq: junk,
            tokens: &toks(3, 50, vocab),
            start_pos: 0,
            logits: LogitsWanted::None,
        }])
        .unwrap();
    }
    let mut steps: Vec<Vec<Item>> = vec![vec![
        (a, pa.clone(), 0, LogitsWanted::All),
        (b, pb.clone(), 0, LogitsWanted::Last),
    ]];
    for t in 0..6u32 {
        steps.push(vec![
            (
                a,
                vec![(7 + t) % vocab],
                37 + t as usize,
                LogitsWanted::Last,
            ),
            (
                b,
                vec![(11 + t) % vocab],
                20 + t as usize,
                LogitsWanted::Last,
            ),
        ]);
    }
    for (si, step) in steps.iter().enumerate() {
        if si == 1 {
            for r in [&mut *gpu, &mut *cpu] {
                r.free(junk);
                r.kv.fork(a, c).unwrap();
            }
        }
        let mut work: Vec<SeqWork<'_>> = step
            .iter()
            .map(|(s, t, p, l)| SeqWork {
                seq: *s,
                tokens: t,
                start_pos: *p,
                logits: *l,
            })
            .collect();
        // The fork decodes a different token than its parent from the
        // shared (copy-on-write) last block.
        let ctok = [(5 + si as u32) % vocab];
        if si >= 1 {
            work.push(SeqWork {
                seq: c,
                tokens: &ctok,
                start_pos: 37 + si - 1,
                logits: LogitsWanted::Last,
            });
        }
        let g = gpu.step(&work).unwrap();
        let r = cpu.step(&work).unwrap();
        assert_eq!(g.len(), r.len());
        for (i, (gl, rl)) in g.iter().zip(&r).enumerate() {
            assert_eq!(gl.len(), rl.len(), "{what}: step {si} item {i} length");
            assert!(
                gl.iter().all(|x| x.is_finite()),
                "{what}: non-finite logits"
            );
            let diff = gl
                .iter()
                .zip(rl)
                .position(|(x, y)| x.to_bits() != y.to_bits());
            assert!(
                diff.is_none(),
                "{what}: step {si} item {i}: logit {} differs: gpu {} cpu {}",
                diff.unwrap(),
                gl[diff.unwrap()],
                rl[diff.unwrap()]
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn device_resident_model_is_bitwise_equal_to_cpu() {
    require_device();
    let dir = tempfile::tempdir().unwrap();
    for shape in ["tiny-llama", "tiny-llama-tied", "tiny-qwen2", "tiny-qwen3"] {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q8_0,
            GgmlType::F16,
        ] {
            let path = dir.path().join(format!("{shape}-{ty:?}.gguf"));
            synth::write_model(&path, synth::find_shape(shape).unwrap(), ty, 5).unwrap();
            let opts = RunnerOptions {
                threads: Some(2),
                kv_tokens: Some(512),
                block_size: 16,
                mode: Mode::Exact,
                ..RunnerOptions::default()
            };
            let mut gpu = load_on_device(
                &path,
                &RunnerOptions {
                    gpu: GpuMode::Required,
                    ..opts.clone()
                },
            );
            assert!(
                matches!(gpu.compute, Compute::Device(_)),
                "--gpu required must put the model on the device"
            );
            let mut cpu = Runner::load(&path, &opts).unwrap();
            scenario(&mut gpu, &mut cpu, &format!("{shape} {ty:?}"));
            eprintln!("{shape} {ty:?}: device path bitwise equal to the cpu");
        }
    }
}

/// Its premise is a machine without a usable GPU (CI): where the model
/// loads on a device, it fails saying so (GPU machines run the device
/// tests, `--ignored`, instead).
#[test]
fn gpu_required_without_a_gpu_fails_naming_cuda() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    synth::write_model(
        &path,
        synth::find_shape("tiny-llama").unwrap(),
        GgmlType::Q4_0,
        5,
    )
    .unwrap();
    let e = match Runner::load(
        &path,
        &RunnerOptions {
            gpu: GpuMode::Required,
            ..RunnerOptions::default()
        },
    ) {
        Ok(_) => panic!(
            "premise: a machine without a usable CUDA device, as CI is. --gpu required \
             loaded the model on a device here, so the no-GPU error cannot be checked; \
             on a GPU machine run the device tests instead (--ignored; scripts/gpu-check.sh tests)"
        ),
        Err(e) => e,
    };
    let msg = format!("{e:#}");
    assert!(
        msg.contains("--gpu required") && msg.contains("cuda"),
        "{msg}"
    );
}

/// Logits of sequence 1 over a fixed script: a prompt prefilled in chunks
/// of `chunk`, then 3 decode steps; `with_other` runs a second sequence in
/// every step of the same batch.
fn script(r: &mut Runner, chunk: usize, with_other: bool) -> Vec<Vec<f32>> {
    let vocab = r.config().vocab_size as u32;
    let (a, b) = (SeqId(1), SeqId(2));
    let pa = toks(1, 45, vocab);
    let pb = toks(2, 45, vocab);
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < pa.len() {
        let end = (pos + chunk).min(pa.len());
        let mut w = vec![SeqWork {
            seq: a,
            tokens: &pa[pos..end],
            start_pos: pos,
            logits: LogitsWanted::Last,
        }];
        if with_other {
            w.push(SeqWork {
                seq: b,
                tokens: &pb[pos..end],
                start_pos: pos,
                logits: LogitsWanted::Last,
            });
        }
        let l = r.step(&w).unwrap();
        pos = end;
        if pos == pa.len() {
            out.push(l[0].clone());
        }
    }
    for t in 0..3u32 {
        let ta = [(7 + t) % vocab];
        let tb = [(9 + t) % vocab];
        let mut w = vec![SeqWork {
            seq: a,
            tokens: &ta,
            start_pos: 45 + t as usize,
            logits: LogitsWanted::Last,
        }];
        if with_other {
            w.push(SeqWork {
                seq: b,
                tokens: &tb,
                start_pos: 45 + t as usize,
                logits: LogitsWanted::Last,
            });
        }
        out.push(r.step(&w).unwrap()[0].clone());
    }
    r.free(a);
    r.free(b);
    out
}

fn bits_of(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|l| l.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// `deterministic` on the device: batch-invariant and KV-cache invariant
/// (bitwise), and close to the cpu. `fast`: run-to-run bitwise and close
/// to the cpu (its GEMMs are not batch-invariant).
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn device_fast_and_deterministic_modes() {
    require_device();
    let dir = tempfile::tempdir().unwrap();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::F16,
    ] {
        let path = dir.path().join(format!("m-{ty:?}.gguf"));
        synth::write_model(&path, synth::find_shape("tiny-qwen3").unwrap(), ty, 11).unwrap();
        let opts = |mode, gpu| RunnerOptions {
            threads: Some(2),
            kv_tokens: Some(512),
            mode,
            gpu,
            ..RunnerOptions::default()
        };
        let mut cpu = Runner::load(&path, &opts(Mode::Exact, GpuMode::Off)).unwrap();
        let want = script(&mut cpu, 45, false);
        let mut det = load_on_device(&path, &opts(Mode::Deterministic, GpuMode::Required));
        let alone = script(&mut det, 45, false);
        assert_eq!(
            bits_of(&alone),
            bits_of(&script(&mut det, 45, true)),
            "{ty:?}: deterministic must be batch-invariant"
        );
        assert_eq!(
            bits_of(&alone),
            bits_of(&script(&mut det, 7, false)),
            "{ty:?}: deterministic must be KV-cache (chunking) invariant"
        );
        let mut fast = load_on_device(&path, &opts(Mode::Fast, GpuMode::Required));
        let f1 = script(&mut fast, 45, true);
        assert_eq!(
            bits_of(&f1),
            bits_of(&script(&mut fast, 45, true)),
            "{ty:?}: fast must be run-to-run deterministic"
        );
        // Chunks of 7 with a second sequence: 14-row prefill steps and
        // 2-row decode steps (the batched int8 tensor-core kernels).
        let f7 = script(&mut fast, 7, true);
        for (name, got) in [
            ("deterministic", &alone),
            ("fast", &f1),
            ("fast, chunks of 7", &f7),
        ] {
            for (g, w) in got.iter().zip(&want) {
                let (mut num, mut den) = (0f64, 0f64);
                for (a, b) in g.iter().zip(w) {
                    num += (*a as f64 - *b as f64).powi(2);
                    den += (*b as f64).powi(2);
                }
                let nmse = num / den;
                assert!(
                    nmse < 1e-3,
                    "{ty:?} {name}: logits NMSE {nmse:e} vs the cpu"
                );
            }
        }
        eprintln!("{ty:?}: deterministic invariant, fast reproducible, both close to the cpu");
    }
}
