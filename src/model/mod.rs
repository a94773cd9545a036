//! Model graphs built from GGUF weights.

pub mod arch;
pub mod config;
mod loaded;
pub mod shard;
pub mod synth;
pub mod weights;

/// The host KV storage (owned by `kv`), re-exported for the graph.
pub use crate::kv::KvStorage;
pub use arch::llama::LlamaModel;
pub use arch::qwen35::Qwen35Model;
pub use config::{Arch, GdnConfig, ModelConfig};
pub use loaded::Model;

/// The inputs of one step (defined by dispatch, which runs them).
pub use crate::dispatch::StepInput;
