//! The runtime's part of the tuning table (see `tuning/mod.rs`): how steps
//! are launched rather than which kernels they run.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeTuning {
    /// Decode steps replay captured CUDA graphs (off: op by op; for
    /// debugging, the same bits).
    pub graphs: bool,
    /// Programmatic dependent launch between a graph's kernels (sm_90+).
    pub pdl: bool,
}

impl RuntimeTuning {
    /// Defaults for compute capability `major` (9 = Hopper).
    pub fn for_arch(major: u32) -> Self {
        RuntimeTuning {
            graphs: true,
            pdl: major >= 9,
        }
    }
}
