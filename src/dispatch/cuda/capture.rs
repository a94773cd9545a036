//! Capturing a decode graph, which `decode_run` (graph.rs) does
//! right after the step of a new graph key ran op by op. Nothing runs
//! between the two, so the buffers the capture takes are in the pool
//! already (pool.rs) and it allocates nothing; one the pool's best fit
//! still misses is added and the capture made again. A capture that fails anyway
//! is tried again on the next step of that key, up to `CAPTURE_ATTEMPTS`
//! times; then the key runs op by op for good, counted in
//! `StepPaths::capture_failures` and logged once.

use super::graph::{DecodeFn, DecodeGraph, GraphIo, SendGraph};
use super::{CudaExec, DevKvCache};
use crate::backend::cuda::drv;
use anyhow::{anyhow, Result};
use std::sync::atomic::Ordering;

/// Captures of one graph key that may fail before it runs op by op for
/// good.
pub(super) const CAPTURE_ATTEMPTS: u32 = 3;

/// Buffers one capture may add to the pool (each after a capture that
/// missed it) before it counts as failed.
const MAX_TOP_UPS: usize = 16;

impl CudaExec {
    /// Captures graph `g` (its step just ran op by op) and keeps it, or
    /// counts the failure: the next step of its key tries again, and after
    /// `CAPTURE_ATTEMPTS` failures the key runs op by op for good.
    pub(super) fn capture_or_retry(
        &self,
        g: &mut DecodeGraph,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
        b: usize,
        vocab: usize,
    ) {
        // Captured with nothing between it and the step, the capture finds
        // each buffer that step used in the pool; the pool's best fit may
        // still hand one to an earlier request than the step did, leaving
        // a later one without. Each such miss adds the missing buffer and
        // captures again (the pool only grows, so this ends).
        let mut r = self.capture(g, kv, step, b, vocab);
        for _ in 0..MAX_TOP_UPS {
            let Some(len) = r.as_ref().err().and_then(super::pool::missing_buffer) else {
                break;
            };
            r = self
                .pool_add(len)
                .and_then(|()| self.capture(g, kv, step, b, vocab));
        }
        match r {
            Ok(graph) => {
                g.arena_len = self.be.arena_len();
                g.graph = Some(graph);
                g.capture_attempts = 0;
                self.count_path(|p| p.captures += 1);
            }
            Err(e) => {
                g.capture_attempts += 1;
                self.count_path(|p| p.capture_failures += 1);
                if let Ok(mut last) = self.capture_error.lock() {
                    *last = Some(format!("batch {b}: {e:#}"));
                }
                if g.capture_attempts >= CAPTURE_ATTEMPTS {
                    g.capture_failed = true;
                    tracing::warn!(
                        "cuda graph capture for batch {b} failed {} times ({e:#}); running it op by op",
                        g.capture_attempts
                    );
                } else {
                    tracing::info!(
                        "cuda graph capture for batch {b} failed ({e:#}); its next step tries again"
                    );
                }
            }
        }
    }

    /// Records the step's ops on `g`'s fixed inputs as a CUDA graph
    /// (nothing runs) and instantiates it; on sm_90+ with programmatic
    /// edges.
    fn capture(
        &self,
        g: &mut DecodeGraph,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
        b: usize,
        vocab: usize,
    ) -> Result<SendGraph> {
        let st = self.be.stream();
        let l2_on = self.be.l2_prepare(&mut g.l2, g.l2_measured)?;
        let io = GraphIo::of(
            &g.batch,
            &g.rows,
            &g.state_slots.0,
            g.greedy.as_ref(),
            b,
            vocab,
            st,
        )?;
        drv(
            st.begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            ),
            "beginning graph capture",
        )?;
        self.capturing.store(true, Ordering::Relaxed);
        // The read-ahead branch (ops/l2_ahead) forks first and is joined
        // last, after a failed step too.
        let mut l2 = g.l2.as_mut().filter(|_| l2_on);
        let r = match &mut l2 {
            Some(l) => self.be.l2_begin(l),
            None => Ok(()),
        };
        let r = r.and_then(|()| step(self, kv, &io.bufs)).and_then(|l| {
            let l = l.ok_or_else(|| anyhow!("decode step returned no logits"))?;
            self.decode_finish(l, &mut g.out, io.fin.as_ref())
        });
        let (r, l2_log) = match &l2 {
            Some(l) => match self.be.l2_end(l) {
                Ok(log) => (r, Some(log)),
                Err(e) => (r.and(Err(e)), None),
            },
            None => (r, None),
        };
        self.capturing.store(false, Ordering::Relaxed);
        let graph = drv(
            st.end_capture(
                cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            ),
            "ending graph capture",
        );
        let graph =
            r.and_then(|()| graph?.ok_or_else(|| anyhow!("graph capture produced no graph")))?;
        if let (Some(log), Some(l2)) = (l2_log, l2) {
            let (n, ahead) = self.be.l2_upload(l2, &log)?;
            tracing::debug!(
                "decode graph for batch {b}: l2 read-ahead of {n} pieces, {} KiB ahead",
                ahead >> 10
            );
        }
        if !self.be.pdl_enabled() {
            return Ok(SendGraph(graph, None));
        }
        let (exec, edges) = self.be.instantiate_pdl(graph.cu_graph())?;
        tracing::debug!("decode graph for batch {b}: {edges} programmatic edges");
        Ok(SendGraph(graph, Some(exec)))
    }
}
