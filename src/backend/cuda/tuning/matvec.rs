//! The matvec family's part of the tuning table (see `tuning/mod.rs`):
//! the fusions between a step's ops (fusion.rs, ops/matmul/norm_ahead.rs,
//! ops/matmul/prepared.rs) and the L2 read-ahead of decode graphs
//! (ops/l2_ahead).

use super::Switch;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatvecTuning {
    /// Norms, SwiGLUs and the attention write their output also as the
    /// int8 blocks (or the wgmma GEMM's f16 tiles) that the next matmul
    /// reads, so it quantizes nothing itself. The same bits either way;
    /// off runs the separate quantize kernels (the reference of
    /// `check-exact --mode fast`).
    pub prequant: bool,
    /// Norm-ahead (ops/matmul/norm_ahead.rs, `fast`, one row): a residual
    /// matvec prepares the next op's normalized int8 input. `auto`: rows
    /// of at most 1,024 values (faster on SmolLM2, slower on the 1B and
    /// 8B). Not the bits of the plain graph (`check-exact --mode
    /// fast-norm-ahead` checks it).
    pub norm_ahead: Switch,
    /// Norm-ahead's producer runs as a thread-block cluster of 4 CTAs
    /// where the device has clusters (sm_90+); off: the one-CTA form
    /// (`mv_q8_r1_na`, the form before sm_90) everywhere, for its parity
    /// coverage on a Hopper.
    pub norm_ahead_clusters: bool,
    /// Distance of the L2 read-ahead of one-row `fast` decode graphs, MiB:
    /// null follows the step's weight bytes (`auto_ahead`: Q4_0 / Q4_1 /
    /// Q8_0 steps of 256 MiB or more, total / 48 within 4-16 MiB); 0
    /// turns the read-ahead off; N forces N MiB on every decode graph of
    /// any row count. The same bits either way.
    pub l2_ahead_mb: Option<u64>,
    /// KiB per bulk prefetch of the read-ahead (rounded into 4 KiB..1 GiB).
    pub l2_piece_kb: u64,
    /// CTAs (one warp each) of the read-ahead grid (1..=1,024); 64 made
    /// every step after a 512-token prompt wait out the kernel's patience
    /// (L2A_PATIENCE_NS in l2_ahead_fast.cu).
    pub l2_ctas: u32,
}

impl MatvecTuning {
    /// Defaults for compute capability `major` (9 = Hopper).
    pub fn for_arch(_major: u32) -> Self {
        MatvecTuning {
            prequant: true,
            norm_ahead: Switch::Auto,
            norm_ahead_clusters: true,
            l2_ahead_mb: None,
            l2_piece_kb: 64,
            l2_ctas: 32,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::cuda::{Switch, Tuning, TuningOverrides};

    #[test]
    fn the_fusion_keys_take_their_values_from_tune() {
        // As gpu-check.sh and check-exact set them.
        let o = TuningOverrides::none()
            .set("matvec.l2_ahead_mb", "0")
            .unwrap()
            .set("matvec.norm_ahead", "on")
            .unwrap()
            .set("matvec.norm_ahead_clusters", "false")
            .unwrap()
            .set("matvec.prequant", "false")
            .unwrap();
        let t = Tuning::resolve("sm_90", &o).unwrap().matvec;
        assert_eq!(t.l2_ahead_mb, Some(0));
        assert_eq!(t.norm_ahead, Switch::On);
        assert!(!t.norm_ahead_clusters && !t.prequant);
        // The defaults: automatic distance and norm-ahead rule, clusters,
        // prequant on.
        let d = Tuning::for_arch("sm_90").matvec;
        assert_eq!((d.l2_ahead_mb, d.norm_ahead), (None, Switch::Auto));
        assert!(d.norm_ahead_clusters && d.prequant);
        assert_eq!((d.l2_piece_kb, d.l2_ctas), (64, 32));
        // Back to automatic from a file's null.
        let o = TuningOverrides::from_json(r#"{"matvec": {"l2_ahead_mb": null}}"#).unwrap();
        assert_eq!(
            Tuning::resolve("sm_80", &o).unwrap().matvec.l2_ahead_mb,
            None
        );
    }
}
