//! OpenAI request bodies and their validation into an engine request.

use super::error::ApiError;
use crate::sampler::SamplingParams;
use crate::serve::{EngineLimits, GenRequest};
use crate::tokenizer::{ChatMessage, Tokenizer};
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// Most choices per request.
pub const MAX_N: u32 = 16;
/// Most `top_logprobs` (chat) / `logprobs` (completions).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most stop strings.
pub const MAX_STOP: usize = 16;

/// `stop`: one string or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Clone, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A message's content: a string or a list of parts (only text parts).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct InMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

/// Sampling and length fields shared by both endpoints.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct Common {
    pub model: String,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub stop: Option<StopSpec>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Extension (vLLM): 0 or -1 = off.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Extension (vLLM).
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Extension (vLLM).
    #[serde(default)]
    pub repetition_penalty: Option<f32>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub n: Option<u32>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Vec<InMessage>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
}

/// `prompt`: a string, a list of one string, or a list of token ids.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize, Debug, Clone)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: PromptSpec,
    /// Log-probabilities of the chosen token and this many alternatives.
    #[serde(default)]
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub suffix: Option<String>,
}

/// Parses a JSON body; malformed JSON or wrong types give a 400 that says
/// where.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request body"
        };
        ApiError::bad_request(format!("{what}: {e}"), None)
    })
}

/// A validated request, ready for the engine.
pub struct Prepared {
    pub gen: GenRequest,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub prompt_tokens: usize,
}

impl ChatRequest {
    pub fn messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        let mut out = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            if !matches!(
                m.role.as_str(),
                "system" | "user" | "assistant" | "developer" | "tool"
            ) {
                return Err(ApiError::bad_request(
                    format!("messages[{i}].role: unknown role `{}`", m.role),
                    Some("messages"),
                ));
            }
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => s.push_str(t),
                            (k, _) => {
                                return Err(ApiError::bad_request(
                                    format!("messages[{i}].content: unsupported part type `{k}` (only text)"),
                                    Some("messages"),
                                ))
                            }
                        }
                    }
                    s
                }
            };
            // The "developer" role is OpenAI's new name for "system".
            let role = if m.role == "developer" {
                "system".to_string()
            } else {
                m.role.clone()
            };
            out.push(ChatMessage { role, content });
        }
        Ok(out)
    }
}

