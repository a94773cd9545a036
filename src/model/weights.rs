//! Weight references into the memory-mapped GGUF file.
//!
//! Matrices stay in the mmap in their stored type (no copy, no dequant);
//! small vectors (norms, biases) are decoded to f32 once at load.

use crate::gguf::GgufFile;
use crate::quant;
use anyhow::{bail, Context, Result};

pub use crate::dispatch::weights::{HostStore, Store, WeightRef};

/// Decodes a 1-D tensor of `len` elements (any supported type) to f32.
pub fn load_vector(g: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = g
        .tensor(name)
        .with_context(|| format!("missing tensor {name}"))?;
    let n: u64 = t.dims.iter().product();
    if n as usize != len {
        bail!("tensor {name}: {n} elements, the model config needs {len}");
    }
    let mut out = vec![0f32; len];
    quant::dequantize(t.ty, g.tensor_data(name)?, &mut out)
        .with_context(|| format!("decoding tensor {name}"))?;
    Ok(out)
}

pub fn optional_vector(g: &GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
    if g.tensor(name).is_none() {
        return Ok(None);
    }
    load_vector(g, name, len).map(Some)
}
