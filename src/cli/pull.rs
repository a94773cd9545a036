//! `quire pull owner/name[:quant]`: downloads a GGUF from the Hugging Face
//! Hub into its cache (src/hub.rs) and prints the local path on stdout, so
//! `quire run -m "$(quire pull …)"` works.

use crate::hub::{HfSpec, PullOptions};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// `owner/name[:quant]`, e.g. `unsloth/Qwen3-0.6B-GGUF:Q4_K_M`. Without
    /// a quant: the repo's only .gguf, else its Q4_K_M, else its Q4_0.
    #[arg(value_name = "OWNER/NAME[:QUANT]")]
    pub spec: HfSpec,
    /// Branch, tag or commit.
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Hub cache directory (default: `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Hub base URL (default: `$HF_ENDPOINT`, else https://huggingface.co).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
}

pub fn pull(a: PullArgs) -> Result<()> {
    let opts = PullOptions {
        endpoint: a.endpoint,
        cache_dir: a.cache_dir,
        token: None,
        revision: Some(a.revision),
    };
    let path = crate::hub::pull(&a.spec, &opts)?;
    println!("{}", path.display());
    Ok(())
}
