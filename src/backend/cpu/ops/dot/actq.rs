//! Canonical activation quantization (once per matmul, all rows).

use super::{Act32Row, ActKRow};
use crate::backend::cpu::ops::MutPtr;
use crate::backend::cpu::pool::Par;
use crate::backend::cpu::{canon, Isa};

/// One canonical block (`canon::quantize_block`) and its exact sum Σq.
/// `xb.len() == q.len()`, a multiple of 16 (32 or 256 here).
#[inline]
fn quantize(isa: Isa, xb: &[f32], q: &mut [i16]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && xb.len() == q.len() && xb.len().is_multiple_of(16) {
        // SAFETY: Isa::Avx2 only after runtime AVX2 detection; xb and q
        // both hold xb.len() elements, a multiple of 16 (checked above).
        return unsafe { super::avx2::quantize_block16(xb.as_ptr(), q.as_mut_ptr(), xb.len()) };
    }
    let _ = isa;
    let db = canon::quantize_block(xb, q);
    (db, q.iter().map(|&v| v as i32).sum())
}

/// Position in an [`Act32Row`]'s `qs` of element `i` (0..32) of block `b`:
/// blocks are stored in pairs (2p, 2p + 1) of 64 values, as four chunks of
/// 8 elements each interleaved by block:
/// `[A0..8, B0..8, A8..16, B8..16, A16..24, B16..24, A24..32, B24..32]`
/// (a missing last partner B is zero). This is the order in which the
/// AVX2 kernels unpack two weight blocks into one register.
#[inline(always)]
pub fn pair_pos(b: usize, i: usize) -> usize {
    64 * (b / 2) + 16 * (i / 8) + 8 * (b % 2) + i % 8
}

/// n rows of k activations in 32-blocks. See [`Act32Row`].
pub struct Act32 {
    pub nb: usize,
    pub qs: Vec<i16>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub sum: Vec<i32>,
}

impl Act32 {
    /// x: (n, k), k a multiple of 32 (caller-validated).
    /// `par`: a [`Par`] (or `false`, serial); rows split among threads.
    pub fn quantize<'p>(par: impl Into<Par<'p>>, isa: Isa, x: &[f32], n: usize, k: usize) -> Act32 {
        let par: Par<'p> = par.into();
        let nb = k / 32;
        // Row stride of `qs`: the block count rounded up to a pair.
        let rk = nb.div_ceil(2) * 64;
        let mut a = Act32 {
            nb,
            qs: vec![0; n * rk],
            d: vec![0.0; n * nb],
            s: vec![0.0; n * nb],
            sum: vec![0; n * nb],
        };
        if n == 0 || nb == 0 {
            return a;
        }
        let row = |qs: &mut [i16], d: &mut [f32], s: &mut [f32], sum: &mut [i32], xr: &[f32]| {
            let mut q = [0i16; 32];
            for b in 0..nb {
                let xb = &xr[32 * b..32 * b + 32];
                let (db, isum) = quantize(isa, xb, &mut q);
                for c in 0..4 {
                    let o = pair_pos(b, 8 * c);
                    qs[o..o + 8].copy_from_slice(&q[8 * c..8 * c + 8]);
                }
                d[b] = db;
                sum[b] = isum;
                s[b] = db * isum as f32;
            }
        };
        if par.is_par() && n > 1 {
            let (qs, d, sp, sum) = (
                MutPtr::new(&mut a.qs),
                MutPtr::new(&mut a.d),
                MutPtr::new(&mut a.s),
                MutPtr::new(&mut a.sum),
            );
            par.for_tasks(n, |i| {
                // SAFETY: task i alone touches row i of each buffer (in
                // bounds: the buffers hold n rows); `a` outlives the loop.
                unsafe {
                    row(
                        qs.slice(i * rk, rk),
                        d.slice(i * nb, nb),
                        sp.slice(i * nb, nb),
                        sum.slice(i * nb, nb),
                        &x[i * k..(i + 1) * k],
                    )
                }
            });
        } else {
            for ((((qs, d), s), sum), xr) in
                a.qs.chunks_mut(rk)
                    .zip(a.d.chunks_mut(nb))
                    .zip(a.s.chunks_mut(nb))
                    .zip(a.sum.chunks_mut(nb))
                    .zip(x.chunks(k))
            {
                row(qs, d, s, sum, xr);
            }
        }
        a
    }

    pub fn row(&self, i: usize) -> Act32Row<'_> {
        let nb = self.nb;
        let rk = nb.div_ceil(2) * 64;
        Act32Row {
            qs: &self.qs[i * rk..(i + 1) * rk],
            d: &self.d[i * nb..(i + 1) * nb],
            s: &self.s[i * nb..(i + 1) * nb],
            sum: &self.sum[i * nb..(i + 1) * nb],
        }
    }
}

/// n rows of k activations in 256-superblocks. See [`ActKRow`].
pub struct ActK {
    pub nb: usize,
    pub qs: Vec<i16>,
    pub d: Vec<f32>,
    pub bsum: Vec<i32>,
}

impl ActK {
    /// x: (n, k), k a multiple of 256 (caller-validated).
    /// `par`: a [`Par`] (or `false`, serial); rows split among threads.
    pub fn quantize<'p>(par: impl Into<Par<'p>>, isa: Isa, x: &[f32], n: usize, k: usize) -> ActK {
        let par: Par<'p> = par.into();
        let nb = k / 256;
        let mut a = ActK {
            nb,
            qs: vec![0; n * k],
            d: vec![0.0; n * nb],
            bsum: vec![0; n * nb * 16],
        };
        if n == 0 || nb == 0 {
            return a;
        }
        let row = |qs: &mut [i16], d: &mut [f32], bsum: &mut [i32], xr: &[f32]| {
            for b in 0..nb {
                let q = &mut qs[256 * b..256 * b + 256];
                d[b] = quantize(isa, &xr[256 * b..256 * b + 256], q).0;
                for g in 0..16 {
                    bsum[16 * b + g] = q[16 * g..16 * g + 16].iter().map(|&v| v as i32).sum();
                }
            }
        };
        if par.is_par() && n > 1 {
            let (qs, d, bsum) = (
                MutPtr::new(&mut a.qs),
                MutPtr::new(&mut a.d),
                MutPtr::new(&mut a.bsum),
            );
            par.for_tasks(n, |i| {
                // SAFETY: task i alone touches row i of each buffer (in
                // bounds: the buffers hold n rows); `a` outlives the loop.
                unsafe {
                    row(
                        qs.slice(i * k, k),
                        d.slice(i * nb, nb),
                        bsum.slice(i * nb * 16, nb * 16),
                        &x[i * k..(i + 1) * k],
                    )
                }
            });
        } else {
            for (((qs, d), bsum), xr) in
                a.qs.chunks_mut(k)
                    .zip(a.d.chunks_mut(nb))
                    .zip(a.bsum.chunks_mut(nb * 16))
                    .zip(x.chunks(k))
            {
                row(qs, d, bsum, xr);
            }
        }
        a
    }

    pub fn row(&self, i: usize) -> ActKRow<'_> {
        let nb = self.nb;
        ActKRow {
            qs: &self.qs[i * nb * 256..(i + 1) * nb * 256],
            d: &self.d[i * nb..(i + 1) * nb],
            bsum: &self.bsum[i * nb * 16..(i + 1) * nb * 16],
        }
    }
}
