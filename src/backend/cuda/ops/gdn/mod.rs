//! The hybrid (Gated DeltaNet, qwen35) ops: conv1d_silu, l2_norm_heads,
//! gdn_gates, delta_rule, gated_rms_norm, split_heads, sigmoid_mul.
//!
//! One canonical kernel per op (kernels/gdn.cu), the operation sequence of
//! the cpu reference (src/backend/cpu/ops/gdn.rs, hybrid.rs), so every mode
//! is bitwise equal to the cpu and batch-invariant by construction; no
//! mode picks another kernel. The two ops that carry recurrent state
//! (conv1d_silu, delta_rule) have two paths that differ only in data
//! movement, which the planner here picks from the tuning table
//! (`gdn.fused`): fused (in place, each row's slot found in the kernel) or
//! unfused (gather, out-of-place compute, scatter: the reference path).
//!
//! Here: the planner (a pure function, tested on the CPU below), the ops'
//! shape checks (the cpu's `ensure!`s), the host-side slot check, and the
//! entry table. The launchers are in `launch.rs`.

mod launch;

use super::super::tuning::GdnTuning;
use anyhow::{bail, ensure, Result};

/// Every entry point of gdn.cu (the kernel table loads these).
pub(crate) const GDN_ENTRIES: [&str; 14] = [
    "gdn_state_gather",
    "gdn_state_scatter",
    "gdn_conv_fused",
    "gdn_conv_window",
    "gdn_conv_unfolded",
    "gdn_delta_fused4",
    "gdn_delta_fused8",
    "gdn_delta_scratch4",
    "gdn_delta_scratch8",
    "gdn_l2_norm",
    "gdn_gated_rms_norm",
    "gdn_gates",
    "gdn_split_heads",
    "gdn_sigmoid_mul",
];

/// Columns (warps) per CTA of the delta-rule kernels (gdn.cu's GDN_DR_WARPS).
pub(crate) const DR_WARPS: usize = 4;

/// Most row lanes of a delta-rule launch: lane y takes the runs starting
/// in its share of the rows (gdn.cu), so a decode step of up to this many
/// rows gets a warp per row and a long prefill run launches no idle CTAs.
pub(crate) const DR_ROW_LANES: usize = 64;
/// Channels x row lanes of a `gdn_conv_fused` CTA (GDN_CONV_CH, GDN_CONV_RL).
pub(crate) const CONV_CH: usize = 32;
pub(crate) const CONV_RL: usize = 8;
/// Warps per CTA of the warp-per-(row, head) kernels (GDN_ROW_WARPS).
pub(crate) const ROW_WARPS: usize = 8;
/// The largest d_k a delta-rule warp holds in registers (8 per lane).
pub(crate) const MAX_D_K: usize = 256;

/// A state-carrying op as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StateOp {
    Conv,
    /// The delta rule with key heads of `d_k`.
    Delta {
        d_k: usize,
    },
}

/// How a state-carrying op runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// `gdn_conv_fused`: one launch, the conv state updated in place.
    ConvFused,
    /// `gdn_state_gather`, `gdn_conv_window` (the unfolded tap),
    /// `gdn_conv_unfolded`, `gdn_state_scatter`.
    ConvUnfused,
    /// `gdn_delta_fused{regs}`: one launch, state columns in registers
    /// (`regs` per lane, d_k <= 32 regs), updated in place.
    DeltaFused { regs: usize },
    /// `gdn_state_gather`, `gdn_delta_scratch{regs}`, `gdn_state_scatter`.
    DeltaUnfused { regs: usize },
}

impl Plan {
    /// The compute kernel of the plan (gather and scatter aside).
    pub(crate) fn kernel(self) -> &'static str {
        match self {
            Plan::ConvFused => "gdn_conv_fused",
            Plan::ConvUnfused => "gdn_conv_unfolded",
            Plan::DeltaFused { regs: 4 } => "gdn_delta_fused4",
            Plan::DeltaFused { .. } => "gdn_delta_fused8",
            Plan::DeltaUnfused { regs: 4 } => "gdn_delta_scratch4",
            Plan::DeltaUnfused { .. } => "gdn_delta_scratch8",
        }
    }

    /// Whether the plan needs per-row state scratch (the unfused paths).
    pub(crate) fn unfused(self) -> bool {
        matches!(self, Plan::ConvUnfused | Plan::DeltaUnfused { .. })
    }
}

