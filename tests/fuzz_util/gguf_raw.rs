//! A GGUF file as an editable structure: every count, length, type id and
//! offset the reader trusts is a field here, so a mutation can make it lie
//! about the bytes that follow. [`RawGguf::to_bytes`] writes it (GGUF v3,
//! little-endian) and records the byte boundaries truncation cuts at.

use quire::gguf::{GgufFile, GgufValue};

/// A string as written: the declared length may differ from the bytes.
#[derive(Clone, Debug)]
pub struct RawStr {
    pub bytes: Vec<u8>,
    pub len_override: Option<u64>,
}

impl RawStr {
    pub fn new(b: impl Into<Vec<u8>>) -> RawStr {
        RawStr {
            bytes: b.into(),
            len_override: None,
        }
    }
}

/// A metadata value's payload (its type id is written by the parent).
#[derive(Clone, Debug)]
pub enum RawVal {
    /// A fixed-width value: its GGUF type id and little-endian bytes.
    Scalar {
        ty: u32,
        bytes: Vec<u8>,
    },
    Str(RawStr),
    /// The element type id and count are written as given; the items keep
    /// their own encodings, so a changed element type misreads them.
    Array {
        elem_ty: u32,
        len_override: Option<u64>,
        items: Vec<RawVal>,
    },
}

pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;

impl RawVal {
    pub fn ty(&self) -> u32 {
        match self {
            RawVal::Scalar { ty, .. } => *ty,
            RawVal::Str(_) => T_STRING,
            RawVal::Array { .. } => T_ARRAY,
        }
    }

    pub fn from_value(v: &GgufValue) -> RawVal {
        let s = |ty: u32, b: &[u8]| RawVal::Scalar {
            ty,
            bytes: b.to_vec(),
        };
        match v {
            GgufValue::U8(x) => s(0, &x.to_le_bytes()),
            GgufValue::I8(x) => s(1, &x.to_le_bytes()),
            GgufValue::U16(x) => s(2, &x.to_le_bytes()),
            GgufValue::I16(x) => s(3, &x.to_le_bytes()),
            GgufValue::U32(x) => s(4, &x.to_le_bytes()),
            GgufValue::I32(x) => s(5, &x.to_le_bytes()),
            GgufValue::F32(x) => s(6, &x.to_le_bytes()),
            GgufValue::Bool(x) => s(7, &[*x as u8]),
            GgufValue::U64(x) => s(10, &x.to_le_bytes()),
            GgufValue::I64(x) => s(11, &x.to_le_bytes()),
            GgufValue::F64(x) => s(12, &x.to_le_bytes()),
            GgufValue::String(x) => RawVal::Str(RawStr::new(x.as_bytes())),
            GgufValue::Array(items) => RawVal::Array {
                elem_ty: items.first().map(|i| i.type_id()).unwrap_or(4),
                len_override: None,
                items: items.iter().map(RawVal::from_value).collect(),
            },
        }
    }
}

#[derive(Clone, Debug)]
pub struct RawKv {
    pub key: RawStr,
    /// Written instead of the value's own type id when set.
    pub ty_override: Option<u32>,
    pub val: RawVal,
}

#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: RawStr,
    /// Written instead of `dims.len()` when set.
    pub n_dims_override: Option<u32>,
    pub dims: Vec<u64>,
    pub ty: u32,
    /// Relative to the start of the data section.
    pub offset: u64,
}

#[derive(Clone, Debug)]
pub struct RawGguf {
    pub magic: [u8; 4],
    pub version: u32,
    pub n_tensors_override: Option<u64>,
    pub n_kv_override: Option<u64>,
    pub kvs: Vec<RawKv>,
    pub tensors: Vec<RawTensor>,
    /// The padding the writer puts before the data section (the alignment
    /// key may say something else).
    pub pad_align: u64,
    /// The data section, as in the source file.
    pub data: Vec<u8>,
}

/// Serialized bytes plus the offsets where structures end.
pub struct Written {
    pub bytes: Vec<u8>,
    pub boundaries: Vec<usize>,
}

fn put_str(out: &mut Vec<u8>, s: &RawStr) {
    let len = s.len_override.unwrap_or(s.bytes.len() as u64);
    out.extend(len.to_le_bytes());
    out.extend(&s.bytes);
}

fn put_payload(out: &mut Vec<u8>, v: &RawVal) {
    match v {
        RawVal::Scalar { bytes, .. } => out.extend(bytes),
        RawVal::Str(s) => put_str(out, s),
        RawVal::Array {
            elem_ty,
            len_override,
            items,
        } => {
            out.extend(elem_ty.to_le_bytes());
            out.extend(len_override.unwrap_or(items.len() as u64).to_le_bytes());
            for i in items {
                put_payload(out, i);
            }
        }
    }
}

impl RawGguf {
    /// The structure of a file the reader accepted.
    pub fn from_file(f: &GgufFile) -> RawGguf {
        let start = f.data_offset() as usize;
        RawGguf {
            magic: *b"GGUF",
            version: f.version(),
            n_tensors_override: None,
            n_kv_override: None,
            kvs: f
                .metadata()
                .iter()
                .map(|(k, v)| RawKv {
                    key: RawStr::new(k.as_bytes()),
                    ty_override: None,
                    val: RawVal::from_value(v),
                })
                .collect(),
            tensors: f
                .tensors()
                .iter()
                .map(|t| RawTensor {
                    name: RawStr::new(t.name.as_bytes()),
                    n_dims_override: None,
                    dims: t.dims.clone(),
                    ty: t.ty.id(),
                    offset: t.offset,
                })
                .collect(),
            pad_align: f.alignment(),
            data: f.bytes()[start..].to_vec(),
        }
    }

    pub fn to_bytes(&self) -> Written {
        let mut out = Vec::with_capacity(self.data.len() + (1 << 16));
        let mut bd = Vec::new();
        out.extend(self.magic);
        bd.push(out.len());
        out.extend(self.version.to_le_bytes());
        bd.push(out.len());
        let nt = self.n_tensors_override.unwrap_or(self.tensors.len() as u64);
        out.extend(nt.to_le_bytes());
        bd.push(out.len());
        let nk = self.n_kv_override.unwrap_or(self.kvs.len() as u64);
        out.extend(nk.to_le_bytes());
        bd.push(out.len());
        for kv in &self.kvs {
            put_str(&mut out, &kv.key);
            bd.push(out.len());
            out.extend(kv.ty_override.unwrap_or(kv.val.ty()).to_le_bytes());
            bd.push(out.len());
            put_payload(&mut out, &kv.val);
            bd.push(out.len());
        }
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            let nd = t.n_dims_override.unwrap_or(t.dims.len() as u32);
            out.extend(nd.to_le_bytes());
            bd.push(out.len());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(t.offset.to_le_bytes());
            bd.push(out.len());
        }
        // Pad only with a sane alignment (an absurd one is the key's job).
        let a = self.pad_align as usize;
        if (1..=1 << 16).contains(&a) {
            while out.len() % a != 0 {
                out.push(0);
            }
        }
        let data_start = out.len();
        bd.push(data_start);
        for t in &self.tensors {
            let s = data_start.saturating_add(t.offset as usize);
            if s <= data_start + self.data.len() {
                bd.push(s);
            }
        }
        out.extend(&self.data);
        bd.push(out.len());
        Written {
            bytes: out,
            boundaries: bd,
        }
    }
}
