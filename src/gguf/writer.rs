//! GGUF v3 writer (for tests, tiny reference models and `quire synth`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::value::{type_id, GgufValue};
use super::{GgufError, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::quant::{is_weight_type, GgmlType};

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory, then writes it in one pass.
///
/// Metadata keeps insertion order; tensors are laid out in insertion order,
/// each at an offset aligned to `general.alignment` (default 32).
#[derive(Default)]
pub struct GgufWriter {
    kvs: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<PendingTensor>,
    tensor_index: HashMap<String, usize>,
}

fn werr(msg: impl Into<String>) -> GgufError {
    GgufError::Write { msg: msg.into() }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a metadata value. Setting a key again replaces its value and
    /// keeps its original position (map semantics).
    pub fn add_kv(&mut self, key: impl Into<String>, value: impl Into<GgufValue>) {
        let key = key.into();
        let value = value.into();
        match self.key_index.get(&key) {
            Some(&i) => self.kvs[i].1 = value,
            None => {
                self.key_index.insert(key.clone(), self.kvs.len());
                self.kvs.push((key, value));
            }
        }
    }

    /// Adds a tensor. `dims` in GGML order (`dims[0]` = row length); `data`
    /// must be exactly `ty.row_bytes(product of dims)` bytes.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        if self.tensor_index.contains_key(&name) {
            return Err(werr(format!("duplicate tensor name '{name}'")));
        }
        if !is_weight_type(ty) {
            return Err(werr(format!(
                "tensor '{name}': type {} is not a weight type",
                ty.name()
            )));
        }
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(werr(format!(
                "tensor '{name}': {} dims (GGML allows 1 to {MAX_DIMS})",
                dims.len()
            )));
        }
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64 && n <= usize::MAX as u64)
            .ok_or_else(|| {
                werr(format!(
                    "tensor '{name}': element count of {dims:?} overflows"
                ))
            })?;
        if !dims[0].is_multiple_of(ty.block_size() as u64) {
            return Err(werr(format!(
                "tensor '{name}': row length {} is not a multiple of the {} block size {}",
                dims[0],
                ty.name(),
                ty.block_size()
            )));
        }
        let want = ty
            .row_bytes(n as usize)
            .map_err(|e| werr(format!("tensor '{name}': {e}")))?;
        if data.len() != want {
            return Err(werr(format!(
                "tensor '{name}': {} bytes of data, {:?} {} needs {want}",
                data.len(),
                dims,
                ty.name()
            )));
        }
        self.tensor_index.insert(name.clone(), self.tensors.len());
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(())
    }

    /// The data alignment this writer will use.
    pub fn alignment(&self) -> Result<u64, GgufError> {
        match self.key_index.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(&i) => match self.kvs[i].1 {
                GgufValue::U32(a) if a.is_power_of_two() => Ok(a as u64),
                ref v => Err(werr(format!(
                    "general.alignment must be a power-of-two u32, got {v} ({})",
                    v.type_name()
                ))),
            },
        }
    }

    /// Writes the file (GGUF v3) through a buffered writer.
    pub fn write_to(&self, path: &Path) -> Result<(), GgufError> {
        let io = |op: &'static str| {
            move |source: std::io::Error| GgufError::Io {
                path: path.to_path_buf(),
                op,
                source,
            }
        };
        let file = File::create(path).map_err(io("create"))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        self.write(&mut w).map_err(|e| match e {
            WriteError::Gguf(g) => g,
            WriteError::Io(source) => GgufError::Io {
                path: path.to_path_buf(),
                op: "write",
                source,
            },
        })?;
        w.flush().map_err(io("write"))?;
        w.into_inner()
            .map_err(|e| io("write")(e.into_error()))?
            .sync_all()
            .map_err(io("sync"))
    }

    /// Serializes into any writer (e.g. a `Vec<u8>` in tests).
    pub fn write_into<W: Write>(&self, w: &mut W) -> Result<(), GgufError> {
        self.write(w).map_err(|e| match e {
            WriteError::Gguf(g) => g,
            WriteError::Io(source) => GgufError::Io {
                path: Default::default(),
                op: "write",
                source,
            },
        })
    }

    fn write<W: Write>(&self, w: &mut W) -> Result<(), WriteError> {
        let alignment = self.alignment()?;
        for (k, v) in &self.kvs {
            check_homogeneous(k, v)?;
        }
        let mut w = Counting { inner: w, pos: 0 };
        w.put(&GGUF_MAGIC)?;
        w.put(&3u32.to_le_bytes())?;
        w.put(&(self.tensors.len() as u64).to_le_bytes())?;
        w.put(&(self.kvs.len() as u64).to_le_bytes())?;
        for (k, v) in &self.kvs {
            let mut buf = Vec::new();
            put_str(&mut buf, k);
            buf.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut buf, v);
            w.put(&buf)?;
        }
        // Each tensor starts at an aligned offset; every tensor (the last
        // included, as ggml does) is padded to the alignment.
        let mut offset = 0u64;
        for t in &self.tensors {
            let mut buf = Vec::new();
            put_str(&mut buf, &t.name);
            buf.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                buf.extend_from_slice(&d.to_le_bytes());
            }
            buf.extend_from_slice(&t.ty.id().to_le_bytes());
            buf.extend_from_slice(&offset.to_le_bytes());
            w.put(&buf)?;
            offset = (offset + t.data.len() as u64).div_ceil(alignment) * alignment;
        }
        w.pad(alignment)?;
        for t in &self.tensors {
            w.put(&t.data)?;
            w.pad(alignment)?;
        }
        Ok(())
    }
}

