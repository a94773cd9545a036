//! Where a model's weights live ([`Store`]: the types of its matrices and
//! vectors in one memory space) and the host's references into the GGUF
//! mmap ([`WeightRef`]).

use crate::backend::QMatrix;
use crate::gguf::GgufFile;
use crate::quant::GgmlType;
use anyhow::{bail, Context, Result};
use std::sync::Arc;

/// Where a model's weights live: the types of its matrices and vectors.
/// The graph is generic over it, so one graph runs from the mmap (host) or
/// from device copies.
pub trait Store {
    type Mat;
    type Vec;
}

/// Weights on the host: matrices in the GGUF mmap, vectors decoded to f32.
pub struct HostStore;

impl Store for HostStore {
    type Mat = WeightRef;
    type Vec = Vec<f32>;
}

/// A 2-D weight matrix stored in the GGUF data section.
#[derive(Clone, Debug)]
pub struct WeightRef {
    pub name: String,
    pub ty: GgmlType,
    /// Output features (GGUF dims[1]).
    pub rows: usize,
    /// Input features (GGUF dims[0], contiguous).
    pub cols: usize,
    /// A copy of part of the tensor (a tensor-parallel shard, `tp::shard`;
    /// `name` then says which part); None: the tensor in the mmap.
    pub owned: Option<Arc<[u8]>>,
}

impl WeightRef {
    /// Looks up `name` and checks it is a (rows, cols) matrix.
    pub fn load(g: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Self> {
        let t = g
            .tensor(name)
            .with_context(|| format!("missing tensor {name}"))?;
        let (c, r) = match t.dims.as_slice() {
            [c] => (*c as usize, 1),
            [c, r] => (*c as usize, *r as usize),
            other => bail!("tensor {name}: expected 2 dims, got {other:?}"),
        };
        if r != rows || c != cols {
            bail!("tensor {name}: shape [{c}, {r}] but the model config needs [{cols}, {rows}] (GGUF order)");
        }
        Ok(WeightRef {
            name: name.to_string(),
            ty: t.ty,
            rows,
            cols,
            owned: None,
        })
    }

    pub fn optional(g: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Option<Self>> {
        if g.tensor(name).is_none() {
            return Ok(None);
        }
        Self::load(g, name, rows, cols).map(Some)
    }

    /// The matrix as an op argument, borrowing the mmap (or the shard).
    pub fn matrix<'a>(&'a self, g: &'a GgufFile) -> Result<QMatrix<'a>> {
        Ok(QMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: match &self.owned {
                Some(d) => d,
                None => g.tensor_data(&self.name)?,
            },
        })
    }
}
