//! The masked half of `quire check-sample`: a grammar's mask applied on
//! the device (mask_rows, then sample_rows: ops/sample/kernels/sample.cu)
//! against `Sampler::sample_masked` on the host, bit for bit, on the
//! crafted rows of check_sample.rs with masks of every density (half the
//! ids, one in a hundred, a single id, only ids whose logit is -inf) and
//! unmasked rows among them. A greedy row whose allowed logits are all
//! -inf takes the first allowed id (serve/masks.rs), as the host does.

use super::check_sample::{rows, sample_on, shapes};
use crate::backend::cuda::{device_draws, draw_record, DRAW_WORDS};
use crate::runner::Runner;
use crate::sampler::{RowMasks, Sampler, TokenMask, WordMask};
use anyhow::{bail, Result};
use cudarc::driver::DevicePtr;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A mask of kind `k` over `row` (see the module doc), as words.
fn mask_of(k: usize, row: &[f32], rng: &mut ChaCha8Rng) -> Vec<u32> {
    let v = row.len();
    let mut w = vec![0u32; RowMasks::words_for(v)];
    let mut set = |i: usize| w[i / 32] |= 1 << (i % 32);
    match k {
        0 => (0..v).filter(|_| rng.random_bool(0.5)).for_each(&mut set),
        1 => (0..v).filter(|_| rng.random_bool(0.01)).for_each(&mut set),
        2 => set(rng.random_range(0..v)),
        _ => {
            let ninf: Vec<usize> = (0..v).filter(|&i| row[i] == f32::NEG_INFINITY).collect();
            if ninf.is_empty() {
                (0..v).filter(|_| rng.random_bool(0.05)).for_each(&mut set);
            } else {
                ninf.iter()
                    .filter(|_| rng.random_bool(0.3))
                    .for_each(|&i| set(i));
            }
        }
    }
    if w.iter().all(|&x| x == 0) {
        w[(v - 1) / 32] |= 1 << ((v - 1) % 32);
    }
    w
}

/// Masked draws on the device against the host's on crafted rows of
/// `vocab` logits: returns the number of cases checked.
pub(super) fn check_masked_rows(r: &Runner, vocab: usize, seed: u64) -> Result<usize> {
    let be = super::device_backend(r, "check-sample")?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d61736b ^ vocab as u64);
    let rows = rows(vocab, &mut rng);
    let mw = RowMasks::words_for(vocab);
    // (row, parameters, uniform, mask words; None: unmasked)
    let mut cases = Vec::new();
    for (ri, row) in rows.iter().enumerate() {
        for (pi, p) in shapes(vocab).into_iter().enumerate() {
            if !device_draws(&p.draw_params(), vocab) {
                continue;
            }
            for k in 0..5 {
                let u = rng.random::<f64>();
                let mask = (k < 4).then(|| mask_of((k + pi) % 4, row, &mut rng));
                cases.push((ri, p, u, mask));
            }
        }
    }
    let n = cases.len();
    let mut flat = Vec::with_capacity(n * vocab);
    let mut recs = Vec::with_capacity(n * DRAW_WORDS);
    let mut words = vec![0u32; n * mw];
    for (i, (ri, p, u, mask)) in cases.iter().enumerate() {
        flat.extend_from_slice(&rows[*ri]);
        recs.extend(draw_record(Some((&p.draw_params(), *u)), mask.is_some()));
        if let Some(m) = mask {
            words[i * mw..(i + 1) * mw].copy_from_slice(m);
        }
    }
    let d = be.up(&flat, "check-sample: logits")?;
    let dr = be.up(&recs, "check-sample: draws")?;
    let dm = be.up(&words, "check-sample: masks")?;
    let mut toks = be.up(&vec![u32::MAX; n], "check-sample: tokens")?;
    let mut stat = be.up(&vec![u32::MAX; n], "check-sample: status")?;
    let st = be.stream();
    // SAFETY: d holds n rows of vocab logits, dr n draw records and dm n
    // rows of mw words, uploaded above on this stream; nothing else uses
    // them until the results are read below (stream order).
    unsafe {
        be.d_mask_rows_at(
            d.device_ptr(st).0,
            n,
            vocab,
            dr.device_ptr(st).0,
            dm.device_ptr(st).0,
            mw,
        )?;
    }
    sample_on(be, (&d, &dr), n, vocab, (&mut toks, &mut stat))?;
    let toks = st.clone_dtoh(&toks)?;
    let stat = st.clone_dtoh(&stat)?;
    for (i, (ri, p, u, mask)) in cases.iter().enumerate() {
        let wm = mask.as_ref().map(|m| WordMask::new(m));
        let want = Sampler::new(*p)?.sample_masked(
            &rows[*ri],
            &[],
            Some(*u),
            wm.as_ref().map(|m| m as &dyn TokenMask),
        );
        // serve/masks.rs's greedy fallback.
        let got = match wm {
            Some(m) if !m.allows(toks[i]) && p.temperature == 0.0 => {
                m.first_allowed().unwrap_or(u32::MAX)
            }
            _ => toks[i],
        };
        match (&want, stat[i]) {
            (Ok(t), 0) if got == *t => {}
            (Err(_), 1 | 2) => {}
            _ => bail!(
                "check-sample: masked, vocab {vocab}, row {ri}, {p:?}, u {u}, {} allowed: the \
                 sampler gives {want:?}, the device token {} (taken as {got}) status {}",
                mask.as_ref()
                    .map_or(vocab as u32, |m| m.iter().map(|w| w.count_ones()).sum()),
                toks[i],
                stat[i]
            ),
        }
    }
    Ok(n)
}
