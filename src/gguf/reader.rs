//! GGUF parsing and validation.
//!
//! Layout (all little-endian): magic "GGUF", version u32, n_tensors u64,
//! n_kv u64, n_kv x (key: string, type: u32, value), n_tensors x (name:
//! string, n_dims: u32, dims: [u64; n_dims], type: u32, offset: u64), padding
//! to `alignment`, data section. A string is a u64 length then bytes.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::value::{type_id, type_name_of_id, GgufValue};
use super::{GgufError, GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::quant::{is_weight_type, GgmlType};

/// Nested arrays deeper than this are rejected (bounds recursion depth).
const MAX_ARRAY_DEPTH: usize = 16;
/// magic + version + n_tensors + n_kv.
const HEADER_BYTES: usize = 24;
/// Smallest encoding of one key/value: key length, type, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest encoding of one tensor info: name length, n_dims, one dim,
/// type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// A bounds-checked reader over the mapped header.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: impl Into<String>) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            offset: self.pos as u64,
            msg: msg.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes, {} left",
                self.remaining()
            )));
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed string. Lengths past the end are errors before any
    /// allocation.
    fn raw_string(&mut self, what: &str) -> Result<&'a [u8], GgufError> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(self.err(format!(
                "{what}: string length {len} runs past the end of the file ({} bytes left)",
                self.remaining()
            )));
        }
        self.take(len, what)
    }

    /// A string that must be valid UTF-8 (keys, tensor names).
    fn strict_string(&mut self, what: &str) -> Result<String, GgufError> {
        let start = self.pos;
        let bytes = self.raw_string(what)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|e| GgufError::Malformed {
                path: self.path.to_path_buf(),
                offset: start as u64,
                msg: format!("{what} is not valid UTF-8: {e}"),
            })
    }

    fn value(&mut self, ty: u32, depth: usize, key: &str) -> Result<GgufValue, GgufError> {
        Ok(match ty {
            type_id::U8 => GgufValue::U8(self.array::<1>(key)?[0]),
            type_id::I8 => GgufValue::I8(self.array::<1>(key)?[0] as i8),
            type_id::U16 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            type_id::I16 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            type_id::U32 => GgufValue::U32(u32::from_le_bytes(self.array(key)?)),
            type_id::I32 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            type_id::U64 => GgufValue::U64(u64::from_le_bytes(self.array(key)?)),
            type_id::I64 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            type_id::F32 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            type_id::F64 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            type_id::BOOL => {
                let b = self.array::<1>(key)?[0];
                match b {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    _ => return Err(self.err(format!("key '{key}': bool byte {b} is not 0 or 1"))),
                }
            }
            type_id::STRING => {
                // Values (e.g. tokenizer tokens) are kept even when not valid
                // UTF-8: invalid sequences become U+FFFD rather than failing
                // the whole model.
                let bytes = self.raw_string(key)?;
                GgufValue::String(String::from_utf8_lossy(bytes).into_owned())
            }
            type_id::ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!(
                        "key '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    )));
                }
                let elem_ty = self.u32(key)?;
                let min = min_value_bytes(elem_ty).ok_or_else(|| {
                    self.err(format!("key '{key}': unknown array element type {elem_ty}"))
                })?;
                let count = self.u64(key)?;
                // Bound the allocation by what the file could hold.
                if count > self.remaining() as u64 / min {
                    return Err(self.err(format!(
                        "key '{key}': array of {count} {} elements cannot fit in the {} bytes left",
                        type_name_of_id(elem_ty),
                        self.remaining()
                    )));
                }
                let mut v = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    v.push(self.value(elem_ty, depth + 1, key)?);
                }
                GgufValue::Array(v)
            }
            other => {
                return Err(self.err(format!("key '{key}': unknown value type {other}")));
            }
        })
    }
}

/// Smallest encoded size of one value of type `ty` (None: unknown type).
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 | type_id::STRING => 8,
        type_id::ARRAY => 12,
        _ => return None,
    })
}

pub(super) fn open(path: &Path) -> Result<GgufFile, GgufError> {
    let io = |op: &'static str| {
        move |source: std::io::Error| GgufError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    let file = File::open(path).map_err(io("open"))?;
    let len = file.metadata().map_err(io("stat"))?.len();
    if len < HEADER_BYTES as u64 {
        return Err(GgufError::Malformed {
            path: path.to_path_buf(),
            offset: 0,
            msg: format!("file is {len} bytes, shorter than the {HEADER_BYTES}-byte GGUF header"),
        });
    }
    // SAFETY: the file is mapped read-only and never written through this
    // mapping. Another process truncating or rewriting the file while it is
    // mapped is outside what we can guard against (as for every mmap-based
    // loader, llama.cpp included); GGUF model files are treated as immutable.
    let mmap = unsafe { Mmap::map(&file) }.map_err(io("mmap"))?;
    parse(path.to_path_buf(), mmap)
}

