//! GGUF v2/v3 reader (mmap) and writer.
//!
//! The reader validates the whole header up front (counts, lengths, tensor
//! shapes, types, alignment, bounds, overlaps), so every later accessor can
//! slice the mapping without further checks. Malformed input is an error
//! naming the file, never a panic or an allocation sized by untrusted counts.

mod reader;
mod value;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use thiserror::Error;

use crate::quant::GgmlType;

pub use value::{type_id, type_name_of_id, GgufValue};
pub use writer::GgufWriter;

/// `GGUF` in file order.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;

#[derive(Debug, Error)]
pub enum GgufError {
    #[error("{}: {op}: {source}", .path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: malformed GGUF at byte {offset}: {msg}", .path.display())]
    Malformed {
        path: PathBuf,
        offset: u64,
        msg: String,
    },
    #[error("{}: unsupported GGUF version {version} (Quire reads versions 2 and 3){hint}", .path.display())]
    UnsupportedVersion {
        path: PathBuf,
        version: u32,
        hint: &'static str,
    },
    #[error("{}: tensor '{tensor}' has unsupported type {type_name} (ggml type id {id})", .path.display())]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        id: u32,
        type_name: &'static str,
    },
    #[error("{}: tensor '{tensor}': {msg}", .path.display())]
    BadTensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("{}: metadata key '{key}': {msg}", .path.display())]
    Metadata {
        path: PathBuf,
        key: String,
        msg: String,
    },
    #[error("{}: no tensor named '{name}'", .path.display())]
    MissingTensor { path: PathBuf, name: String },
    #[error("GGUF writer: {msg}")]
    Write { msg: String },
}

/// One tensor's header entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the contiguous (row length) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes of tensor data (`ty.row_bytes(n_elements)`).
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Product of the dims (validated not to overflow when read).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row length: `dims[0]`.
    pub fn cols(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows of a 2D tensor: `dims[1]` (1 for a 1D tensor). For
    /// more dims, all dims past the first multiply into rows.
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes of one row (`dims[0]` elements).
    pub fn row_bytes(&self) -> usize {
        // Validated when read or added: dims[0] is a whole number of blocks.
        (self.cols() as usize / self.ty.block_size()) * self.ty.type_size()
    }
}

/// An open, validated GGUF file backed by a read-only memory map.
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    /// Absolute byte offset of the data section.
    data_offset: u64,
    mmap: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates a GGUF v2/v3 file.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        reader::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// `general.alignment` (default 32; validated to be a power of two).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file as mapped.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, a slice of the mapping (data section offsets are
    /// aligned, so the slice starts at a multiple of `alignment()` from a
    /// page-aligned base).
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        let t = self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            path: self.path.clone(),
            name: name.to_string(),
        })?;
        Ok(self.data_of(t))
    }

    /// Bytes of a tensor of this file (bounds validated at open).
    pub fn data_of(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.mmap[start..start + t.n_bytes]
    }

    /// The tensor dequantized to f32 (n_elements values, GGML order).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let t = self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            path: self.path.clone(),
            name: name.to_string(),
        })?;
        let mut out = vec![0f32; t.n_elements() as usize];
        crate::quant::dequantize(t.ty, self.data_of(t), &mut out).map_err(|e| {
            GgufError::BadTensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                msg: e.to_string(),
            }
        })?;
        Ok(out)
    }

    fn key_err(&self, key: &str, msg: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            msg: msg.into(),
        }
    }

    fn need(&self, key: &str) -> Result<&GgufValue, GgufError> {
        self.get(key).ok_or_else(|| self.key_err(key, "missing"))
    }

    fn wrong(&self, key: &str, want: &str, v: &GgufValue) -> GgufError {
        self.key_err(key, format!("expected {want}, found {}", v.type_name()))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.need(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "string", v))
    }

    /// Any integer type whose value fits u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.need(key)?;
        self.int_as(key, v, "u32")
    }

    /// Any integer type whose value fits u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.need(key)?;
        self.int_as(key, v, "u64")
    }

    /// F32, or F64 rounded to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.need(key)?;
        v.as_float()
            .map(|x| x as f32)
            .ok_or_else(|| self.wrong(key, "f32 or f64", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.need(key)?;
        v.as_bool().ok_or_else(|| self.wrong(key, "bool", v))
    }

    fn get_array(&self, key: &str) -> Result<&[GgufValue], GgufError> {
        let v = self.need(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, "array", v))
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_array(key)?
            .iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_str()
                    .ok_or_else(|| self.wrong(key, &format!("string at index {i}"), e))
            })
            .collect()
    }

    /// Elements of type F32 or F64.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.get_array(key)?
            .iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_float()
                    .map(|x| x as f32)
                    .ok_or_else(|| self.wrong(key, &format!("float at index {i}"), e))
            })
            .collect()
    }

    /// Elements of any integer type whose values fit i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.get_array(key)?
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let x = e
                    .as_int()
                    .ok_or_else(|| self.wrong(key, &format!("integer at index {i}"), e))?;
                i32::try_from(x).map_err(|_| {
                    self.key_err(key, format!("value {x} at index {i} does not fit i32"))
                })
            })
            .collect()
    }

    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key).map(|_| self.get_u32(key)).transpose()
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key).map(|_| self.get_u64(key)).transpose()
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get(key).map(|_| self.get_f32(key)).transpose()
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key).map(|_| self.get_bool(key)).transpose()
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key).map(|_| self.get_str(key)).transpose()
    }

    /// `general.architecture`.
    pub fn arch(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    fn int_as<T: TryFrom<i128>>(
        &self,
        key: &str,
        v: &GgufValue,
        want: &str,
    ) -> Result<T, GgufError> {
        let x = v
            .as_int()
            .ok_or_else(|| self.wrong(key, &format!("integer ({want})"), v))?;
        T::try_from(x).map_err(|_| self.key_err(key, format!("value {x} does not fit {want}")))
    }
}