/// Builds the engine request: sampling parameters, limits against the
/// context and the KV pool, stop strings.
pub fn prepare(
    c: &Common,
    prompt: Vec<u32>,
    max_tokens: Option<u64>,
    top_logprobs: Option<usize>,
    tok: &Tokenizer,
    limits: &EngineLimits,
) -> Result<Prepared, ApiError> {
    let ctx = limits.context_length;
    let p = prompt.len();
    if p == 0 {
        return Err(ApiError::bad_request("the prompt is empty", Some("prompt")));
    }
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= limits.vocab_size) {
        return Err(ApiError::bad_request(
            format!(
                "token id {t} is outside the vocabulary of {}",
                limits.vocab_size
            ),
            Some("prompt"),
        ));
    }
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_tokens must be at least 1",
            Some("max_tokens"),
        ));
    }
    if p >= ctx {
        return Err(ApiError::context_length(format!(
            "This model's maximum context length is {ctx} tokens. However, your prompt has {p} tokens, leaving no room for a completion. Please reduce the length of the prompt."
        )));
    }
    let max_tokens = match max_tokens {
        Some(m) => {
            let m = usize::try_from(m).unwrap_or(usize::MAX);
            if p.saturating_add(m) > ctx {
                return Err(ApiError::context_length(format!(
                    "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({p} in the prompt, {m} in the completion). Please reduce the length of the prompt or completion.",
                    p.saturating_add(m)
                )));
            }
            m
        }
        None => ctx - p,
    };
    if p + 1 > limits.kv_tokens {
        return Err(ApiError::context_length(format!(
            "The prompt has {p} tokens but the server's KV cache holds {} tokens (--kv-tokens).",
            limits.kv_tokens
        )));
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(ApiError::bad_request(
            format!("temperature must be in [0, 2], got {temperature}"),
            Some("temperature"),
        ));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(
            format!("top_p must be in (0, 1], got {top_p}"),
            Some("top_p"),
        ));
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ApiError::bad_request(
                format!("top_k must be -1, 0 or positive, got {k}"),
                Some("top_k"),
            ))
        }
    };
    let min_p = c.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::bad_request(
            format!("min_p must be in [0, 1], got {min_p}"),
            Some("min_p"),
        ));
    }
    let repetition_penalty = c.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
        return Err(ApiError::bad_request(
            format!("repetition_penalty must be > 0, got {repetition_penalty}"),
            Some("repetition_penalty"),
        ));
    }
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad_request(
            format!("n must be in [1, {MAX_N}], got {n}"),
            Some("n"),
        ));
    }
    // No seed: a fresh one per request (OpenAI semantics: not reproducible
    // unless asked). With a seed, output is reproducible by construction.
    let seed = c.seed.map(|s| s as u64).unwrap_or_else(rand::random::<u64>);
    let stops: Vec<String> = match &c.stop {
        None => Vec::new(),
        Some(StopSpec::One(s)) => vec![s.clone()],
        Some(StopSpec::Many(v)) => v.clone(),
    }
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect();
    if stops.len() > MAX_STOP {
        return Err(ApiError::bad_request(
            format!("at most {MAX_STOP} stop strings, got {}", stops.len()),
            Some("stop"),
        ));
    }
    let params = SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        repeat_last_n: if repetition_penalty == 1.0 { 0 } else { 64 },
        seed,
    };
    Ok(Prepared {
        gen: GenRequest {
            prompt,
            params,
            max_tokens,
            stop_ids: tok.stop_ids().to_vec(),
            top_logprobs,
            n: n as usize,
        },
        stops,
        stream: c.stream.unwrap_or(false),
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        prompt_tokens: p,
    })
}

/// `top_logprobs` of a chat request: Some(k) when `logprobs` is true.
pub fn chat_logprobs(r: &ChatRequest) -> Result<Option<usize>, ApiError> {
    let k = r.top_logprobs.unwrap_or(0);
    if k > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_request(
            format!("top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}"),
            Some("top_logprobs"),
        ));
    }
    match r.logprobs {
        Some(true) => Ok(Some(k as usize)),
        _ if r.top_logprobs.is_some_and(|k| k > 0) => Err(ApiError::bad_request(
            "top_logprobs requires logprobs to be true",
            Some("top_logprobs"),
        )),
        _ => Ok(None),
    }
}

/// `logprobs` of a completion request.
pub fn completion_logprobs(r: &CompletionRequest) -> Result<Option<usize>, ApiError> {
    match r.logprobs {
        None => Ok(None),
        Some(k) if k <= MAX_TOP_LOGPROBS => Ok(Some(k as usize)),
        Some(k) => Err(ApiError::bad_request(
            format!("logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}"),
            Some("logprobs"),
        )),
    }
}

/// Token ids of a completion prompt.
pub fn completion_prompt(r: &CompletionRequest, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    if r.echo == Some(true) {
        return Err(ApiError::bad_request("echo is not supported", Some("echo")));
    }
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request(
            "suffix is not supported",
            Some("suffix"),
        ));
    }
    let text = match &r.prompt {
        PromptSpec::Text(t) => t.as_str(),
        PromptSpec::Texts(v) if v.len() == 1 => v[0].as_str(),
        PromptSpec::Texts(v) => {
            return Err(ApiError::bad_request(
                format!(
                    "exactly one prompt per request is supported, got {}",
                    v.len()
                ),
                Some("prompt"),
            ))
        }
        PromptSpec::Tokens(ids) => return Ok(ids.clone()),
    };
    tok.encode(text, true, false).map_err(|e| {
        ApiError::bad_request(format!("cannot tokenize the prompt: {e:#}"), Some("prompt"))
    })
}
