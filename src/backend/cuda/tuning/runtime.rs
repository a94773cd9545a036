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
    /// Decoding whose draw reads the logits alone chooses each step's
    /// token on the device inside the decode graph and feeds it to the
    /// next step there (runner/greedy.rs, dispatch/cuda/greedy.rs); off:
    /// every step's logits are downloaded and sampled on the host. The
    /// same tokens either way (`quire check-greedy`).
    pub greedy_chain: bool,
    /// The device sampler (`sample_rows`) draws a row on a cluster of 8
    /// CTAs (sm_90+ only: clusters need it) rather than on one CTA. The
    /// same tokens either way; the cluster spreads a row's passes over
    /// the logits over 8 SMs.
    pub sample_cluster: bool,
}

impl RuntimeTuning {
    /// Defaults for compute capability `major` (9 = Hopper).
    pub fn for_arch(major: u32) -> Self {
        RuntimeTuning {
            graphs: true,
            pdl: major >= 9,
            greedy_chain: true,
            sample_cluster: major >= 9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeTuning;

    #[test]
    fn defaults_per_architecture() {
        // Hopper: programmatic launch and the sampler's clusters.
        let h = RuntimeTuning::for_arch(9);
        assert!(h.graphs && h.pdl && h.greedy_chain && h.sample_cluster);
        // Before it: neither (clusters need sm_90); graphs and the chain
        // everywhere.
        let a = RuntimeTuning::for_arch(8);
        assert!(a.graphs && !a.pdl && a.greedy_chain && !a.sample_cluster);
    }
}
