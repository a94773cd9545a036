//! `quire serve`: the OpenAI-compatible server.

use super::ModelArgs;
use crate::scheduler::PrefillCap;
use crate::serve::EngineConfig;
use crate::server::{AppState, BodyLimits, ConnLimits, ServerOptions};
use crate::tokenizer::sandbox::SandboxOptions;
use crate::tokenizer::SpecialsInContent;
use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
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
    /// T: most tokens per step (decodes first, prefill chunks fill the
    /// rest). Default: 2048 with the model on a GPU, 256 on the CPU.
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
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
    /// Let browsers on these origins call the API (CORS): `*` for any, or
    /// comma-separated `https://host[:port]` origins. Default: none.
    #[arg(long, value_name = "ORIGINS")]
    pub cors_origins: Option<String>,
    /// Most open client connections; one more gets 503 (JSON) and is
    /// closed. Keep it under the process's file-descriptor limit.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's line and headers; a
    /// keep-alive connection idle this long is closed too.
    #[arg(long, default_value_t = 30.0)]
    pub header_read_timeout: f64,
    /// Seconds a client has to send the whole request body, once its
    /// headers arrived (408 after).
    #[arg(long, default_value_t = 60.0)]
    pub body_read_timeout: f64,
    /// Largest request body in bytes (413 beyond it; at once when
    /// Content-Length says so).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Let control-token text in chat message contents become control
    /// tokens (as the template's own markup does). Off: such text is
    /// tokenized as plain text, so a client cannot open a fake system turn.
    /// Only for clients you trust.
    #[arg(long)]
    pub trust_special_tokens: bool,
    /// Render chat templates in this process instead of memory-capped
    /// worker processes (a template that builds a huge string can then
    /// abort the server). For debugging templates.
    #[arg(long)]
    pub no_template_sandbox: bool,
}

/// `--max-batch-tokens` on a GPU: prefill chunks of up to 2,048 tokens keep
/// the tensor cores busy (a budget of 256 spent most steps' weight reads
/// on decode-sized batches, and a burst of prompts waited long for their
/// first token).
const GPU_BATCH_TOKENS: usize = 2048;
/// `--max-batch-tokens` on the CPU, where a step's cost grows with its
/// tokens and a large one stalls the running decodes.
const CPU_BATCH_TOKENS: usize = 256;

/// A positive, finite number of seconds.
fn seconds(v: f64, flag: &str) -> Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        anyhow::bail!("{flag} must be a positive number of seconds, got {v}");
    }
    Duration::try_from_secs_f64(v).with_context(|| format!("{flag} {v}"))
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
    let cors_origins = match &a.cors_origins {
        Some(o) => crate::server::parse_cors_origins(o).context("--cors-origins")?,
        None => Vec::new(),
    };
    let api_key = match &a.api_key {
        Some(k) => Some(crate::server::check_api_key(k).context("--api-key")?),
        None => match std::env::var("QUIRE_API_KEY") {
            Ok(k) => Some(crate::server::check_api_key(&k).context("QUIRE_API_KEY")?),
            Err(_) => None,
        },
    };
    let header_read_timeout = seconds(a.header_read_timeout, "--header-read-timeout")?;
    let body_read_timeout = seconds(a.body_read_timeout, "--body-read-timeout")?;
    if a.max_connections == 0 || a.max_body_bytes == 0 {
        anyhow::bail!("--max-connections and --max-body-bytes must be at least 1");
    }
    let path = a.model.resolve_path()?;
    let model_id = a.served_model_name.clone().unwrap_or_else(|| {
        path.file_name()
            .map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| "quire".into())
    });
    let t_load = std::time::Instant::now();
    let (runner, tok) = a.model.load_serving(!a.no_prefix_cache, a.max_running)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let on_device = runner.step_paths().is_some();
    let max_batch_tokens = a.max_batch_tokens.unwrap_or(if on_device {
        GPU_BATCH_TOKENS
    } else {
        CPU_BATCH_TOKENS
    });
    eprintln!(
        "quire serve: {} on {} (loaded in {load_s:.1} s); max-running {}, max-batch-tokens {max_batch_tokens}, KV cache {} tokens{}",
        a.model.mode_name(),
        runner.placement(),
        a.max_running,
        runner.kv_capacity_tokens(),
        if a.model.kv_tokens.is_none() && on_device {
            " (from the device's free memory)"
        } else {
            ""
        }
    );
    let eager = runner.decode_sizes_without_graphs(a.max_running);
    if on_device && !eager.is_empty() {
        eprintln!(
            "quire serve: decode batches of {}..={} sequences run op by op, not as CUDA graphs \
             (fast mode's cuBLAS GEMMs past 64 rows are not captured); --max-running 64 keeps \
             every batch in a graph",
            eager[0],
            eager[eager.len() - 1]
        );
    }
    let cfg = EngineConfig {
        max_queue: a.max_queue,
        max_batch_tokens,
        min_prefill_tokens: a.min_prefill_tokens,
        static_prefill_budget: a.static_prefill_budget,
        max_prefill_chunk: a.max_prefill_chunk,
        max_running: a.max_running,
        prefix_caching: !a.no_prefix_cache,
        state_snapshot_stride: a.model.state_snapshot_stride,
    };
    let mode = a.model.mode_name();
    let (engine, join) = crate::serve::spawn(runner, cfg)?;
    if !a.no_template_sandbox {
        let exe =
            std::env::current_exe().context("finding the quire binary for template workers")?;
        tok.use_render_sandbox(SandboxOptions::new(exe)).context(
            "starting the chat template sandbox (--no-template-sandbox renders in process)",
        )?;
    }
    let mut state = AppState::new(engine, Arc::new(tok), model_id);
    if a.trust_special_tokens {
        state.specials_in_content = SpecialsInContent::Trusted;
    }
    state.fingerprint = format!("quire-{}-{mode}", env!("CARGO_PKG_VERSION"));
    state.api_key = api_key;
    state.cors_origins = cors_origins;
    state.body_limits = BodyLimits {
        max_body_bytes: a.max_body_bytes,
        body_read_timeout,
    };
    let state = Arc::new(state);
    let opts = ServerOptions {
        host: a.host.clone(),
        port: a.port,
        conn: ConnLimits {
            header_read_timeout,
            max_connections: a.max_connections,
            shutdown_grace: Duration::from_secs(a.shutdown_grace),
        },
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
