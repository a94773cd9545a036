//! Decode steps that draw on the device with grammar masks: the step's
//! forward replays the ordinary decode graph (its logits stay on the
//! device), and while the device runs it the host computes the rows'
//! masks (`fill`); then the masks and draw records go up, `mask_rows` and
//! `sample_rows` run on the logits, and only the tokens come down. So a
//! mask costs the step nothing while the forward outlasts it, where a
//! mask computed before a greedy graph's launch would wait in front of
//! it (llguidance takes up to a few hundred microseconds on a row inside
//! a JSON string, and a step waits for its slowest row).

use super::graph::GraphSel;
use super::{CudaExec, DecodeFn, DevKvCache};
use crate::backend::cuda::{draw_record, drv, DRAW_WORDS};
use crate::sampler::{DrawParams, RowMasks};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaSlice, DevicePtr};

impl CudaExec {
    /// A decode step (as [`CudaExec::decode_step`]: one row per sequence)
    /// whose tokens are drawn on the device: `draws` per row (None:
    /// greedy; each within `device_draws`), through the masks `fill`
    /// writes into `masks` (called once the forward is on the stream;
    /// `masks` must then have one row per step row, or none). Returns each
    /// row's token; a row whose logits hold a NaN or +inf (or, sampled,
    /// only -inf) is an error, as the sampler makes it.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_step_draw(
        &self,
        vocab: usize,
        input: &crate::dispatch::StepInput<'_>,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
        draws: &[Option<(DrawParams, f64)>],
        masks: &mut RowMasks,
        fill: &mut dyn FnMut(&mut RowMasks),
    ) -> Result<Vec<u32>> {
        let b = input.tokens.len();
        ensure!(
            draws.len() == b,
            "decode step: {} draws for {b} rows",
            draws.len()
        );
        let sel = GraphSel {
            key: Self::graph_key(input, false),
            chain: None,
            draws: &[],
            synced: true,
        };
        self.decode_run(vocab, input, kv, step, sel, |be, g| {
            // The forward is on the stream: the host's part now.
            fill(masks);
            let masked = masks.any();
            ensure!(
                !masked || (masks.len() == b && masks.words() == RowMasks::words_for(vocab)),
                "decode step: masks of {} rows of {} words for {b} rows of {vocab} ids",
                masks.len(),
                masks.words()
            );
            let mw = if masked { masks.words() } else { 0 };
            let mut host: Vec<u32> = Vec::with_capacity(b * (DRAW_WORDS + mw));
            for (r, d) in draws.iter().enumerate() {
                host.extend(draw_record(
                    d.as_ref().map(|(p, u)| (p, *u)),
                    masked && masks.has(r),
                ));
            }
            if masked {
                host.extend_from_slice(&masks.data()[..b * mw]);
            }
            let mut bufs = self
                .draw_bufs
                .lock()
                .map_err(|_| anyhow!("cuda: draw buffer lock poisoned"))?;
            let need = host.len() + 2 * b;
            if bufs
                .as_ref()
                .is_none_or(|d: &CudaSlice<u32>| d.len() < need)
            {
                *bufs = Some(be.scratch::<u32>(need.next_power_of_two(), "decode draws")?);
            }
            let d = bufs.as_mut().ok_or_else(|| anyhow!("decode draws"))?;
            let st = be.stream();
            drv(
                st.memcpy_htod(&host, &mut d.slice_mut(0..host.len())),
                "decode draws",
            )?;
            let base = d.device_ptr(st).0;
            let (recs, mptr) = (base, base + 4 * (b * DRAW_WORDS) as u64);
            let out = base + 4 * host.len() as u64;
            let logits = g.out.slice(0..b * vocab);
            // SAFETY: g.out holds the step's (b, vocab) logits (the graph's
            // last node writes them, stream order), which nothing reads
            // after these launches until the next step rewrites them; the
            // draw buffer holds b records, then (masked) b rows of mw
            // words, then 2 b u32 for tokens and statuses, written by the
            // copy above (stream order) and read back below after a sync.
            unsafe {
                if masked {
                    be.d_mask_rows_at(logits.device_ptr(st).0, b, vocab, recs, mptr, mw)?;
                }
                be.d_sample_rows_at(&logits, b, vocab, recs, out, out + 4 * b as u64, None)?;
            }
            let mut res = vec![0u32; 2 * b];
            let tail = d.slice(host.len()..host.len() + 2 * b);
            drv(st.memcpy_dtoh(&tail, &mut res), "decode draws: tokens")?;
            be.sync("decode draws: tokens")?;
            super::greedy::draw_statuses(&res[b..])?;
            res.truncate(b);
            Ok(res)
        })
    }
}
