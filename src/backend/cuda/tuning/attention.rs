//! The attention family's part of the tuning table (see `tuning/mod.rs`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionTuning {}

impl AttentionTuning {
    /// Defaults for compute capability `major` (9 = Hopper).
    pub fn for_arch(_major: u32) -> Self {
        AttentionTuning {}
    }
}
