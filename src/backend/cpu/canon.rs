//! Canonical arithmetic: the one definition of every reduction and every
//! transcendental function the `cpu` backend uses. Every other backend's
//! `exact` mode must reproduce these operation sequences bit for bit, so
//! everything here is expressed with plain IEEE-754 binary32 add, sub, mul,
//! div and sqrt (round to nearest even), exact conversions and exact integer
//! arithmetic. No FMA contraction anywhere (Rust never contracts `a * b + c`).
//!
//! # Reductions
//!
//! * **Float dot / sum of length K** ([`dot32`]): 32 partial sums `lane[0..32]`,
//!   zero-initialized; element `e` goes to lane `e % 32` in increasing `e`,
//!   each step `lane = lane + (a[e] * b[e])` (two roundings). Then a fixed
//!   pairwise tree: for `s` in `[16, 8, 4, 2, 1]`, `lane[i] = lane[i] + lane[i + s]`
//!   for `i < s`; the result is `lane[0]`. F16/BF16 operands are converted
//!   exactly to f32 first.
//! * **Activation quantization** (per row, per block of 32 or 256 elements,
//!   16-bit): `amax = max |x|`; `d = amax / 32767`; `id = if d == 0 { 0 } else { 1 / d }`;
//!   `q = clamp(round_half_away_from_zero(x * id), -32767, 32767)` as i16
//!   (a NaN `x * id` gives `q = 0`; NaN elements are ignored by the max).
//!   32-blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 weights) also keep `S = Σ q`
//!   (exact i32) and `sa = d * (S as f32)`; 256-blocks (Q4_K, Q5_K, Q6_K)
//!   keep the 16 exact group sums `bsum[g] = Σ q[16g..16g+16]` (i32).
//! * **Quantized dot** of a weight row with a quantized activation row:
//!   each (super)block `b` yields exact integer sums and one float term `t_b`:
//!   - Q4_0 / Q5_0 / Q8_0: `I = Σ w_i * q_i` (exact i32: |w| <= 128, so
//!     |I| <= 32 * 128 * 32767 < 2^31) with `w` the signed weight integer
//!     (`nib - 8`, `q5 - 16`, `i8`); `t = (dw * da) * (I as f32)`.
//!   - Q4_1 / Q5_1: `I = Σ w_i * q_i` (i32) with the unsigned weight integer;
//!     `t = ((dw * da) * (I as f32)) + (mw * sa)`.
//!   - Q4_K / Q5_K (8 sub-blocks of 32, 6-bit scale `sc_j` and min `m_j`):
//!     `I_j = Σ_{i in j} w_i * q_i` (i32), `A = Σ_j sc_j * I_j` and
//!     `B = Σ_j m_j * (bsum[2j] + bsum[2j+1])`, both exact in **i64** (A can
//!     exceed i32); `t = ((d * da) * (A as f32)) - ((dmin * da) * (B as f32))`
//!     where `i64 as f32` rounds to nearest even.
//!   - Q6_K (16 groups of 16, i8 scale `sc_g`, `w = q6 - 32`):
//!     `I_g = Σ_{i in g} w_i * q_i` (i32); `A = Σ_g sc_g * I_g` (exact i64);
//!     `t = (d * da) * (A as f32)`.
//!
//!   (`dw`, `mw`, `d`, `dmin` are the f16 block scales converted exactly.)
//!   Terms accumulate into 8 lanes: `lane[b % 8] = lane[b % 8] + t_b` in
//!   increasing `b` (lanes start at 0), then the tree for `s` in `[4, 2, 1]`.
//!   Integer sums are exact, so any summation order gives the same value.
//! * **F32/F16/BF16 matmul**: `out = dot32(x_row, w_row)` on unquantized f32
//!   activations.
//!
//! # Functions
//!
//! * [`exp`]: `n = round_half_away(x * LOG2E)`; `r = (x - n * LN2_HI) - n * LN2_LO`;
//!   degree-7 Taylor polynomial in Horner form; scaling by `2^n` through exact
//!   power-of-two multiplications. `x > 88.8 -> inf`, `x < -104 -> 0`.
//! * [`silu`]`(x) = x / (1 + exp(-x))`.
//! * [`sin_cos`]: `k = round_half_away(x * 2/π)`; `r = x - k*P1 - k*P2 - k*P3 - k*P4`
//!   (left to right; P1..P3 hold 7 significant bits, so the products are exact
//!   for |k| < 2^17, i.e. |x| < ~2e5); sin/cos Taylor polynomials of degree
//!   9/10 on `r`, then quadrant selection by `k mod 4`.
//! * [`rsqrt`]`(x) = 1 / sqrt(x)` (both correctly rounded).
//! * [`tanh`]: the x^7 Taylor series below |x| = 0.125, else
//!   `(1 - e) / (1 + e)` with `e = exp(-2|x|)` and the sign of x.
//! * RoPE angle: `(pos as f32) * inv_freq[i]`; rotation `o0 = (x0*c) - (x1*s)`,
//!   `o1 = (x0*s) + (x1*c)`.
//! * rms_norm: `ss = dot32(x, x)`; `mean = ss / (dim as f32)`;
//!   `scale = rsqrt(mean + eps)`; `out = (x * scale) * w`.
//! * Attention (`ops/attention.rs`), per query row at position P and head h
//!   (kv head `h / (n_heads / n_kv_heads)`): `m = -inf, l = 0, acc = 0`; for
//!   each chunk of 32 positions `[32c, min(32c + 32, P + 1))` aligned to
//!   absolute position 0: `s_j = dot32(q, k_j) * scale`;
//!   `m_new = max(m, max_j s_j)`; `alpha = exp(m - m_new)`;
//!   `p_j = exp(s_j - m_new)`; `ls = Σ_j p_j` (sequential from 0, j in order);
//!   `l = (l * alpha) + ls`; per d: `vs = Σ_j (p_j * v_j[d])` (sequential from
//!   0); `acc[d] = (acc[d] * alpha) + vs`; finally `out[d] = acc[d] / l`.
//!   K/V are f16 (`kv_write` rounds f32 -> f16 to nearest even), read through
//!   the block table at cell `table[j / B] * B + j % B`.
//! * `round_half_away` ([`round_away`]): `t = trunc(x)` (exact), `f = x - t`
//!   (exact); `t + 1` if `f >= 0.5`, `t - 1` if `f <= -0.5`, else `t`.
//! * Polynomial coefficients are the f32 constants `1.0 / n!` (one correctly
//!   rounded f32 division each, e.g. `1.0f32 / 5040.0f32`); `LN2_HI` is
//!   `0x3f317200`, `LN2_LO` `1.4286068e-6`; `P1..P4` are given as bit patterns
//!   below.

