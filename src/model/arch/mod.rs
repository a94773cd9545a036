//! One file per architecture graph.

pub mod llama;
