//! The fused gate/up + SwiGlu matvec's forms (kernels/matmul_glu_fast.cu)
//! and the rule that picks one.

use super::MmCaps;
use crate::backend::cuda::tuning::{GluForm, MatmulTuning, Switch};

/// The fused launch's entries: name, warps per CTA, CTAs per cluster
/// (sharing one block of 32 indices).
pub(crate) const GLU_FORMS: [(&str, usize, usize); 6] = [
    ("mv_q8_r1_glu8", 8, 1),
    ("mv_q8_r1_glu16", 16, 1),
    ("mv_q8_r1_glu32", 32, 1),
    ("mv_q8_r1_glu8c2", 8, 2),
    ("mv_q8_r1_glu8c4", 8, 4),
    ("mv_q8_r1_glu16c2", 16, 2),
];

/// The form for `blocks` blocks of 32 indices, or None where the unfused
/// pair is the faster or the table turns the fusion off. A form fixed by
/// the table is taken where the device has its clusters (sm_90+); the
/// forced short-row matvec (`mv_short` On) gives other bits than the
/// fused launch's mv_q8_r1 ones, so it turns the fusion off. The rule: at
/// 48 warps per SM a form of W warps holds 1,536 / (32 W) CTAs per SM; it
/// takes the form whose grid is one wave. `nc`: the input is norm-ahead's
/// blocks (no norm launch before this op), where a grid of at most one
/// block per SM takes 32 warps a block (SmolLM2's 48 blocks: +2.6% after
/// 512 tokens on an H200, where without norm-ahead no form paid).
pub(crate) fn glu_form(
    blocks: usize,
    nc: bool,
    caps: &MmCaps,
    t: &MatmulTuning,
) -> Option<(&'static str, usize, usize)> {
    if t.mv_short == Switch::On {
        return None;
    }
    let fixed = match t.mv_glu_form {
        GluForm::Auto => None,
        GluForm::Off => return None,
        GluForm::Glu8 => Some(0),
        GluForm::Glu16 => Some(1),
        GluForm::Glu32 => Some(2),
        GluForm::Glu8c2 => Some(3),
        GluForm::Glu8c4 => Some(4),
        GluForm::Glu16c2 => Some(5),
    };
    if let Some(i) = fixed {
        let f = GLU_FORMS[i];
        return (f.2 == 1 || caps.arch_major >= 9).then_some(f);
    }
    let sms = caps.sms;
    if blocks > sms && blocks <= 3 * sms {
        Some(GLU_FORMS[1])
    } else if nc && blocks <= sms {
        Some(GLU_FORMS[2])
    } else {
        None
    }
}