/// Pairwise tree over 32 lanes: for s in [16, 8, 4, 2, 1].
#[inline]
pub fn tree32(mut lane: [f32; 32]) -> f32 {
    let mut s = 16;
    while s >= 1 {
        for i in 0..s {
            lane[i] += lane[i + s];
        }
        s /= 2;
    }
    lane[0]
}

/// Pairwise tree over 8 lanes: for s in [4, 2, 1].
#[inline]
pub fn tree8(mut lane: [f32; 8]) -> f32 {
    let mut s = 4;
    while s >= 1 {
        for i in 0..s {
            lane[i] += lane[i + s];
        }
        s /= 2;
    }
    lane[0]
}

/// Canonical float dot product (portable reference); `a.len() == b.len()`
/// is the caller's invariant (extra elements of the longer slice are ignored).
#[inline]
pub fn dot32(a: &[f32], b: &[f32]) -> f32 {
    dot32_by(a.len().min(b.len()), |i| a[i] * b[i])
}

/// 32-lane accumulation of `prod(i)` for `i in 0..k` (the product is the
/// caller's single rounded multiplication).
#[inline]
pub fn dot32_by(k: usize, prod: impl Fn(usize) -> f32) -> f32 {
    let mut lane = [0f32; 32];
    let full = k / 32 * 32;
    let mut e = 0;
    while e < full {
        for (l, acc) in lane.iter_mut().enumerate() {
            *acc += prod(e + l);
        }
        e += 32;
    }
    for (l, acc) in lane.iter_mut().enumerate().take(k - full) {
        *acc += prod(full + l);
    }
    tree32(lane)
}

/// Round half away from zero, exact, without libm: truncate toward zero
/// through i32 (exact for |x| < 2^23), then compare the exact fraction
/// with 0.5. |x| >= 2^23 (already an integer), inf and NaN pass through.
/// A zero result is +0.0 (callers only convert it to an integer or multiply
/// it, where the sign of zero never matters).
#[inline]
pub fn round_away(x: f32) -> f32 {
    if x.is_nan() || x.abs() >= 8_388_608.0 {
        return x;
    }
    let t = (x as i32) as f32;
    let f = x - t;
    if f >= 0.5 {
        t + 1.0
    } else if f <= -0.5 {
        t - 1.0
    } else {
        t
    }
}

/// Largest activation integer magnitude (16-bit activations).
pub const QA_MAX: f32 = 32767.0;

