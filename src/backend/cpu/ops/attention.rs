//! Paged causal attention reading f16 K/V in place through block tables.
//!
//! Canonical arithmetic, per query row r (position P) and head h, with
//! `lo = P + 1 - window` (0 without a window):
//! `m = -inf, l = 0, acc[0..hd] = 0`; for each chunk of 32 key positions
//! `[32c, 32c + 32)` (aligned to absolute position 0) that holds a visible
//! key, in order, over its visible keys `j` in `[max(lo, 32c), min(32c +
//! 32, P + 1))`:
//! * `s_j = dot32(q, k_j) * scale` (k_j converted exactly from f16);
//!   with a softcap `s_j = softcap * tanh(s_j / softcap)`; with ALiBi
//!   `s_j = s_j + (slope_h * -((P - j) as f32))`;
//! * `m_new = max(m, max_j s_j)`; `alpha = exp(m - m_new)`; `p_j = exp(s_j - m_new)`;
//! * `ls = 0; ls = ls + p_j` for j in order; `l = (l * alpha) + ls`;
//! * per d: `vs = 0; vs = vs + (p_j * v_j[d])` for j in order;
//!   `acc[d] = (acc[d] * alpha) + vs`;
//!
//! then with a sink logit `t_h`: `m_f = max(m, t_h)`, `a = exp(m - m_f)`,
//! `l = (l * a) + exp(t_h - m_f)`, `acc[d] = acc[d] * a`; finally
//! `out[d] = acc[d] / l`. Key j lives in physical cell
//! `table[j / B] * B + j % B`; head h reads kv head `h / (n_heads / n_kv_heads)`.
//! Threads split (row, head) pairs, so nothing depends on the batch.

use super::dot::float::dot_f16;
use super::for_chunks;
use crate::backend::cpu::{canon, Isa};
use crate::backend::{AttnBatch, AttnOpts, KvLayer};
use anyhow::Result;
use half::f16;

/// Positions per online-softmax chunk (aligned to absolute position 0).
pub const CHUNK: usize = 32;

/// q, out: (n_rows, n_heads, head_dim); `opts`' slopes and sinks: (n_heads,).
#[allow(clippy::too_many_arguments)] // the op's fields, passed through
pub fn run(
    par: crate::backend::cpu::pool::Par<'_>,
    isa: Isa,
    q: &[f32],
    n_heads: usize,
    scale: f32,
    cache: KvLayer<'_>,
    batch: AttnBatch<'_>,
    opts: AttnOpts<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let (hd, nkv) = (cache.head_dim, cache.n_kv_heads);
    crate::backend::validate::host_attention(q.len(), n_heads, &cache, &batch, &opts, out.len())?;
    let group = n_heads / nkv;
    // The AVX2 kernel reads f16 rows; block types go through the generic
    // path, which dequantizes each row first.
    let plain = opts.is_plain() && cache.ty == crate::backend::KvType::F16;
    for_chunks(par, out, hd, |rh, o| {
        let (r, h) = (rh / n_heads, rh % n_heads);
        let qv = &q[rh * hd..(rh + 1) * hd];
        let table = batch.block_tables[batch.row_seq[r] as usize];
        let kvh = h / group;
        let pos = batch.positions[r] as usize;
        if plain {
            head(isa, qv, scale, &cache, table, kvh, pos, o);
        } else {
            let ho = HeadOpts::of(&opts, h, pos);
            head_opts(isa, qv, scale, &cache, table, kvh, pos, &ho, o);
        }
    });
    Ok(())
}

/// One (row, head)'s view of the op's `AttnOpts`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct HeadOpts {
    /// First visible key.
    lo: usize,
    /// 0: off.
    softcap: f32,
    slope: Option<f32>,
    sink: Option<f32>,
}

impl HeadOpts {
    const PLAIN: HeadOpts = HeadOpts {
        lo: 0,
        softcap: 0.0,
        slope: None,
        sink: None,
    };

