//! GGML tensor element types: block layouts, dequantization and reference
//! quantization. Byte layouts follow GGML exactly so GGUF files from
//! llama.cpp load as they are.

use thiserror::Error;

/// A GGML tensor type as stored in GGUF (`ggml_type` numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    /// Activation-side type (CPU matmul); never a weight type in our files.
    Q8_1,
    Q4_K,
    Q5_K,
    Q6_K,
    /// Activation-side type for K-quant dot products.
    Q8_K,
}

#[derive(Debug, Error)]
pub enum QuantError {
    #[error("unknown or unsupported GGML type id {0}")]
    UnknownType(u32),
    #[error("{op}: {ty:?} needs a multiple of {block} elements, got {n}")]
    NotBlockMultiple {
        op: &'static str,
        ty: GgmlType,
        block: usize,
        n: usize,
    },
    #[error("{op}: {ty:?} buffer of {got} bytes, expected {want}")]
    BadLength {
        op: &'static str,
        ty: GgmlType,
        got: usize,
        want: usize,
    },
}

impl GgmlType {
    /// Every type a GGUF weight may have in Quire.
    pub const WEIGHT_TYPES: [GgmlType; 11] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// The `ggml_type` id stored in GGUF.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::BF16 => 30,
        }
    }

    pub fn from_id(id: u32) -> Result<Self, QuantError> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            30 => GgmlType::BF16,
            other => return Err(QuantError::UnknownType(other)),
        })
    }

    /// GGML's name for a type id, also for ids Quire does not support (for
    /// error messages that name the type).
    pub fn name_of_id(id: u32) -> &'static str {
        match id {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            4 => "Q4_2 (removed)",
            5 => "Q4_3 (removed)",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => "unknown",
        }
    }

    pub fn name(self) -> &'static str {
        Self::name_of_id(self.id())
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1 => 32,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_K => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q8_1 => 36,
            GgmlType::Q4_K => 144,
            GgmlType::Q5_K => 176,
            GgmlType::Q6_K => 210,
            GgmlType::Q8_K => 292,
        }
    }

    /// Bytes of `n` elements; errors unless `n` is a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize, QuantError> {
        let b = self.block_size();
        if n % b != 0 {
            return Err(QuantError::NotBlockMultiple {
                op: "row_bytes",
                ty: self,
                block: b,
                n,
            });
        }
        Ok(n / b * self.type_size())
    }
}