/// Canonical 16-bit activation quantization of one block: returns `d`,
/// writes `q` (same length as `x`).
#[inline]
pub fn quantize_block(x: &[f32], q: &mut [i16]) -> f32 {
    let mut amax = 0f32;
    for &v in x {
        // f32::max ignores a NaN operand.
        amax = amax.max(v.abs());
    }
    let d = amax / QA_MAX;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    for (o, &v) in q.iter_mut().zip(x) {
        // NaN -> clamp keeps NaN -> `as i16` gives 0.
        *o = round_away(v * id).clamp(-QA_MAX, QA_MAX) as i16;
    }
    d
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0.693145751953125, 16 bits
const LN2_LO: f32 = 1.428_606_8e-6;

/// Canonical exp: a few ulp over the whole f32 range.
#[inline]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > 88.8 {
        return f32::INFINITY;
    }
    if x < -104.0 {
        return 0.0;
    }
    let n = round_away(x * LOG2E);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // e^r, |r| <= ~0.35: Taylor to degree 7 (truncation < 1e-8 relative).
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    scale_pow2(p, n as i32)
}

/// `v * 2^n` through exact power-of-two factors (two steps so that
/// subnormal results round once, at the last multiplication).
#[inline]
fn scale_pow2(v: f32, n: i32) -> f32 {
    if n > 127 {
        let v = v * f32::from_bits(((127 + 127) as u32) << 23);
        return v * f32::from_bits(((n - 127 + 127) as u32) << 23);
    }
    if n < -126 {
        let v = v * f32::from_bits(((-100 + 127) as u32) << 23);
        return v * f32::from_bits(((n + 100 + 127) as u32) << 23);
    }
    v * f32::from_bits(((n + 127) as u32) << 23)
}

/// Canonical SiLU: `x / (1 + exp(-x))`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// Canonical tanh. `|x| < 0.125`: `x2 = x * x`; `p = 17/315`;
/// `p = 2/15 - (p * x2)`; `p = 1/3 - (p * x2)`; `x - ((x * x2) * p)`
/// (the Taylor series to x^7). Else `e = exp(-2 |x|)`,
/// `t = (1 - e) / (1 + e)` with the sign of x. NaN stays NaN.
#[inline]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    if a < 0.125 {
        let x2 = x * x;
        let mut p = TANH_C7;
        p = TANH_C5 - (p * x2);
        p = TANH_C3 - (p * x2);
        return x - ((x * x2) * p);
    }
    let e = exp(-2.0 * a);
    ((1.0 - e) / (1.0 + e)).copysign(x)
}

/// tanh's series coefficients (correctly rounded f32 divisions).
pub const TANH_C3: f32 = 1.0 / 3.0;
pub const TANH_C5: f32 = 2.0 / 15.0;
pub const TANH_C7: f32 = 17.0 / 315.0;

/// Canonical reciprocal square root: `1 / sqrt(x)`.
#[inline]
pub fn rsqrt(x: f32) -> f32 {
    1.0 / x.sqrt()
}

const TWO_OVER_PI: f32 = std::f32::consts::FRAC_2_PI;
const P1: f32 = f32::from_bits(0x3fc8_0000); // 1.5625
const P2: f32 = f32::from_bits(0x3c06_0000);
const P3: f32 = f32::from_bits(0x38f6_0000);
const P4: f32 = f32::from_bits(0x34a8_885a);

/// Canonical (sin x, cos x); accurate to ~1e-7 absolute for |x| < 2e5.
#[inline]
pub fn sin_cos(x: f32) -> (f32, f32) {
    if !x.is_finite() {
        return (f32::NAN, f32::NAN);
    }
    let k = round_away(x * TWO_OVER_PI);
    let r = x - k * P1;
    let r = r - k * P2;
    let r = r - k * P3;
    let r = r - k * P4;
    let r2 = r * r;
    // sin r = r + r * r2 * (-1/6 + r2 * (1/120 + r2 * (-1/5040 + r2 / 362880)))
    let mut ps = 1.0 / 362_880.0;
    ps = ps * r2 - 1.0 / 5040.0;
    ps = ps * r2 + 1.0 / 120.0;
    ps = ps * r2 - 1.0 / 6.0;
    let s = r + r * (r2 * ps);
    // cos r = 1 + r2 * (-1/2 + r2 * (1/24 + r2 * (-1/720 + r2 * (1/40320 - r2/3628800))))
    let mut pc = -1.0 / 3_628_800.0;
    pc = pc * r2 + 1.0 / 40320.0;
    pc = pc * r2 - 1.0 / 720.0;
    pc = pc * r2 + 1.0 / 24.0;
    pc = pc * r2 - 0.5;
    let c = 1.0 + r2 * pc;
    // k mod 4 in two's complement works for negative k too.
    match (k as i64) & 3 {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}