    fn of(opts: &AttnOpts<&[f32]>, h: usize, pos: usize) -> HeadOpts {
        let w = opts.window as usize;
        HeadOpts {
            lo: if w == 0 {
                0
            } else {
                (pos + 1).saturating_sub(w)
            },
            softcap: opts.softcap,
            slope: opts.alibi.map(|a| a[h]),
            sink: opts.sinks.map(|t| t[h]),
        }
    }
}

/// One (row, head) with options: the portable kernels, or with AVX2 the
/// bitwise-equal ones.
#[allow(clippy::too_many_arguments)]
fn head_opts(
    isa: Isa,
    qv: &[f32],
    scale: f32,
    cache: &KvLayer<'_>,
    table: &[u32],
    kvh: usize,
    pos: usize,
    ho: &HeadOpts,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2+F16C detected at runtime (Isa::Avx2).
        unsafe { head_avx2(qv, scale, cache, table, kvh, pos, ho, o) };
        return;
    }
    let _ = isa;
    head_impl::<false>(qv, scale, cache, table, kvh, pos, ho, o)
}

/// One (row, head): o (hd,) = attention of qv (hd,) over positions 0..=pos.
#[allow(clippy::too_many_arguments)]
fn head(
    isa: Isa,
    qv: &[f32],
    scale: f32,
    cache: &KvLayer<'_>,
    table: &[u32],
    kvh: usize,
    pos: usize,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && cache.head_dim.is_multiple_of(8) && cache.head_dim <= 256 {
        // SAFETY: AVX2+F16C detected at runtime (Isa::Avx2); the caller
        // validated the block table against the cache size, and qv / o
        // hold hd elements.
        unsafe {
            super::attention_avx2::head(
                qv,
                scale,
                cache.k,
                cache.v,
                table,
                cache.block_size,
                cache.n_kv_heads,
                kvh,
                pos,
                o,
            )
        };
        return;
    }
    head_opts(isa, qv, scale, cache, table, kvh, pos, &HeadOpts::PLAIN, o)
}

/// `head_impl` compiled with AVX2 enabled, so its kernels inline.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn head_avx2(
    qv: &[f32],
    scale: f32,
    cache: &KvLayer<'_>,
    table: &[u32],
    kvh: usize,
    pos: usize,
    ho: &HeadOpts,
    o: &mut [f32],
) {
    head_impl::<true>(qv, scale, cache, table, kvh, pos, ho, o)
}