/// Tracks the byte position to compute padding.
struct Counting<'a, W: Write> {
    inner: &'a mut W,
    pos: u64,
}

impl<W: Write> Counting<'_, W> {
    fn put(&mut self, b: &[u8]) -> Result<(), WriteError> {
        self.inner.write_all(b)?;
        self.pos += b.len() as u64;
        Ok(())
    }

    /// Zero bytes up to the next multiple of `alignment` (a power of two).
    fn pad(&mut self, alignment: u64) -> Result<(), WriteError> {
        const ZEROS: [u8; 256] = [0; 256];
        let mut n = self.pos.div_ceil(alignment) * alignment - self.pos;
        while n > 0 {
            let k = n.min(ZEROS.len() as u64);
            self.put(&ZEROS[..k as usize])?;
            n -= k;
        }
        Ok(())
    }
}

enum WriteError {
    Gguf(GgufError),
    Io(std::io::Error),
}

impl From<GgufError> for WriteError {
    fn from(e: GgufError) -> Self {
        WriteError::Gguf(e)
    }
}

impl From<std::io::Error> for WriteError {
    fn from(e: std::io::Error) -> Self {
        WriteError::Io(e)
    }
}

/// GGUF arrays carry one element type: every element must share it.
fn check_homogeneous(key: &str, v: &GgufValue) -> Result<(), GgufError> {
    if let GgufValue::Array(items) = v {
        if let Some(first) = items.first() {
            let t = first.type_id();
            if let Some(bad) = items.iter().find(|e| e.type_id() != t) {
                return Err(werr(format!(
                    "key '{key}': array mixes {} and {} elements",
                    first.type_name(),
                    bad.type_name()
                )));
            }
        }
        for e in items {
            check_homogeneous(key, e)?;
        }
    }
    Ok(())
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => buf.push(*x),
        GgufValue::I8(x) => buf.push(*x as u8),
        GgufValue::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => buf.push(*x as u8),
        GgufValue::String(s) => put_str(buf, s),
        GgufValue::Array(items) => {
            // An empty array has no element to take the type from; u8 is as
            // good as any (readers see an empty array either way).
            let et = items.first().map_or(type_id::U8, GgufValue::type_id);
            buf.extend_from_slice(&et.to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for e in items {
                put_value(buf, e);
            }
        }
    }
}
