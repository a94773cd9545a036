//! The draw of a sampled (temperature > 0) token from its logits and one
//! uniform, in fixed IEEE double arithmetic that the CUDA sampler
//! (`backend/cuda/ops/sample/kernels/sample.cu`) repeats operation for operation: the same logits
//! and uniform give the same token on the host and on the device.
//!
//! - weights: `w_i = det_exp((l_i - max) * (1 / T))` (so the most likely
//!   token weighs exactly 1), never normalized;
//! - **sorted** candidates (top-k active, or top-p < 1): the finite logits
//!   in descending order (ties by id), cut to the top k; every sum runs in
//!   that order, one addition at a time, except top-p's reference mass
//!   without a top-k cut (the **nucleus** form), which is the id-order sum
//!   of every weight below (so the device sorts only up to the cut);
//! - **id order** (no top-k or top_k at least the finite count, top_p = 1):
//!   every id; sums run over chunks of [`CHUNK`] ids, each chunk left to
//!   right, then the chunk sums left to right (a fixed shape the device
//!   splits over threads), and -inf logits weigh 0;
//! - min-p keeps `w_i >= min_p`; the draw is the first kept token whose
//!   running sum exceeds `u * total`, else the last kept token of positive
//!   weight (rounding can leave `u * total` equal to the total).

use anyhow::{bail, Result};

/// Ids per chunk of the id-order sums (the device's per-thread run).
pub const CHUNK: usize = 256;

/// log2(e), ln(2) split in a high part (trailing zeros: k * LN2_HI is exact
/// for |k| < 2^11) and the rest; as bit patterns so that no decimal
/// parsing stands between the host's constants and the device's.
const LOG2E: u64 = 0x3FF7_1547_652B_82FE;
const LN2_HI: u64 = 0x3FE6_2E42_FEE0_0000;
const LN2_LO: u64 = 0x3DEA_39EF_3579_3C76;

/// 1 / i! for i = 0..=10 (i! is exact in f64, the quotient correctly
/// rounded; sample.cu holds their bit patterns).
const INV_FACT: [f64; 11] = [
    1.0,
    1.0,
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362880.0,
    1.0 / 3628800.0,
];

/// exp(x) for x <= 0 by fixed operations: k = round(x log2 e), r = x - k ln2
/// (two steps), a degree-10 Taylor polynomial in r by Horner (a multiply,
/// then an add: no fused multiply-add), times 2^k. Within 3e-13 of exp
/// relatively (plenty for a sampling weight; each term is an instruction
/// of the device's draw); exactly 1 at 0; 0 below -708 (never subnormal)
/// and at -inf.
pub fn det_exp(x: f64) -> f64 {
    if x.is_nan() || x < -708.0 {
        return 0.0;
    }
    let k = (x * f64::from_bits(LOG2E)).round();
    let r = (x - k * f64::from_bits(LN2_HI)) - k * f64::from_bits(LN2_LO);
    let mut p = INV_FACT[10];
    for c in INV_FACT[..10].iter().rev() {
        p = p * r + c;
    }
    // x <= 0 and x >= -708: k in [-1022, 0], a normal power of two.
    p * f64::from_bits(((k as i64 + 1023) as u64) << 52)
}

/// The weight of logit `l` against the maximum `max`, `inv_t` = 1 / the
/// temperature (one division a row, not one a logit).
#[inline]
pub fn weight(l: f32, max: f64, inv_t: f64) -> f64 {
    det_exp((f64::from(l) - max) * inv_t)
}

/// What the draw needs of the sampling parameters.
#[derive(Clone, Copy, Debug)]
pub struct DrawParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
}

/// Candidate order: logit descending, then id ascending (a total order on
/// non-NaN logits; -0.0 sorts below +0.0 as in f32::total_cmp, and the
/// sampler turns -0.0 into +0.0 before it sorts).
pub fn cand_key(id: u32, l: f32) -> u64 {
    let b = l.to_bits();
    let ord = if b >> 31 == 1 { !b } else { b | 0x8000_0000 };
    (u64::from(!ord) << 32) | u64::from(id)
}

/// Whether these parameters draw in id order for a row with `finite`
/// non--inf logits (else: sorted candidates).
fn id_order(p: &DrawParams, finite: usize) -> bool {
    p.top_p >= 1.0 && (p.top_k == 0 || p.top_k >= finite)
}