fn parse(path: PathBuf, mmap: Mmap) -> Result<GgufFile, GgufError> {
    let mut c = Cursor {
        buf: &mmap,
        pos: 0,
        path: &path,
    };
    let magic: [u8; 4] = c.array("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::Malformed {
            path: path.clone(),
            offset: 0,
            msg: format!("bad magic {magic:02x?}, expected \"GGUF\" (not a GGUF file)"),
        });
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        let hint = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            " (this looks like a big-endian GGUF)"
        } else if version == 1 {
            " (GGUF v1 is obsolete; re-convert the model)"
        } else {
            ""
        };
        return Err(GgufError::UnsupportedVersion {
            path: path.clone(),
            version,
            hint,
        });
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    let need = (n_kv as u128) * (MIN_KV_BYTES as u128)
        + (n_tensors as u128) * (MIN_TENSOR_INFO_BYTES as u128);
    if need > c.remaining() as u128 {
        return Err(c.err(format!(
            "{n_tensors} tensors and {n_kv} metadata entries cannot fit in the {} bytes left",
            c.remaining()
        )));
    }

    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut key_index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let at = c.pos;
        let key = c.strict_string(&format!("metadata key #{i}"))?;
        let shown = clip(&key);
        let ty = c.u32(&shown)?;
        let value = c.value(ty, 0, &shown)?;
        if key_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::Malformed {
                path: path.clone(),
                offset: at as u64,
                msg: format!("duplicate metadata key '{shown}'"),
            });
        }
        metadata.push((key, value));
    }

    let alignment = match key_index.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let v = &metadata[i].1;
            let a = v.as_int().filter(|&a| a > 0 && a <= u32::MAX as i128);
            match a {
                Some(a) if (a as u64).is_power_of_two() => a as u64,
                _ => {
                    return Err(GgufError::Metadata {
                        path: path.clone(),
                        key: "general.alignment".into(),
                        msg: format!("must be a power of two u32, found {v} ({})", v.type_name()),
                    })
                }
            }
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let at = c.pos as u64;
        let name = c.strict_string(&format!("tensor name #{i}"))?;
        let t = read_tensor_info(&mut c, &path, name)?;
        if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(GgufError::Malformed {
                path: path.clone(),
                offset: at,
                msg: format!("duplicate tensor name '{}'", clip(&t.name)),
            });
        }
        tensors.push(t);
    }

    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = mmap.len() as u64;
    check_tensor_placement(&path, &tensors, alignment, data_offset, file_len)?;

    Ok(GgufFile {
        path,
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
        mmap,
    })
}

fn read_tensor_info(
    c: &mut Cursor<'_>,
    path: &Path,
    name: String,
) -> Result<TensorInfo, GgufError> {
    let bad = |msg: String| GgufError::BadTensor {
        path: path.to_path_buf(),
        tensor: clip(&name),
        msg,
    };
    let shown = clip(&name);
    let n_dims = c.u32(&shown)?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(bad(format!(
            "{n_dims} dimensions (GGML allows 1 to {MAX_DIMS})"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&shown)?);
    }
    let type_raw = c.u32(&shown)?;
    let offset = c.u64(&shown)?;
    let ty = GgmlType::from_id(type_raw)
        .ok()
        .filter(|&t| is_weight_type(t))
        .ok_or_else(|| GgufError::UnsupportedTensorType {
            path: path.to_path_buf(),
            tensor: name.clone(),
            id: type_raw,
            type_name: GgmlType::name_of_id(type_raw),
        })?;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| bad(format!("element count of dims {dims:?} overflows")))?;
    let block = ty.block_size() as u64;
    if dims[0] % block != 0 {
        return Err(bad(format!(
            "row length {} is not a multiple of the {} block size {block}",
            dims[0],
            ty.name()
        )));
    }
    let n_bytes = (n_elements / block)
        .checked_mul(ty.type_size() as u64)
        .filter(|&b| b <= usize::MAX as u64)
        .ok_or_else(|| bad(format!("byte size of dims {dims:?} overflows")))?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_bytes: n_bytes as usize,
    })
}

/// Offsets aligned, data within the file, no two tensors overlapping.
fn check_tensor_placement(
    path: &Path,
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let bad = |t: &TensorInfo, msg: String| GgufError::BadTensor {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        msg,
    };
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(bad(
                t,
                format!(
                    "offset {} is not a multiple of the alignment {alignment}",
                    t.offset
                ),
            ));
        }
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes as u64));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(bad(
                    t,
                    format!(
                        "data [{} + {}, {} bytes) runs past the end of the {file_len}-byte file",
                        data_offset, t.offset, t.n_bytes
                    ),
                ))
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.offset, t.n_bytes));
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        // In bounds of the file (checked above), so no overflow.
        if a.offset + a.n_bytes as u64 > b.offset {
            return Err(bad(
                b,
                format!(
                    "data at offset {} overlaps tensor '{}' (offset {}, {} bytes)",
                    b.offset, a.name, a.offset, a.n_bytes
                ),
            ));
        }
    }
    Ok(())
}

/// A key or tensor name as error messages show it: a misread length can
/// make a "name" of megabytes, and the message must stay short.
fn clip(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}
