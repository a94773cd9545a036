//! GGML tensor element types: block layouts, dequantization and reference
//! quantization. Byte layouts follow GGML exactly so GGUF files from
//! llama.cpp load as they are.

use thiserror::Error;

mod blocks32;
mod float;
mod kquants;

pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

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
    #[error("{op}: {ty:?} is not supported (activation-side type, no weight codec)")]
    Unsupported { op: &'static str, ty: GgmlType },
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
        if !n.is_multiple_of(b) {
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

/// Bytes needed for `n` elements of `ty`, checked against `src.len()`.
fn check_src(op: &'static str, ty: GgmlType, src_len: usize, n: usize) -> Result<(), QuantError> {
    let want = ty.row_bytes(n).map_err(|e| match e {
        QuantError::NotBlockMultiple { ty, block, n, .. } => {
            QuantError::NotBlockMultiple { op, ty, block, n }
        }
        other => other,
    })?;
    if src_len != want {
        return Err(QuantError::BadLength {
            op,
            ty,
            got: src_len,
            want,
        });
    }
    Ok(())
}

/// Dequantizes `dst.len()` elements of type `ty` from `src`.
///
/// `src` must hold exactly `ty.row_bytes(dst.len())` bytes. The arithmetic
/// (operation order, single rounding per step, no FMA) is that of ggml's
/// `dequantize_row_*`, so results are bitwise equal to the `gguf` Python
/// package's numpy dequantization.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_src("dequantize", ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => float::dequant_f32(src, dst),
        GgmlType::F16 => float::dequant_f16(src, dst),
        GgmlType::BF16 => float::dequant_bf16(src, dst),
        GgmlType::Q4_0 => blocks32::dequant_q4_0(src, dst),
        GgmlType::Q4_1 => blocks32::dequant_q4_1(src, dst),
        GgmlType::Q5_0 => blocks32::dequant_q5_0(src, dst),
        GgmlType::Q5_1 => blocks32::dequant_q5_1(src, dst),
        GgmlType::Q8_0 => blocks32::dequant_q8_0(src, dst),
        GgmlType::Q4_K => kquants::dequant_q4_k(src, dst),
        GgmlType::Q5_K => kquants::dequant_q5_k(src, dst),
        GgmlType::Q6_K => kquants::dequant_q6_k(src, dst),
        GgmlType::Q8_1 | GgmlType::Q8_K => {
            return Err(QuantError::Unsupported {
                op: "dequantize",
                ty,
            })
        }
    }
    Ok(())
}

/// Reference quantizer: encodes `src` (a whole number of blocks) as `ty`.
///
/// For the 32-element block types and the float types the rounding is that
/// of ggml's `quantize_row_*_ref`. The K-quant encoders are simplified
/// versions of ggml's (no iterative scale search): valid encodings with small
/// error, meant for test and synthetic models.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let n_bytes = ty.row_bytes(src.len()).map_err(|e| match e {
        QuantError::NotBlockMultiple { ty, block, n, .. } => QuantError::NotBlockMultiple {
            op: "quantize",
            ty,
            block,
            n,
        },
        other => other,
    })?;
    let mut out = vec![0u8; n_bytes];
    match ty {
        GgmlType::F32 => float::quant_f32(src, &mut out),
        GgmlType::F16 => float::quant_f16(src, &mut out),
        GgmlType::BF16 => float::quant_bf16(src, &mut out),
        GgmlType::Q4_0 => blocks32::quant_q4_0(src, &mut out),
        GgmlType::Q4_1 => blocks32::quant_q4_1(src, &mut out),
        GgmlType::Q5_0 => blocks32::quant_q5_0(src, &mut out),
        GgmlType::Q5_1 => blocks32::quant_q5_1(src, &mut out),
        GgmlType::Q8_0 => blocks32::quant_q8_0(src, &mut out),
        GgmlType::Q4_K => kquants::quant_q4_k(src, &mut out),
        GgmlType::Q5_K => kquants::quant_q5_k(src, &mut out),
        GgmlType::Q6_K => kquants::quant_q6_k(src, &mut out),
        GgmlType::Q8_1 | GgmlType::Q8_K => {
            return Err(QuantError::Unsupported { op: "quantize", ty })
        }
    }
    Ok(out)
}

/// Whether `dequantize`/`quantize` support `ty` (the weight types).
pub fn is_weight_type(ty: GgmlType) -> bool {
    GgmlType::WEIGHT_TYPES.contains(&ty)
}
