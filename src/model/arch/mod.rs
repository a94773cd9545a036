//! One file per architecture graph.

pub mod llama;
pub mod qwen35;
