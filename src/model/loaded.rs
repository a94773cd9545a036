//! A loaded model of any supported architecture: the runner holds one and
//! asks it for its config and its step graph.

use super::arch::qwen35::Qwen35Model;
use super::{Arch, LlamaModel, ModelConfig};
use crate::gguf::GgufFile;
use anyhow::Result;

pub enum Model {
    /// The llama family (llama, mistral, qwen2, qwen3): `arch/llama.rs`.
    Llama(LlamaModel),
    /// Qwen3.5 / 3.6 dense hybrids: `arch/qwen35.rs`, `arch/qwen35_graph.rs`.
    Qwen35(Qwen35Model),
}

impl Model {
    /// Loads the graph `cfg.arch` names; `progress(done, total)` counts layers.
    pub fn load(g: &GgufFile, cfg: ModelConfig, progress: &dyn Fn(usize, usize)) -> Result<Model> {
        Ok(match cfg.arch {
            Arch::Qwen35 => Model::Qwen35(Qwen35Model::load(g, cfg, progress)?),
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {
                Model::Llama(LlamaModel::load(g, cfg, progress)?)
            }
        })
    }

    pub fn cfg(&self) -> &ModelConfig {
        match self {
            Model::Llama(m) => &m.cfg,
            Model::Qwen35(m) => &m.cfg,
        }
    }

    /// Layers that read and write the paged KV cache (all of a llama; the
    /// full-attention layers of a hybrid).
    pub fn n_kv_layers(&self) -> usize {
        let c = self.cfg();
        (0..c.n_layers).filter(|&i| !c.is_recurrent(i)).count()
    }
}
