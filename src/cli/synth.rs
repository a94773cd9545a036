//! `quire synth`: write a random-weight GGUF of a named real shape.

use crate::model::synth::{find_shape, write_model, SHAPES};
use crate::quant::GgmlType;
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Shape name (e.g. SmolLM2-135M, Llama-3.2-1B, Llama-3.1-8B,
    /// Qwen2.5-7B, Qwen3.5-9B); `--list` shows all.
    #[arg(long, required_unless_present = "list")]
    pub shape: Option<String>,
    /// Weight type of the matrices: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
    /// Q8_0, Q4_K, Q5_K, Q6_K.
    #[arg(long = "type", default_value = "Q4_0")]
    pub ty: String,
    /// Output file.
    #[arg(long, short = 'o', required_unless_present = "list")]
    pub out: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// List the known shapes.
    #[arg(long)]
    pub list: bool,
}

pub fn parse_type(s: &str) -> Result<GgmlType> {
    GgmlType::WEIGHT_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .with_context(|| {
            let names: Vec<&str> = GgmlType::WEIGHT_TYPES.iter().map(|t| t.name()).collect();
            format!("unknown weight type '{s}' (known: {})", names.join(", "))
        })
}

pub fn synth(a: SynthArgs) -> Result<()> {
    if a.list {
        for s in SHAPES {
            println!(
                "{:16} {:6} layers {:3} dim {:5} heads {:3}/{:<2} head_dim {:3} ffn {:6} vocab {}",
                s.name,
                s.arch,
                s.n_layers,
                s.dim,
                s.n_heads,
                s.n_kv_heads,
                s.head_dim,
                s.ffn_dim,
                s.vocab
            );
        }
        return Ok(());
    }
    let (Some(shape), Some(out)) = (a.shape.as_deref(), a.out.as_ref()) else {
        anyhow::bail!("--shape and --out are required");
    };
    let s = find_shape(shape)?;
    let ty = parse_type(&a.ty)?;
    let t = std::time::Instant::now();
    write_model(out, s, ty, a.seed)?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({} {}, {:.2} GB) in {:.1} s",
        out.display(),
        s.name,
        ty.name(),
        bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
