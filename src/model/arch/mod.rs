//! One file per architecture graph.

pub mod llama;
pub mod llama_tp;
pub mod qwen35;
pub mod qwen35_graph;