/// The canonical per-(row, head) computation; `AVX` selects kernels that
/// are bitwise equal to the portable ones (only ever true inside
/// `head_avx2`, i.e. with AVX2 + F16C available).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head_impl<const AVX: bool>(
    qv: &[f32],
    scale: f32,
    cache: &KvLayer<'_>,
    table: &[u32],
    kvh: usize,
    pos: usize,
    ho: &HeadOpts,
    o: &mut [f32],
) {
    let (hd, nkv, bs) = (cache.head_dim, cache.n_kv_heads, cache.block_size);
    let (ty, units) = (cache.ty, cache.ty.row_units(hd));
    let f16_rows = ty == crate::backend::KvType::F16;
    // A block-type row, dequantized (exact values) before it is used.
    let mut row_stack = [0f32; 256];
    let mut row_heap;
    let row: &mut [f32] = if hd <= 256 {
        &mut row_stack[..hd]
    } else {
        row_heap = vec![0f32; hd];
        &mut row_heap[..]
    };
    // `o` doubles as the accumulator; `vs` is the per-chunk sum.
    let mut vs_stack = [0f32; 256];
    let mut vs_heap;
    let vs: &mut [f32] = if hd <= 256 {
        &mut vs_stack[..hd]
    } else {
        vs_heap = vec![0f32; hd];
        &mut vs_heap[..]
    };
    o.fill(0.0);
    let mut m = f32::NEG_INFINITY;
    let mut l = 0f32;
    let mut s = [0f32; CHUNK];
    let mut offs = [0usize; CHUNK];
    // Chunks stay aligned to absolute position 0; the first one visited
    // holds key lo, and only its keys from lo on are read.
    let mut j0 = ho.lo;
    while j0 <= pos {
        let j1 = ((j0 / CHUNK + 1) * CHUNK).min(pos + 1);
        let cnt = j1 - j0;
        // Element offsets of this chunk's cells (block-table walk, no
        // per-position division).
        let (mut blk, mut within) = (j0 / bs, j0 % bs);
        for off in offs.iter_mut().take(cnt) {
            let cell = table[blk] as usize * bs + within;
            *off = (cell * nkv + kvh) * units;
            within += 1;
            if within == bs {
                within = 0;
                blk += 1;
            }
        }
        let mut cmax = f32::NEG_INFINITY;
        for (t, (sj, &off)) in s.iter_mut().zip(offs.iter()).take(cnt).enumerate() {
            let kr = &cache.k[off..off + units];
            let d = if !f16_rows {
                super::kv_write::load(ty, kr, row);
                canon::dot32(qv, row)
            } else if AVX {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX is true only inside head_avx2 (AVX2 + F16C);
                // kr and qv both hold hd elements.
                unsafe {
                    crate::backend::cpu::ops::dot::avx2::dot_f16(
                        qv.as_ptr(),
                        kr.as_ptr() as *const u8,
                        hd,
                    )
                }
                #[cfg(not(target_arch = "x86_64"))]
                dot_f16(Isa::Portable, qv, kr)
            } else {
                dot_f16(Isa::Portable, qv, kr)
            };
            let mut sc = d * scale;
            if ho.softcap != 0.0 {
                sc = ho.softcap * canon::tanh(sc / ho.softcap);
            }
            if let Some(slope) = ho.slope {
                sc += slope * -((pos - (j0 + t)) as f32);
            }
            *sj = sc;
            cmax = cmax.max(*sj);
        }
        let m_new = m.max(cmax);
        let alpha = canon::exp(m - m_new);
        let mut ls = 0f32;
        for sj in s.iter_mut().take(cnt) {
            *sj = canon::exp(*sj - m_new);
            ls += *sj;
        }
        l = (l * alpha) + ls;
        vs.fill(0.0);
        for (&p, &off) in s.iter().zip(offs.iter()).take(cnt) {
            let vr = &cache.v[off..off + units];
            if !f16_rows {
                super::kv_write::load(ty, vr, row);
                for (a, &x) in vs.iter_mut().zip(row.iter()) {
                    *a += p * x;
                }
            } else if AVX {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX is true only inside head_avx2 (AVX2 + F16C).
                unsafe {
                    accumulate_v_avx2(vs, p, vr)
                };
            } else {
                accumulate_v(vs, p, vr);
            }
        }
        for (a, &v) in o.iter_mut().zip(vs.iter()) {
            *a = (*a * alpha) + v;
        }
        m = m_new;
        j0 = j1;
    }
    if let Some(t) = ho.sink {
        let m_f = m.max(t);
        let a = canon::exp(m - m_f);
        l = (l * a) + canon::exp(t - m_f);
        for x in o.iter_mut() {
            *x *= a;
        }
    }
    for a in o.iter_mut() {
        *a /= l;
    }
}

/// vs[d] = vs[d] + (p * v[d]) for every d (elementwise; the AVX2 version
/// does the same two roundings per element).
#[inline]
fn accumulate_v(vs: &mut [f32], p: f32, v: &[f16]) {
    for (a, &x) in vs.iter_mut().zip(v) {
        *a += p * x.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn accumulate_v_avx2(vs: &mut [f32], p: f32, v: &[f16]) {
    use std::arch::x86_64::*;
    let n = vs.len().min(v.len());
    let pv = _mm256_set1_ps(p);
    let mut d = 0;
    while d + 8 <= n {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(d) as *const __m128i));
        let a = _mm256_loadu_ps(vs.as_ptr().add(d));
        _mm256_storeu_ps(
            vs.as_mut_ptr().add(d),
            _mm256_add_ps(a, _mm256_mul_ps(pv, x)),
        );
        d += 8;
    }
    while d < n {
        vs[d] += p * v[d].to_f32();
        d += 1;
    }
}