/// The plan of a state-carrying op: the tuning switch picks the path (the
/// same bits either way), d_k the register count. The mode plays no part:
/// every mode runs the canonical arithmetic.
pub(crate) fn plan(op: StateOp, t: &GdnTuning) -> Result<Plan> {
    Ok(match op {
        StateOp::Conv if t.fused => Plan::ConvFused,
        StateOp::Conv => Plan::ConvUnfused,
        StateOp::Delta { d_k } => {
            let regs = match d_k {
                0 => bail!("delta_rule: d_k is 0"),
                1..=128 => 4,
                129..=MAX_D_K => 8,
                _ => bail!(
                    "delta_rule: d_k {d_k} is over the cuda kernel's {MAX_D_K} \
                     (a state column per warp in registers)"
                ),
            };
            if t.fused {
                Plan::DeltaFused { regs }
            } else {
                Plan::DeltaUnfused { regs }
            }
        }
    })
}

/// Conv state length of one slot: (kernel - 1) * channels.
pub(crate) fn conv_state_len(kernel: usize, channels: usize) -> usize {
    kernel.saturating_sub(1) * channels
}

/// Slots a state array of `state_len` values holds for slots of `len`
/// (any number when a slot holds nothing: a conv of kernel 1), as the
/// kernels' i32 bound.
pub(crate) fn n_slots(state_len: usize, len: usize) -> i32 {
    match state_len.checked_div(len) {
        Some(s) => i32::try_from(s).unwrap_or(i32::MAX),
        None => i32::MAX,
    }
}

/// The cpu's checks of a conv1d_silu over `n` rows (hybrid.rs and
/// gdn::causal_conv1d_silu): Ok(false) when there is nothing to run.
pub(crate) fn check_conv(
    x: usize,
    w: usize,
    channels: usize,
    kernel: usize,
    n: usize,
    out: usize,
) -> Result<bool> {
    ensure!(
        x == n * channels && out == x,
        "conv1d_silu: x {x} and out {out} for {n} rows of {channels} channels"
    );
    if n == 0 {
        return Ok(false);
    }
    ensure!(
        channels > 0 && kernel > 0,
        "conv1d_silu: zero size in channels {channels}, kernel {kernel}"
    );
    ensure!(
        w == channels * kernel,
        "conv1d_silu: w has {w} elements, expected channels {channels} * kernel {kernel}"
    );
    Ok(true)
}

/// The cpu's checks of a delta_rule over `n` rows: Ok(false) when there
/// is nothing to run.
pub(crate) fn check_delta(
    (h_k, h_v, d_k, d_v): (usize, usize, usize, usize),
    qkv: usize,
    g: usize,
    beta: usize,
    n: usize,
    out: usize,
) -> Result<bool> {
    ensure!(
        h_k > 0 && h_v > 0 && d_k > 0 && d_v > 0,
        "delta_rule: zero size in h_k {h_k}, h_v {h_v}, d_k {d_k}, d_v {d_v}"
    );
    ensure!(
        h_v.is_multiple_of(h_k),
        "delta_rule: h_v {h_v} is not a multiple of h_k {h_k}"
    );
    let (kd, vd) = (h_k * d_k, h_v * d_v);
    let width = 2 * kd + vd;
    ensure!(
        qkv == n * width && out == n * vd,
        "delta_rule: qkv {qkv} (rows of {width}) and out {out} (rows of {vd}) for {n} rows"
    );
    ensure!(
        g == n * h_v && beta == g,
        "delta_rule: g {g} and beta {beta} for {n} rows of {h_v} heads"
    );
    Ok(n > 0)
}

/// The cpu's checks of l2_norm_heads: Ok(false) when there is nothing to run.
pub(crate) fn check_l2(x: usize, row_len: usize, n_heads: usize, head_dim: usize) -> Result<bool> {
    let width = n_heads * head_dim;
    ensure!(
        row_len > 0 && width <= row_len && x.is_multiple_of(row_len),
        "l2_norm_heads: {n_heads} heads of {head_dim} in rows of {row_len} ({x} values)"
    );
    Ok(x > 0 && width > 0)
}

/// The cpu's checks of gdn_gates (h_v = dt_bias's length).
pub(crate) fn check_gates(
    a: usize,
    b: usize,
    dt_bias: usize,
    ssm_a: usize,
    g: usize,
    beta: usize,
) -> Result<()> {
    let h_v = dt_bias;
    ensure!(h_v > 0, "gdn_gates: dt_bias is empty");
    ensure!(
        ssm_a == h_v,
        "gdn_gates: ssm_a has {ssm_a} elements, dt_bias {h_v}"
    );
    ensure!(
        a.is_multiple_of(h_v) && b == a && g == a && beta == a,
        "gdn_gates: a {a}, b {b}, g_out {g}, beta_out {beta} elements; \
         expected equal multiples of h_v {h_v}"
    );
    Ok(())
}

