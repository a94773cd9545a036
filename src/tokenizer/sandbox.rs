//! Chat templates come from model files, which may be hostile. minijinja's
//! fuel bounds the instructions a rendering executes and the output cap
//! bounds what it writes, but neither bounds the memory of one expression:
//! `{% set ns.s = ns.s ~ ns.s %}` in a loop of 40 reaches a terabyte, and a
//! failed allocation aborts the whole process. A server therefore renders in
//! worker processes (`quire template-worker`) that cap their own address
//! space: such a template kills its worker, not the server; the request gets
//! an error and the next one a fresh worker.
//!
//! Protocol, one JSON object per line: the parent first sends a
//! [`WorkerConfig`], then one [`RenderRequest`] per rendering; the worker
//! answers each with a [`RenderReply`].

use super::chat::{render_turns, ChatMessage, ChatTurn, CHATML_TEMPLATE};
use super::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// The address-space cap of a worker. Renderings of real templates over
/// requests of the server's body limit use a few tens of MiB.
pub const DEFAULT_WORKER_MEMORY_MIB: u64 = 1024;
/// Wall-clock bound of one rendering (fuel bounds the loop; this bounds a
/// single slow builtin).
pub const DEFAULT_RENDER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct WorkerConfig {
    pub template: String,
    pub bos_token: String,
    pub eos_token: String,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct RenderRequest {
    pub messages: Vec<ChatTurn>,
    /// The template's `tools` variable; absent: undefined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    pub add_generation_prompt: bool,
}

#[derive(Serialize, Deserialize, Debug)]
pub enum RenderReply {
    Ok(String),
    Err(String),
}

/// Options of a [`RenderSandbox`].
#[derive(Clone, Debug)]
pub struct SandboxOptions {
    /// The `quire` binary (normally `std::env::current_exe()`).
    pub exe: PathBuf,
    pub memory_mib: u64,
    pub timeout: Duration,
    /// Most workers alive at once; renderings beyond wait for one.
    pub max_workers: usize,
}

impl SandboxOptions {
    pub fn new(exe: PathBuf) -> SandboxOptions {
        SandboxOptions {
            exe,
            memory_mib: DEFAULT_WORKER_MEMORY_MIB,
            timeout: DEFAULT_RENDER_TIMEOUT,
            max_workers: std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
        }
    }
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    /// Lines the worker wrote; closed when it exits.
    lines: mpsc::Receiver<String>,
}

impl Worker {
    fn kill(mut self) -> String {
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("status unknown: {e}"),
        }
    }
}

struct Pool {
    idle: Vec<Worker>,
    /// Workers alive, idle or rendering.
    alive: usize,
}

/// A pool of template workers for one template.
pub struct RenderSandbox {
    opts: SandboxOptions,
    config_line: String,
    pool: Mutex<Pool>,
    freed: Condvar,
}

