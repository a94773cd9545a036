//! `quire serve`: the OpenAI-compatible server.

use super::ModelArgs;
use crate::scheduler::PrefillCap;
use crate::serve::EngineConfig;
use crate::server::{AppState, ServerOptions};
use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (the bound address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer <key>` (every endpoint but /health).
    /// Default: the QUIRE_API_KEY environment variable, else no key. An
    /// empty or whitespace-only key refuses to start.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Most sequences waiting for admission; beyond it requests get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// T: most tokens per step (decodes first, prefill chunks fill the rest).
    #[arg(long, default_value_t = 256)]
    pub max_batch_tokens: usize,
    /// Floor of the prefill budget per step, so prompts progress even when
    /// decodes fill T.
    #[arg(long, default_value_t = 32)]
    pub min_prefill_tokens: usize,
    /// A static prefill budget per step instead of the dynamic
    /// max(min-prefill-tokens, T - decodes).
    #[arg(long)]
    pub static_prefill_budget: Option<usize>,
    /// Most prefill tokens of one sequence per step: `off`, `auto`
    /// (min(T, ceil(0.04 * n_ctx)), at least the prefill floor) or a number.
    #[arg(long, default_value = "off", value_parser = parse_cap)]
    pub max_prefill_chunk: PrefillCap,
    /// Most sequences running at once.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// The model id clients pass (default: the GGUF file name without .gguf).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Seconds in-flight requests get to finish after Ctrl-C / SIGTERM.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace: u64,
    /// Disable prefix caching (every prompt is prefilled in full).
    #[arg(long)]
    pub no_prefix_cache: bool,
}

fn parse_cap(s: &str) -> std::result::Result<PrefillCap, String> {
    match s {
        "off" | "0" => Ok(PrefillCap::Off),
        "auto" => Ok(PrefillCap::Auto),
        n => n
            .parse::<usize>()
            .map(PrefillCap::Tokens)
            .map_err(|_| format!("expected off, auto or a token count, got '{n}'")),
    }
}

pub fn serve(a: ServeArgs) -> Result<()> {
    // Checked before the model loads: a bad key fails at once.
    let api_key = match &a.api_key {
        Some(k) => Some(crate::server::check_api_key(k).context("--api-key")?),
        None => match std::env::var("QUIRE_API_KEY") {
            Ok(k) => Some(crate::server::check_api_key(&k).context("QUIRE_API_KEY")?),
            Err(_) => None,
        },
    };
    let path = crate::fetch::resolve_model(a.model.model.as_deref())?;
    let model_id = a.served_model_name.clone().unwrap_or_else(|| {
        path.file_name()
            .map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| "quire".into())
    });
    let (runner, tok) = a.model.load()?;
    let cfg = EngineConfig {
        max_queue: a.max_queue,
        max_batch_tokens: a.max_batch_tokens,
        min_prefill_tokens: a.min_prefill_tokens,
        static_prefill_budget: a.static_prefill_budget,
        max_prefill_chunk: a.max_prefill_chunk,
        max_running: a.max_running,
        prefix_caching: !a.no_prefix_cache,
    };
    let mode = format!("{:?}", a.model.mode).to_lowercase();
    let (engine, join) = crate::serve::spawn(runner, cfg)?;
    let state = Arc::new(AppState {
        engine,
        tok: Arc::new(tok),
        fingerprint: format!("quire-{}-{mode}", env!("CARGO_PKG_VERSION")),
        model_id,
        api_key,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        next_id: AtomicU64::new(0),
        shutting_down: AtomicBool::new(false),
    });
    let opts = ServerOptions {
        host: a.host.clone(),
        port: a.port,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let model_id = state.model_id.clone();
    rt.block_on(crate::server::run(state, opts, move |addr| {
        // Tests and scripts wait for this line (the port may have been 0).
        eprintln!("quire serve: model `{model_id}` listening on http://{addr}");
        let _ = std::io::stderr().flush();
    }))?;
    // Drop the runtime's leftover tasks (the shutdown timer holds an engine
    // handle), so every handle is gone.
    rt.shutdown_timeout(Duration::from_secs(1));
    // Every handle is dropped with the server: the engine thread ends once
    // its sequences have (the shutdown deadline cancels stragglers).
    join.join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    eprintln!("quire serve: stopped");
    Ok(())
}
