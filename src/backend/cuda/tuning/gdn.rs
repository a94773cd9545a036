//! The Gated DeltaNet family's part of the tuning table (see
//! `tuning/mod.rs`). The planner (ops/gdn/mod.rs) reads it. Every form it
//! picks computes the same canonical arithmetic (only where the recurrent
//! state is read and written differs), so no field changes a bit of any
//! mode's output (the planner's tests assert the plans it maps to).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GdnTuning {
    /// `conv1d_silu` and `delta_rule` update the recurrent state in place
    /// and find each row's state slot inside the kernel (one launch each).
    /// Off: the unfused reference path, as llama.cpp runs these ops
    /// without its fusions: the slots' states gathered into a per-row
    /// scratch buffer, the op computed out of place (the conv through an
    /// explicit window buffer), the final states scattered back (three or
    /// four launches and an (n, state) scratch allocation; not inside a
    /// graph capture). The same bits either way.
    pub fused: bool,
}

impl GdnTuning {
    /// Defaults for compute capability `major` (the same everywhere).
    pub fn for_arch(_major: u32) -> Self {
        GdnTuning { fused: true }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Tuning, TuningOverrides};

    #[test]
    fn fused_by_default_and_switchable_by_key() {
        for arch in ["sm_80", "sm_90", "sm_100"] {
            assert!(Tuning::for_arch(arch).gdn.fused, "{arch}");
        }
        let o = TuningOverrides::none().set("gdn.fused", "false").unwrap();
        assert!(!Tuning::resolve("sm_90", &o).unwrap().gdn.fused);
    }
}
