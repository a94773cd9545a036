//! `quire run` and `quire chat`.

use super::{ModelArgs, SamplingArgs};
use crate::engine::{generate, GenStats, GenerateOptions};
use crate::kv::SeqId;
use crate::runner::Runner;
use crate::sampler::BadLogits;
use crate::tokenizer::{ChatMessage, SpecialsInContent, StreamDecoder, Tokenizer};
use anyhow::{anyhow, Result};
use clap::Args;
use std::io::{BufRead, Write};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The user message (or raw text with --raw).
    #[arg(long, short = 'p', default_value = "What is the capital of France?")]
    pub prompt: String,
    /// Optional system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Feed the prompt as raw text, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Optional system message.
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
}

fn gen_opts(tok: &Tokenizer, s: &SamplingArgs, ubatch: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: s.max_tokens,
        sampling: s.params(),
        n_ubatch: ubatch,
        stop_ids: tok.stop_ids().to_vec(),
    }
}

/// Generates and streams text to stdout; returns the text and stats.
fn stream_reply(
    runner: &mut Runner,
    tok: &Tokenizer,
    seq: SeqId,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> Result<(String, GenStats)> {
    let mut dec = StreamDecoder::new(tok, true);
    let mut text = String::new();
    let stops = opts.stop_ids.clone();
    let mut stdout = std::io::stdout();
    let mut received = 0usize;
    let r = generate(runner, seq, prompt, opts, &mut |t| {
        received += 1;
        if !stops.contains(&t) {
            if let Some(piece) = dec.push(t)? {
                text.push_str(&piece);
                stdout.write_all(piece.as_bytes())?;
                stdout.flush()?;
            }
        }
        Ok(true)
    });
    let (_, stats) = match r {
        Ok(r) => r,
        Err(e) => {
            // The position of the token the bad logits were to choose.
            println!();
            return Err(match BadLogits::message_of(&e, prompt.len() + received) {
                Some(m) => anyhow!(m),
                None => e,
            });
        }
    };
    if let Some(rest) = dec.finish() {
        text.push_str(&rest);
        stdout.write_all(rest.as_bytes())?;
    }
    println!();
    Ok((text, stats))
}

fn print_stats(s: &GenStats) {
    eprintln!(
        "[prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s | {}]",
        s.prompt_tokens,
        s.prefill_tps(),
        s.generated_tokens,
        s.decode_tps(),
        s.finish_reason
    );
}

pub fn run(a: RunArgs) -> Result<()> {
    let (mut runner, tok) = a.model.load()?;
    let prompt = if a.raw {
        tok.encode(&a.prompt, true, false)?
    } else {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage {
                role: "system".into(),
                content: s.clone(),
            });
        }
        msgs.push(ChatMessage {
            role: "user".into(),
            content: a.prompt.clone(),
        });
        // Contents are data here too: control-token text in the prompt
        // stays text (a prompt may come from anywhere).
        let p = tok.render_chat(&msgs, true, SpecialsInContent::AsText)?;
        tok.encode_chat(&p)?
    };
    let opts = gen_opts(&tok, &a.sampling, a.ubatch);
    let (_, stats) = stream_reply(&mut runner, &tok, SeqId(0), &prompt, &opts)?;
    print_stats(&stats);
    a.model.report_backends(&runner);
    Ok(())
}

pub fn chat(a: ChatArgs) -> Result<()> {
    let (mut runner, tok) = a.model.load()?;
    let opts = gen_opts(&tok, &a.sampling, a.ubatch);
    let mut msgs = Vec::new();
    if let Some(s) = &a.system {
        msgs.push(ChatMessage {
            role: "system".into(),
            content: s.clone(),
        });
    }
    eprintln!("quire chat: type a message, an empty line or Ctrl-D to quit, /reset to clear");
    let stdin = std::io::stdin();
    let mut turn = 0u64;
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            break;
        }
        if line == "/reset" {
            msgs.retain(|m: &ChatMessage| m.role == "system");
            continue;
        }
        msgs.push(ChatMessage {
            role: "user".into(),
            content: line.to_string(),
        });
        let p = tok.render_chat(&msgs, true, SpecialsInContent::AsText)?;
        let prompt = tok.encode_chat(&p)?;
        // Each turn re-prefills the conversation as a fresh sequence.
        let (reply, stats) = stream_reply(&mut runner, &tok, SeqId(turn), &prompt, &opts)?;
        print_stats(&stats);
        msgs.push(ChatMessage {
            role: "assistant".into(),
            content: reply.trim().to_string(),
        });
        turn += 1;
    }
    Ok(())
}
