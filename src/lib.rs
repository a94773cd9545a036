//! Quire: an LLM inference engine for GGUF models with a paged KV cache,
//! decode-first batching and reproducible-by-construction outputs.
//! See docs/ARCHITECTURE.md for the map of modules.

pub mod backend;
pub mod cli;
pub mod constrain;
pub mod dispatch;
pub mod engine;
pub mod fetch;
pub mod gguf;
pub mod hub;
pub mod kv;
pub mod model;
pub mod opcheck;
pub mod quant;
pub mod runner;
pub mod sampler;
pub mod scheduler;
pub mod serve;
pub mod server;
pub mod tokenizer;
