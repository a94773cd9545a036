//! GGUF metadata values.

use std::fmt;

/// GGUF metadata value type ids (`gguf_type`).
pub mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One GGUF metadata value. Arrays may nest; GGUF requires all elements of
/// an array to have one type, which the writer checks.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => type_id::U8,
            GgufValue::I8(_) => type_id::I8,
            GgufValue::U16(_) => type_id::U16,
            GgufValue::I16(_) => type_id::I16,
            GgufValue::U32(_) => type_id::U32,
            GgufValue::I32(_) => type_id::I32,
            GgufValue::U64(_) => type_id::U64,
            GgufValue::I64(_) => type_id::I64,
            GgufValue::F32(_) => type_id::F32,
            GgufValue::F64(_) => type_id::F64,
            GgufValue::Bool(_) => type_id::BOOL,
            GgufValue::String(_) => type_id::STRING,
            GgufValue::Array(_) => type_id::ARRAY,
        }
    }

    /// A short type name for error messages ("u32", "array of string", ...).
    pub fn type_name(&self) -> String {
        match self {
            GgufValue::Array(v) => match v.first() {
                Some(e) => format!("array of {}", e.type_name()),
                None => "empty array".to_string(),
            },
            other => type_name_of_id(other.type_id()).to_string(),
        }
    }

    /// The value as an i128 when it is an integer (any width or sign).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v as i128,
            GgufValue::I8(v) => v as i128,
            GgufValue::U16(v) => v as i128,
            GgufValue::I16(v) => v as i128,
            GgufValue::U32(v) => v as i128,
            GgufValue::I32(v) => v as i128,
            GgufValue::U64(v) => v as i128,
            GgufValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// The value as f64 when it is F32 or F64.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// Name of a GGUF value type id.
pub fn type_name_of_id(id: u32) -> &'static str {
    match id {
        type_id::U8 => "u8",
        type_id::I8 => "i8",
        type_id::U16 => "u16",
        type_id::I16 => "i16",
        type_id::U32 => "u32",
        type_id::I32 => "i32",
        type_id::F32 => "f32",
        type_id::BOOL => "bool",
        type_id::STRING => "string",
        type_id::ARRAY => "array",
        type_id::U64 => "u64",
        type_id::I64 => "i64",
        type_id::F64 => "f64",
        _ => "unknown",
    }
}

impl fmt::Display for GgufValue {
    /// Compact display; long arrays are elided (for `quire info` style dumps).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(v) => write!(f, "{v}"),
            GgufValue::I8(v) => write!(f, "{v}"),
            GgufValue::U16(v) => write!(f, "{v}"),
            GgufValue::I16(v) => write!(f, "{v}"),
            GgufValue::U32(v) => write!(f, "{v}"),
            GgufValue::I32(v) => write!(f, "{v}"),
            GgufValue::U64(v) => write!(f, "{v}"),
            GgufValue::I64(v) => write!(f, "{v}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(s) => write!(f, "{s:?}"),
            GgufValue::Array(v) => {
                write!(f, "[")?;
                for (i, e) in v.iter().take(8).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{e}")?;
                }
                if v.len() > 8 {
                    write!(f, ", ... ({} items)", v.len())?;
                }
                write!(f, "]")
            }
        }
    }
}

macro_rules! from_impl {
    ($t:ty, $v:ident) => {
        impl From<$t> for GgufValue {
            fn from(x: $t) -> Self {
                GgufValue::$v(x)
            }
        }
    };
}
from_impl!(u8, U8);
from_impl!(i8, I8);
from_impl!(u16, U16);
from_impl!(i16, I16);
from_impl!(u32, U32);
from_impl!(i32, I32);
from_impl!(u64, U64);
from_impl!(i64, I64);
from_impl!(f32, F32);
from_impl!(f64, F64);
from_impl!(bool, Bool);
from_impl!(String, String);

impl From<&str> for GgufValue {
    fn from(x: &str) -> Self {
        GgufValue::String(x.to_string())
    }
}

impl<T: Into<GgufValue>> From<Vec<T>> for GgufValue {
    fn from(v: Vec<T>) -> Self {
        GgufValue::Array(v.into_iter().map(Into::into).collect())
    }
}
