//! One file per op. Each `run` validates every length first and returns an
//! error naming the op and the shapes; only then does it compute.

pub mod add;
pub mod attention;
pub mod dequant;
pub mod dot;
pub mod get_rows;
pub mod kv_write;
pub mod matmul;
pub mod rms_norm;
pub mod rope;
pub mod swiglu;

/// Elements per parallel task in elementwise ops (fixed, so the split does
/// not depend on the thread count; elementwise results never depend on it).
pub(crate) const ELEM_CHUNK: usize = 16 * 1024;