/// The cpu's checks of gated_rms_norm.
pub(crate) fn check_gated_rms(
    x: usize,
    z: usize,
    w: usize,
    head_dim: usize,
    out: usize,
) -> Result<()> {
    ensure!(head_dim > 0, "gated_rms_norm: head_dim is 0");
    ensure!(
        w == head_dim,
        "gated_rms_norm: w has {w} elements, expected head_dim {head_dim}"
    );
    ensure!(
        x.is_multiple_of(head_dim) && z == x && out == x,
        "gated_rms_norm: x {x}, z {z}, out {out} elements; expected equal multiples of \
         head_dim {head_dim}"
    );
    Ok(())
}

/// The cpu's checks of split_heads.
pub(crate) fn check_split(x: usize, head_dim: usize, a: usize, b: usize) -> Result<()> {
    ensure!(
        head_dim > 0 && x.is_multiple_of(2 * head_dim) && a * 2 == x && b == a,
        "split_heads: x {x} into a {a} and b {b} with head_dim {head_dim}"
    );
    Ok(())
}

/// A host `row_slots` against a state array of `state_len` values in slots
/// of `len` (the cpu's checks, hybrid.rs: each slot's rows consecutive,
/// every slot in range). Device-side slots cannot be read without a
/// download; the kernels bound them instead (gdn.cu).
pub(crate) fn check_row_slots(row_slots: &[u32], state_len: usize, len: usize) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for (i, &s) in row_slots.iter().enumerate() {
        if i > 0 && row_slots[i - 1] == s {
            continue;
        }
        ensure!(
            seen.insert(s),
            "row {i}: state slot {s} appears again after other slots \
             (a slot's rows must be consecutive)"
        );
        let end = (s as usize).checked_add(1).and_then(|e| e.checked_mul(len));
        ensure!(
            end.is_some_and(|e| e <= state_len),
            "state slot {s} is out of range: the state holds {} slots of {len}",
            state_len / len.max(1)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(fused: bool) -> GdnTuning {
        GdnTuning { fused }
    }

    #[test]
    fn plans_follow_the_switch_and_d_k() {
        let table: &[(StateOp, bool, Plan)] = &[
            (StateOp::Conv, true, Plan::ConvFused),
            (StateOp::Conv, false, Plan::ConvUnfused),
            (
                StateOp::Delta { d_k: 1 },
                true,
                Plan::DeltaFused { regs: 4 },
            ),
            (
                StateOp::Delta { d_k: 48 },
                true,
                Plan::DeltaFused { regs: 4 },
            ),
            (
                StateOp::Delta { d_k: 128 },
                true,
                Plan::DeltaFused { regs: 4 },
            ),
            (
                StateOp::Delta { d_k: 129 },
                true,
                Plan::DeltaFused { regs: 8 },
            ),
            (
                StateOp::Delta { d_k: 256 },
                true,
                Plan::DeltaFused { regs: 8 },
            ),
            (
                StateOp::Delta { d_k: 48 },
                false,
                Plan::DeltaUnfused { regs: 4 },
            ),
            (
                StateOp::Delta { d_k: 200 },
                false,
                Plan::DeltaUnfused { regs: 8 },
            ),
        ];
        for &(op, fused, want) in table {
            assert_eq!(plan(op, &t(fused)).unwrap(), want, "{op:?} fused={fused}");
        }
        for fused in [true, false] {
            assert!(plan(StateOp::Delta { d_k: 0 }, &t(fused)).is_err());
            let e = plan(StateOp::Delta { d_k: 257 }, &t(fused)).unwrap_err();
            assert!(format!("{e}").contains("257"), "{e}");
        }
    }

    #[test]
    fn the_default_is_fused_and_every_plan_names_a_loaded_kernel() {
        let d = GdnTuning::for_arch(9);
        assert_eq!(plan(StateOp::Conv, &d).unwrap(), Plan::ConvFused);
        assert_eq!(
            plan(StateOp::Delta { d_k: 128 }, &d).unwrap(),
            Plan::DeltaFused { regs: 4 }
        );
        for p in [
            Plan::ConvFused,
            Plan::ConvUnfused,
            Plan::DeltaFused { regs: 4 },
            Plan::DeltaFused { regs: 8 },
            Plan::DeltaUnfused { regs: 4 },
            Plan::DeltaUnfused { regs: 8 },
        ] {
            assert!(GDN_ENTRIES.contains(&p.kernel()), "{p:?}");
            assert_eq!(
                p.unfused(),
                matches!(p, Plan::ConvUnfused | Plan::DeltaUnfused { .. })
            );
        }
        // The unfused paths' data movement and window kernels are loaded too.
        for k in ["gdn_state_gather", "gdn_state_scatter", "gdn_conv_window"] {
            assert!(GDN_ENTRIES.contains(&k));
        }
    }

    #[test]
    fn the_kernel_constants_match_gdn_cu() {
        let src = include_str!("kernels/gdn.cu");
        for (name, v) in [
            ("GDN_DR_WARPS", DR_WARPS),
            ("GDN_CONV_CH", CONV_CH),
            ("GDN_CONV_RL", CONV_RL),
            ("GDN_ROW_WARPS", ROW_WARPS),
        ] {
            let want = ["#define".to_string(), name.to_string(), v.to_string()];
            assert!(
                src.lines().any(|l| {
                    let w: Vec<&str> = l.split_whitespace().take(3).collect();
                    w == want
                }),
                "gdn.cu: #define {name} {v}"
            );
        }
        for e in GDN_ENTRIES {
            assert!(src.contains(&format!("{e}(")), "gdn.cu has no entry {e}");
        }
    }

    #[test]
    fn slot_counts() {
        assert_eq!(n_slots(12, 4), 3);
        assert_eq!(n_slots(13, 4), 3);
        assert_eq!(n_slots(0, 0), i32::MAX);
        assert_eq!(n_slots(usize::MAX, 1), i32::MAX);
        assert_eq!(conv_state_len(4, 10), 30);
        assert_eq!(conv_state_len(1, 10), 0);
        assert_eq!(conv_state_len(0, 10), 0);
    }

    #[test]
    fn host_slots_are_checked_as_the_cpu_checks_them() {
        assert!(check_row_slots(&[2, 2, 2, 0, 5, 5], 6 * 4, 4).is_ok());
        assert!(check_row_slots(&[3, 1, 4], 5 * 4, 4).is_ok());
        assert!(check_row_slots(&[], 0, 4).is_ok());
        // A slot back after another one's rows.
        assert!(check_row_slots(&[1, 2, 1], 3 * 4, 4).is_err());
        // Out of range, also by overflow.
        assert!(check_row_slots(&[0, 6], 6 * 4, 4).is_err());
        assert!(check_row_slots(&[u32::MAX], 6 * 4, usize::MAX).is_err());
        // Slots of nothing (a conv of kernel 1): any slot.
        assert!(check_row_slots(&[7, 9], 0, 0).is_ok());
    }

    #[test]
    fn shape_checks_mirror_the_cpu() {
        assert!(check_conv(12, 8, 4, 2, 3, 12).unwrap());
        assert!(!check_conv(0, 0, 0, 0, 0, 0).unwrap());
        assert!(check_conv(12, 8, 4, 2, 3, 11).is_err());
        assert!(check_conv(12, 7, 4, 2, 3, 12).is_err());
        assert!(check_conv(0, 0, 0, 4, 2, 0).is_err());
        // h_k 1, h_v 2, d_k 3, d_v 2: rows of 2*3 + 4 = 10.
        let s = (1, 2, 3, 2);
        assert!(check_delta(s, 20, 4, 4, 2, 8).unwrap());
        assert!(!check_delta(s, 0, 0, 0, 0, 0).unwrap());
        assert!(check_delta(s, 19, 4, 4, 2, 8).is_err());
        assert!(check_delta(s, 20, 4, 3, 2, 8).is_err());
        assert!(check_delta((2, 3, 3, 2), 0, 0, 0, 0, 0).is_err());
        assert!(check_delta((1, 2, 0, 2), 0, 0, 0, 0, 0).is_err());
        assert!(check_l2(20, 10, 2, 4).unwrap());
        assert!(!check_l2(20, 10, 2, 0).unwrap());
        assert!(check_l2(20, 10, 3, 4).is_err());
        assert!(check_l2(20, 0, 0, 0).is_err());
        assert!(check_gates(6, 6, 3, 3, 6, 6).is_ok());
        assert!(check_gates(6, 6, 0, 0, 6, 6).is_err());
        assert!(check_gates(6, 6, 3, 2, 6, 6).is_err());
        assert!(check_gates(6, 6, 4, 4, 6, 6).is_err());
        assert!(check_gated_rms(8, 8, 4, 4, 8).is_ok());
        assert!(check_gated_rms(8, 8, 3, 4, 8).is_err());
        assert!(check_gated_rms(8, 8, 0, 0, 8).is_err());
        assert!(check_split(8, 2, 4, 4).is_ok());
        assert!(check_split(8, 3, 4, 4).is_err());
        assert!(check_split(8, 2, 4, 3).is_err());
    }
}