impl RenderSandbox {
    /// Starts one worker and renders a probe conversation with it, so a
    /// binary that cannot run as a worker fails here, at start, and not on
    /// the first request.
    pub fn new(opts: SandboxOptions, config: WorkerConfig) -> Result<RenderSandbox> {
        let config_line = serde_json::to_string(&config).context("encoding the worker config")?;
        let sb = RenderSandbox {
            opts,
            config_line,
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                alive: 0,
            }),
            freed: Condvar::new(),
        };
        let w = sb.spawn().context("starting a chat template worker")?;
        let mut pool = sb.lock();
        pool.idle.push(w);
        pool.alive = 1;
        drop(pool);
        Ok(sb)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        // A panic while holding the lock leaves the pool consistent (it only
        // pushes and pops), so a poisoned lock is still usable.
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spawn(&self) -> Result<Worker> {
        let mut child = Command::new(&self.opts.exe)
            .arg("template-worker")
            .arg("--memory-mib")
            .arg(self.opts.memory_mib.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // A worker killed by its cap prints Rust's allocation failure;
            // the parent reports it as the request's error instead.
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {} template-worker", self.opts.exe.display()))?;
        let mut stdin = child.stdin.take().context("worker stdin")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("template-worker-reader".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("starting the worker's reader thread")?;
        writeln!(stdin, "{}", self.config_line).context("sending the worker its template")?;
        stdin.flush().context("sending the worker its template")?;
        Ok(Worker {
            child,
            stdin,
            lines,
        })
    }

    /// An idle worker, a new one, or (at `max_workers`) the next one freed.
    fn take(&self) -> Result<Worker> {
        let mut pool = self.lock();
        loop {
            if let Some(w) = pool.idle.pop() {
                return Ok(w);
            }
            if pool.alive < self.opts.max_workers.max(1) {
                pool.alive += 1;
                drop(pool);
                return self.spawn().inspect_err(|_| {
                    self.lock().alive -= 1;
                    self.freed.notify_one();
                });
            }
            pool = self.freed.wait(pool).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn give_back(&self, w: Worker) {
        self.lock().idle.push(w);
        self.freed.notify_one();
    }

    fn retire(&self, w: Worker) -> String {
        let status = w.kill();
        self.lock().alive -= 1;
        self.freed.notify_one();
        status
    }

    /// Renders in a worker. A worker that dies or overruns the timeout is
    /// killed and the rendering fails with an error saying which budget the
    /// template exceeded.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let turns: Vec<ChatTurn> = messages.iter().map(ChatTurn::from).collect();
        self.render_turns(&turns, None, add_generation_prompt)
    }

    /// [`Self::render`] over turns that may carry tool calls, with the
    /// template's `tools` variable (None: undefined).
    pub fn render_turns(
        &self,
        messages: &[ChatTurn],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let req = serde_json::to_string(&RenderRequest {
            messages: messages.to_vec(),
            tools: tools.cloned(),
            add_generation_prompt,
        })
        .context("encoding the render request")?;
        let mut w = self.take()?;
        if writeln!(w.stdin, "{req}")
            .and_then(|_| w.stdin.flush())
            .is_err()
        {
            let status = self.retire(w);
            bail!(
                "the chat template worker was gone ({status}); the next request starts a new one"
            );
        }
        match w.lines.recv_timeout(self.opts.timeout) {
            Ok(line) => {
                let reply: Result<RenderReply> = serde_json::from_str(&line)
                    .map_err(|e| anyhow!("the chat template worker answered garbage: {e}"));
                match reply {
                    Ok(r) => {
                        self.give_back(w);
                        match r {
                            RenderReply::Ok(s) => Ok(s),
                            RenderReply::Err(e) => Err(anyhow!(e)),
                        }
                    }
                    Err(e) => {
                        self.retire(w);
                        Err(e)
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.retire(w);
                bail!(
                    "the chat template exceeded its budget: rendering took more than {} s",
                    self.opts.timeout.as_secs_f64()
                )
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.retire(w);
                bail!(
                    "the chat template exceeded its budget: its renderer died ({status}), \
                     most likely at its memory cap of {} MiB",
                    self.opts.memory_mib
                )
            }
        }
    }
}

impl Drop for RenderSandbox {
    fn drop(&mut self) {
        for w in self.lock().idle.drain(..) {
            w.kill();
        }
    }
}

impl Tokenizer {
    /// Renders the chat template (the file's, else [`CHATML_TEMPLATE`]).
    ///
    /// Rendering follows HF transformers: `trim_blocks` and `lstrip_blocks`
    /// on; globals `messages`, `add_generation_prompt`, `bos_token`,
    /// `eos_token`, `raise_exception(msg)` and `strftime_now(fmt)` (UTC), and
    /// `tools` when the turns come with tools
    /// ([`Self::apply_chat_template_turns`]).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let turns: Vec<ChatTurn> = messages.iter().map(ChatTurn::from).collect();
        self.apply_chat_template_turns(&turns, None, add_generation_prompt)
    }

    /// [`Self::apply_chat_template`] over turns that may carry tool calls,
    /// with `tools` as the template's `tools` variable (None: undefined).
    pub fn apply_chat_template_turns(
        &self,
        messages: &[ChatTurn],
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        if let Some(sb) = self.sandbox.get() {
            return sb.render_turns(messages, tools, add_generation_prompt);
        }
        let c = self.template_config();
        render_turns(
            &c.template,
            messages,
            tools,
            add_generation_prompt,
            &c.bos_token,
            &c.eos_token,
        )
    }

    /// The template and the special-token strings it is rendered with.
    fn template_config(&self) -> WorkerConfig {
        WorkerConfig {
            template: self.chat_template().unwrap_or(CHATML_TEMPLATE).to_string(),
            bos_token: self
                .bos_id()
                .and_then(|i| self.token_text(i))
                .unwrap_or("")
                .to_string(),
            eos_token: self
                .eos_id()
                .and_then(|i| self.token_text(i))
                .unwrap_or("")
                .to_string(),
        }
    }

    /// From now on, renders chat templates in worker processes with a
    /// memory cap (see [`super::sandbox`]). Starts the first worker now.
    pub fn use_render_sandbox(&self, opts: SandboxOptions) -> Result<()> {
        let sb = RenderSandbox::new(opts, self.template_config())?;
        self.sandbox
            .set(Arc::new(sb))
            .map_err(|_| anyhow!("the render sandbox is already set"))
    }
}

/// The worker's main loop: caps its own address space, reads its template,
/// then answers render requests until stdin closes.
pub fn worker_main(memory_mib: u64) -> Result<()> {
    cap_address_space(memory_mib.saturating_mul(1 << 20))?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let first = lines
        .next()
        .context("no template config on stdin")?
        .context("reading the template config")?;
    let cfg: WorkerConfig = serde_json::from_str(&first).context("parsing the template config")?;
    let mut out = std::io::stdout().lock();
    for line in lines {
        let line = line.context("reading a render request")?;
        let reply = match serde_json::from_str::<RenderRequest>(&line) {
            Ok(req) => match render_turns(
                &cfg.template,
                &req.messages,
                req.tools.as_ref(),
                req.add_generation_prompt,
                &cfg.bos_token,
                &cfg.eos_token,
            ) {
                Ok(s) => RenderReply::Ok(s),
                Err(e) => RenderReply::Err(format!("{e:#}")),
            },
            Err(e) => RenderReply::Err(format!("malformed render request: {e}")),
        };
        let s = serde_json::to_string(&reply).context("encoding a reply")?;
        writeln!(out, "{s}").context("writing a reply")?;
        out.flush().context("writing a reply")?;
    }
    Ok(())
}

#[cfg(unix)]
fn cap_address_space(bytes: u64) -> Result<()> {
    let lim = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: setrlimit reads the struct we pass by pointer and has no other
    // memory effects; lowering a limit needs no privilege.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) };
    if rc != 0 {
        bail!(
            "setrlimit(RLIMIT_AS, {bytes}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

#[cfg(not(unix))]
fn cap_address_space(_bytes: u64) -> Result<()> {
    bail!("the chat template sandbox needs a unix address-space limit")
}
