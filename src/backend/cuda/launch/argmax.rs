//! The greedy token choice on the device (kernels/argmax.cu): a greedy
//! decode step's next token without downloading its logits. The rule is
//! the sampler's (`Sampler::sample` at temperature 0, sampler.rs): the
//! first maximum in id order; a row with a NaN or +inf logit is flagged,
//! not chosen from.

use crate::backend::cuda::{drv, CudaBackend};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// Threads per row (ARGMAX_THREADS in argmax.cu).
const ARGMAX_THREADS: u32 = 1024;

impl CudaBackend {
    /// For each of the `n` rows of `logits` (n, vocab): `tokens[i]` its
    /// greedy token, `status[i]` 1 where the row holds a NaN or +inf
    /// (`tokens[i]` is then meaningless), else 0.
    pub(crate) fn d_argmax_rows(
        &self,
        logits: &CudaView<'_, f32>,
        n: usize,
        vocab: usize,
        tokens: &mut CudaViewMut<'_, u32>,
        status: &mut CudaViewMut<'_, u32>,
    ) -> Result<()> {
        ensure!(
            vocab > 0 && logits.len() >= n * vocab && tokens.len() >= n && status.len() >= n,
            "argmax_rows: {n} rows of {vocab} logits need logits >= {}, tokens and status >= {n} \
             (got {}, {}, {})",
            n * vocab,
            logits.len(),
            tokens.len(),
            status.len()
        );
        if n == 0 {
            return Ok(());
        }
        let vi = i32::try_from(vocab)?;
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(n)?, 1, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(self.func("argmax_rows")?);
        b.arg(logits).arg(&vi).arg(tokens).arg(status);
        // SAFETY: matches argmax_rows (logits, vocab, tokens, status); the
        // grid has one CTA per row, and each buffer holds the n rows
        // checked above.
        drv(unsafe { b.launch(cfg) }, "argmax_rows: launch")?;
        Ok(())
    }
}