/// Draws a token from `logits` (no NaN or +inf; at least one finite) with
/// the uniform `u` in [0, 1).
pub fn draw(logits: &[f32], p: &DrawParams, u: f64) -> Result<u32> {
    let finite = logits.iter().filter(|&&x| x != f32::NEG_INFINITY).count();
    if finite == 0 {
        bail!("sample: every logit is -inf");
    }
    if id_order(p, finite) {
        Ok(draw_id_order(logits, p, u))
    } else {
        Ok(draw_sorted(logits, p, u))
    }
}

fn draw_id_order(logits: &[f32], p: &DrawParams, u: f64) -> u32 {
    let t = 1.0 / f64::from(p.temperature);
    let min_p = f64::from(p.min_p);
    let max = f64::from(
        logits
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m }),
    );
    let kept = |l: f32| {
        let w = weight(l, max, t);
        if w >= min_p {
            w
        } else {
            0.0
        }
    };
    let sums = chunk_sums(logits, kept);
    let total = sums.iter().fold(0.0f64, |s, &c| s + c);
    let target = u * total;
    let mut cum = 0.0f64;
    for (ci, &cs) in sums.iter().enumerate() {
        if target < cum + cs {
            let base = ci * CHUNK;
            let mut last = None;
            for (j, &l) in logits[base..(base + CHUNK).min(logits.len())]
                .iter()
                .enumerate()
            {
                let w = kept(l);
                if w > 0.0 {
                    cum += w;
                    last = Some(base + j);
                    if target < cum {
                        return (base + j) as u32;
                    }
                }
            }
            // The chunk's own running sum stopped short of its total
            // added at once: its last token of positive weight.
            return last.expect("a chunk with a positive sum has a positive weight") as u32;
        }
        cum += cs;
    }
    // u * total rounded up to the total: the last token of positive weight.
    let last = logits.iter().rposition(|&l| kept(l) > 0.0);
    last.expect("the maximum weighs 1") as u32
}

/// Per chunk of [`CHUNK`] ids, the sum of `w(l)` left to right.
fn chunk_sums(logits: &[f32], w: impl Fn(f32) -> f64) -> Vec<f64> {
    logits
        .chunks(CHUNK)
        .map(|c| c.iter().fold(0.0f64, |s, &l| s + w(l)))
        .collect()
}

fn draw_sorted(logits: &[f32], p: &DrawParams, u: f64) -> u32 {
    let mut keys: Vec<u64> = logits
        .iter()
        .enumerate()
        .filter(|(_, &l)| l != f32::NEG_INFINITY)
        .map(|(i, &l)| cand_key(i as u32, l))
        .collect();
    // Nucleus: top-p with no top-k cut.
    let nucleus = !(p.top_k > 0 && p.top_k < keys.len());
    if !nucleus {
        keys.select_nth_unstable(p.top_k - 1);
        keys.truncate(p.top_k);
    }
    keys.sort_unstable();
    let id = |k: u64| (k & 0xFFFF_FFFF) as u32;
    let t = 1.0 / f64::from(p.temperature);
    let max = f64::from(logits[id(keys[0]) as usize]);
    let w: Vec<f64> = keys
        .iter()
        .map(|&k| weight(logits[id(k) as usize], max, t))
        .collect();
    let mut keep = w.len();
    if p.top_p < 1.0 {
        // The mass top-p measures against: over the top-k in their order,
        // or (nucleus) over every id in id order by chunks, as the id-order
        // draw sums (the device then never sorts more than the nucleus).
        let s = if nucleus {
            let sums = chunk_sums(logits, |l| weight(l, max, t));
            sums.iter().fold(0.0f64, |s, &c| s + c)
        } else {
            w.iter().fold(0.0f64, |s, &x| s + x)
        };
        let need = f64::from(p.top_p) * s;
        let mut cum = 0.0f64;
        for (i, &x) in w.iter().enumerate() {
            cum += x;
            if cum >= need {
                keep = i + 1;
                break;
            }
        }
    }
    // w[0] = 1 >= min_p: at least one token stays.
    let min_p = f64::from(p.min_p);
    keep = w[..keep].iter().take_while(|&&x| x >= min_p).count();
    let total = w[..keep].iter().fold(0.0f64, |s, &x| s + x);
    let target = u * total;
    let mut cum = 0.0f64;
    for (i, &x) in w[..keep].iter().enumerate() {
        cum += x;
        if target < cum {
            return id(keys[i]);
        }
    }
    let last = w[..keep].iter().rposition(|&x| x > 0.0).unwrap_or(0);
    id(keys[last])
}
