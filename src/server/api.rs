//! OpenAI request bodies and their validation into an engine request.

use super::error::ApiError;
use crate::sampler::{LogitAdjust, SamplingParams};
use crate::serve::{EngineLimits, GenRequest};
use crate::tokenizer::content::ChatTurn;
use crate::tokenizer::Tokenizer;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Most choices per request.
pub const MAX_N: u32 = 16;
/// Most `top_logprobs` (chat) / `logprobs` (completions).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most stop strings.
pub const MAX_STOP: usize = 16;
/// Most tools per request (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

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
    /// An assistant turn's calls: OpenAI's list, checked by
    /// [`ChatRequest::messages`].
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// The call a `tool` turn answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
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
    /// Token id (as a string) -> bias in [-100, 100].
    #[serde(default)]
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// Structured output (`json_object`, `json_schema`, the `grammar`
    /// extension): see [`super::structured::response_grammar`].
    #[serde(default)]
    pub response_format: Option<Value>,
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
    /// OpenAI tool objects, checked by [`ChatRequest::tools`].
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Accepted: several calls per turn are always allowed (what the model
    /// writes is what is parsed).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}

/// A `tool_choice` that obliges the model to call (enforced by a grammar:
/// [`super::structured::tool_grammar`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForcedTools {
    /// At least one call, to any of the tools.
    Required,
    /// One call to this function.
    Named(String),
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list
/// of token-id lists (each element of a list is its own prompt).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// Most prompts in one completion request.
pub const MAX_PROMPTS: usize = 64;

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

/// Which endpoint a body is for (their fields differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    /// The field holding the prompt: errors about its length name it.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// Checks that one field's JSON value has the type the request struct
/// expects (so a type error can name the field).
pub(super) type Probe = fn(&Value) -> Result<(), serde_json::Error>;

pub(super) fn probe<T: DeserializeOwned>(v: &Value) -> Result<(), serde_json::Error> {
    T::deserialize(v).map(drop)
}

/// Every field [`Common`] reads, with its type. Invariant: this table and
/// the struct list the same fields (a field missing here is refused as
/// unknown; the tests send each).
const COMMON_FIELDS: &[(&str, Probe)] = &[
    ("model", probe::<String>),
    ("stream", probe::<Option<bool>>),
    ("stream_options", probe::<Option<StreamOptions>>),
    ("max_tokens", probe::<Option<u64>>),
    ("stop", probe::<Option<StopSpec>>),
    ("temperature", probe::<Option<f32>>),
    ("top_p", probe::<Option<f32>>),
    ("top_k", probe::<Option<i64>>),
    ("min_p", probe::<Option<f32>>),
    ("repetition_penalty", probe::<Option<f32>>),
    ("seed", probe::<Option<i64>>),
    ("n", probe::<Option<u32>>),
    (
        "logit_bias",
        probe::<Option<std::collections::BTreeMap<String, f32>>>,
    ),
    ("frequency_penalty", probe::<Option<f32>>),
    ("presence_penalty", probe::<Option<f32>>),
    ("response_format", probe::<Option<Value>>),
];

/// The fields only [`ChatRequest`] reads.
const CHAT_FIELDS: &[(&str, Probe)] = &[
    ("messages", probe::<Vec<InMessage>>),
    ("max_completion_tokens", probe::<Option<u64>>),
    ("logprobs", probe::<Option<bool>>),
    ("top_logprobs", probe::<Option<u32>>),
    ("tools", probe::<Option<Vec<Value>>>),
    ("tool_choice", probe::<Option<Value>>),
    ("parallel_tool_calls", probe::<Option<bool>>),
];

/// The fields only [`CompletionRequest`] reads.
const COMPLETION_FIELDS: &[(&str, Probe)] = &[
    ("prompt", probe::<PromptSpec>),
    ("logprobs", probe::<Option<u32>>),
    ("echo", probe::<Option<bool>>),
    ("suffix", probe::<Option<String>>),
];

/// Fields accepted and ignored on purpose: they change nothing a client can
/// observe in this server's output (bookkeeping for OpenAI's platform;
/// `parallel_tool_calls` on `/v1/completions`, which has no tools; chat
/// reads it). Anything not in
/// a field table, this list or [`check_unsupported`] is refused as unknown,
/// so a client never gets a 200 that silently dropped what it asked for.
const IGNORED_FIELDS: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
];

/// Parameters OpenAI defines that this server does not implement. Each
/// value that would change the output is refused with a 400 naming it; the
/// values that ask for the default behaviour pass (null, an empty list,
/// zero penalties, `{"type": "text"}`...). Returns whether `key` is one.
fn check_unsupported(
    key: &str,
    v: &Value,
    obj: &Map<String, Value>,
    ep: Endpoint,
) -> Result<bool, ApiError> {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    let refuse = |detail: &str| Err(ApiError::unsupported(key, detail));
    match key {
        // On chat, `tools` and `tool_choice` are fields of the request;
        // here they reach only /v1/completions.
        "tools" if !empty(v) => refuse(": tools are served on /v1/chat/completions"),
        "tool_choice" if !(v.is_null() || v == "none") => {
            refuse(": tools are served on /v1/chat/completions")
        }
        "functions" | "function_call" if !(empty(v) || v == "none") => {
            refuse(": the legacy functions API is not implemented; use `tools`")
        }
        "best_of" if ep == Endpoint::Completions => {
            let n = obj.get("n").and_then(Value::as_u64).unwrap_or(1);
            match v {
                Value::Null => Ok(true),
                b if b.as_u64() == Some(n) => Ok(true),
                _ => refuse(&format!(": only best_of = n ({n}) is accepted")),
            }
        }
        "tools" | "functions" | "tool_choice" | "function_call" => Ok(true),
        _ => Ok(false),
    }
}

/// Checks every top-level field of a request body: known fields have the
/// right type (a type error names the field in `param`), unsupported
/// parameters are refused unless they ask for the default, unknown fields
/// are refused.
fn check_fields(obj: &Map<String, Value>, ep: Endpoint) -> Result<(), ApiError> {
    let own = match ep {
        Endpoint::Chat => CHAT_FIELDS,
        Endpoint::Completions => COMPLETION_FIELDS,
    };
    for (key, v) in obj {
        let known = COMMON_FIELDS
            .iter()
            .chain(own)
            .find(|(name, _)| name == key);
        if let Some((name, check)) = known {
            check(v).map_err(|e| {
                ApiError::bad_request(format!("invalid type for `{name}`: {e}"), Some(name))
            })?;
            continue;
        }
        if IGNORED_FIELDS.contains(&key.as_str()) || check_unsupported(key, v, obj, ep)? {
            continue;
        }
        return Err(ApiError::bad_request(
            format!("Unrecognized request argument supplied: {key}"),
            Some(key),
        ));
    }
    Ok(())
}

/// Parses a JSON body for `ep`; malformed JSON, wrong types, unknown or
/// unsupported fields give a 400 that says which.
pub fn parse_request<T: DeserializeOwned>(body: &[u8], ep: Endpoint) -> Result<T, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}"), None))?;
    let Value::Object(obj) = &v else {
        return Err(ApiError::bad_request(
            "invalid request body: expected a JSON object",
            None,
        ));
    };
    check_fields(obj, ep)?;
    serde_json::from_value(v).map_err(|e| {
        // Types were checked field by field: what is left is a missing
        // required field, named in serde's message.
        let msg = e.to_string();
        let param = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("missing field"))
            .map(str::to_string);
        ApiError::bad_request(format!("invalid request body: {msg}"), param.as_deref())
    })
}

/// Generous bound on the UTF-8 bytes one token can cover, used to refuse a
/// prompt before tokenizing it: at least 64, and at least 3 times the
/// vocabulary's longest piece (normalization such as NFKC can shrink text
/// by up to about 3x, e.g. a full-width letter of 3 bytes becomes 1).
/// A prompt longer than `context_length * bound` bytes needs more tokens
/// than the context holds, so refusing it at once changes no answer.
pub fn bytes_per_token_bound(tok: &Tokenizer) -> usize {
    let longest = (0..tok.vocab_size() as u32)
        .filter_map(|id| tok.piece_bytes(id, false).ok())
        .map(|b| b.len())
        .max()
        .unwrap_or(0);
    longest.saturating_mul(3).max(64)
}

/// Refuses a prompt of `bytes` UTF-8 bytes that cannot fit the context
/// whatever the tokenization (see [`bytes_per_token_bound`]), before any
/// tokenizer work.
pub fn precheck_bytes(
    bytes: usize,
    bytes_per_token: usize,
    limits: &EngineLimits,
    ep: Endpoint,
) -> Result<(), ApiError> {
    let ctx = limits.context_length;
    if bytes > ctx.saturating_mul(bytes_per_token) {
        return Err(ApiError::context_length(
            format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt is {bytes} bytes of text, more than {ctx} tokens can hold (at most {bytes_per_token} bytes per token). Please reduce the length of the prompt."
            ),
            ep.prompt_param(),
        ));
    }
    Ok(())
}

/// What [`prepare`] checks a request against.
pub struct Admission<'a> {
    pub tok: &'a Tokenizer,
    pub limits: &'a EngineLimits,
    /// Most sequences the engine queues (`--max-queue`).
    pub max_queue: usize,
    pub endpoint: Endpoint,
}

/// A validated request, ready for the engine.
pub struct Prepared {
    pub gen: GenRequest,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub prompt_tokens: usize,
}

/// OpenAI's rule for function names: `^[a-zA-Z0-9_-]{1,64}$`.
fn valid_tool_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An assistant turn's `tool_calls`, checked, with each `arguments` JSON
/// string parsed into its object where it parses (HF templates read the
/// object: `tool_call.arguments | tojson`). None for null or an empty list.
fn turn_tool_calls(i: usize, v: &Value) -> Result<Option<Value>, ApiError> {
    let bad = |m: String| {
        Err(ApiError::bad_request(
            format!("messages[{i}].tool_calls{m}"),
            Some("messages"),
        ))
    };
    let calls = match v {
        Value::Null => return Ok(None),
        Value::Array(a) if a.is_empty() => return Ok(None),
        Value::Array(a) => a,
        _ => return bad(": expected a list".into()),
    };
    let mut out = Vec::with_capacity(calls.len());
    for (k, c) in calls.iter().enumerate() {
        let mut c = c.clone();
        if c["function"]["name"].as_str().is_none_or(str::is_empty) {
            return bad(format!("[{k}].function.name: expected a non-empty string"));
        }
        if let Some(args) = c["function"]["arguments"].as_str() {
            if let Ok(obj @ Value::Object(_)) = serde_json::from_str::<Value>(args) {
                c["function"]["arguments"] = obj;
            }
        }
        out.push(c);
    }
    Ok(Some(Value::Array(out)))
}

impl ChatRequest {
    /// The tools to render and parse calls for: Some(list) when the request
    /// has tools and `tool_choice` lets the model call them ("auto", the
    /// default, "required" or a named function); None without tools or
    /// with "none". The calls "required" and a named function oblige are
    /// enforced by a grammar ([`ChatRequest::forced_tools`]).
    pub fn tools(&self) -> Result<Option<Value>, ApiError> {
        let tools = self.tools.as_deref().unwrap_or(&[]);
        if tools.len() > MAX_TOOLS {
            return Err(ApiError::bad_request(
                format!("at most {MAX_TOOLS} tools, got {}", tools.len()),
                Some("tools"),
            ));
        }
        for (i, t) in tools.iter().enumerate() {
            let bad = |m: &str| ApiError::bad_request(format!("tools[{i}]{m}"), Some("tools"));
            if t["type"] != "function" {
                return Err(bad(".type: expected \"function\""));
            }
            let f = &t["function"];
            if !f.is_object() {
                return Err(bad(".function: expected an object"));
            }
            if !f["name"].as_str().is_some_and(valid_tool_name) {
                return Err(bad(
                    ".function.name: expected 1 to 64 letters, digits, '_' or '-'",
                ));
            }
            if !(f["description"].is_null() || f["description"].is_string()) {
                return Err(bad(".function.description: expected a string"));
            }
            if !(f["parameters"].is_null() || f["parameters"].is_object()) {
                return Err(bad(".function.parameters: expected a JSON Schema object"));
            }
        }
        let call = match &self.tool_choice {
            None | Some(Value::Null) => true,
            Some(Value::String(c)) if c == "none" => false,
            Some(Value::String(c)) if c == "auto" => {
                if tools.is_empty() {
                    return Err(ApiError::bad_request(
                        "tool_choice \"auto\" needs `tools`",
                        Some("tool_choice"),
                    ));
                }
                true
            }
            Some(Value::String(c)) if c == "required" => {
                if tools.is_empty() {
                    return Err(ApiError::bad_request(
                        "tool_choice \"required\" needs `tools`",
                        Some("tool_choice"),
                    ));
                }
                true
            }
            Some(Value::Object(o)) if o.get("type").is_some_and(|t| t == "function") => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str);
                let Some(name) = name else {
                    return Err(ApiError::bad_request(
                        "tool_choice.function.name: expected a string",
                        Some("tool_choice"),
                    ));
                };
                if !tools.iter().any(|t| t["function"]["name"] == name) {
                    return Err(ApiError::bad_request(
                        format!("tool_choice names function `{name}`, which is not in `tools`"),
                        Some("tool_choice"),
                    ));
                }
                true
            }
            Some(v) => {
                return Err(ApiError::bad_request(
                    format!(
                        "invalid tool_choice {v}: expected \"none\", \"auto\", \"required\" \
                         or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                    Some("tool_choice"),
                ))
            }
        };
        Ok((call && !tools.is_empty()).then(|| Value::Array(tools.to_vec())))
    }

    /// The calls `tool_choice` obliges ("required", a named function);
    /// None for "auto" and "none". Call after [`ChatRequest::tools`], which
    /// validates the choice.
    pub fn forced_tools(&self) -> Option<ForcedTools> {
        match &self.tool_choice {
            Some(Value::String(c)) if c == "required" => Some(ForcedTools::Required),
            Some(Value::Object(o)) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|n| ForcedTools::Named(n.to_string())),
            _ => None,
        }
    }

    pub fn messages(&self) -> Result<Vec<ChatTurn>, ApiError> {
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
            let tool_calls = match &m.tool_calls {
                Some(v) if role == "assistant" => turn_tool_calls(i, v)?,
                Some(v) if !v.is_null() => {
                    return Err(ApiError::bad_request(
                        format!("messages[{i}].tool_calls: only assistant turns carry calls"),
                        Some("messages"),
                    ))
                }
                _ => None,
            };
            if role == "tool" && m.tool_call_id.is_none() {
                return Err(ApiError::bad_request(
                    format!("messages[{i}].tool_call_id: required in a `tool` turn"),
                    Some("messages"),
                ));
            }
            out.push(ChatTurn {
                role,
                content,
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
            });
        }
        Ok(out)
    }
}

/// Builds the engine request: sampling parameters, limits against the
/// context and the KV pool, stop strings. `max_tokens` None means "as
/// many as fit": `default_max` (capped to what fits) or else everything the
/// context and the KV pool leave after the prompt.
pub fn prepare(
    c: &Common,
    prompt: Vec<u32>,
    max_tokens: Option<u64>,
    default_max: Option<u64>,
    top_logprobs: Option<usize>,
    adm: &Admission<'_>,
) -> Result<Prepared, ApiError> {
    let limits = adm.limits;
    let param = adm.endpoint.prompt_param();
    let ctx = limits.context_length;
    let kv = limits.kv_tokens;
    let p = prompt.len();
    if p == 0 {
        return Err(ApiError::bad_request("the prompt is empty", Some(param)));
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
        ), param));
    }
    // The whole KV pool is the most one sequence can ever hold: a request
    // beyond it would be admitted, then cut with "length" (or starve).
    if p >= kv {
        return Err(ApiError::context_length(format!(
            "The prompt has {p} tokens but the server's KV cache holds {kv} tokens (--kv-tokens), leaving no room for a completion. Please reduce the length of the prompt."
        ), param));
    }
    let room = ctx.min(kv) - p;
    let max_tokens = match max_tokens {
        Some(m) => {
            let m = usize::try_from(m).unwrap_or(usize::MAX);
            let total = p.saturating_add(m);
            if total > ctx {
                return Err(ApiError::context_length(format!(
                    "This model's maximum context length is {ctx} tokens. However, you requested {total} tokens ({p} in the prompt, {m} in the completion). Please reduce the length of the prompt or completion."
                ), param));
            }
            if total > kv {
                return Err(ApiError::context_length(format!(
                    "The server's KV cache holds {kv} tokens (--kv-tokens). However, you requested {total} tokens ({p} in the prompt, {m} in the completion). Please reduce the length of the prompt or completion."
                ), param));
            }
            m
        }
        None => match default_max {
            Some(d) => usize::try_from(d).unwrap_or(usize::MAX).min(room),
            None => room,
        },
    };
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
    // Each choice queues as one sequence: n beyond the queue can never be
    // admitted, so a retryable 429 would be a lie.
    if n as usize > adm.max_queue {
        return Err(ApiError::bad_request(
            format!(
                "n = {n} can never be served: the server queues at most {} sequences (--max-queue), one per choice",
                adm.max_queue
            ),
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
    let adjust = logit_adjust(c, adm.tok.vocab_size())?;
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
            stop_ids: adm.tok.stop_ids().to_vec(),
            top_logprobs,
            adjust,
            n: n as usize,
            grammar: None,
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

/// OpenAI's `logit_bias` (token ids as strings, below `vocab`; biases in
/// [-100, 100]) and penalties ([-2, 2]), each error naming its parameter.
fn logit_adjust(c: &Common, vocab: usize) -> Result<LogitAdjust, ApiError> {
    let mut bias = Vec::new();
    for (k, &b) in c.logit_bias.iter().flatten() {
        let id: u32 = k.trim().parse().map_err(|_| {
            ApiError::bad_request(
                format!("logit_bias keys must be token ids, got {k:?}"),
                Some("logit_bias"),
            )
        })?;
        if id as usize >= vocab {
            return Err(ApiError::bad_request(
                format!("logit_bias: token {id} is outside the vocabulary of {vocab} tokens"),
                Some("logit_bias"),
            ));
        }
        if !(-100.0..=100.0).contains(&b) {
            return Err(ApiError::bad_request(
                format!("logit_bias of token {id} must be in [-100, 100], got {b}"),
                Some("logit_bias"),
            ));
        }
        bias.push((id, b));
    }
    // "007" and "7" are one token: a repeat is an error, not a silent pick.
    bias.sort_by_key(|&(t, _)| t);
    if let Some(w) = bias.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::bad_request(
            format!("logit_bias names token {} twice", w[0].0),
            Some("logit_bias"),
        ));
    }
    let pen = |v: Option<f32>, name: &str| -> Result<f32, ApiError> {
        let v = v.unwrap_or(0.0);
        if !(-2.0..=2.0).contains(&v) {
            return Err(ApiError::bad_request(
                format!("{name} must be in [-2, 2], got {v}"),
                Some(name),
            ));
        }
        Ok(v)
    };
    Ok(LogitAdjust {
        bias,
        frequency_penalty: pen(c.frequency_penalty, "frequency_penalty")?,
        presence_penalty: pen(c.presence_penalty, "presence_penalty")?,
    })
}

/// A completion prompt before tokenization.
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
}

impl PromptInput {
    /// UTF-8 bytes of a text prompt (0 for token ids: their count is
    /// checked exactly).
    pub fn text_bytes(&self) -> usize {
        match self {
            PromptInput::Text(t) => t.len(),
            PromptInput::Tokens(_) => 0,
        }
    }
}

/// The prompts of a completion request (tokenized by the caller, off the
/// async runtime), at most [`MAX_PROMPTS`]. `echo` is served without
/// logprobs (the prompt's own log-probabilities are not computed).
pub fn completion_prompts(r: &CompletionRequest) -> Result<Vec<PromptInput>, ApiError> {
    if r.echo == Some(true) && r.logprobs.is_some() {
        return Err(ApiError::bad_request(
            "echo with logprobs is not supported (the prompt's log-probabilities are not computed)",
            Some("echo"),
        ));
    }
    if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request(
            "suffix is not supported",
            Some("suffix"),
        ));
    }
    let prompts: Vec<PromptInput> = match &r.prompt {
        PromptSpec::Text(t) => vec![PromptInput::Text(t.clone())],
        PromptSpec::Texts(v) => v.iter().cloned().map(PromptInput::Text).collect(),
        PromptSpec::Tokens(ids) => vec![PromptInput::Tokens(ids.clone())],
        PromptSpec::TokenLists(v) => v.iter().cloned().map(PromptInput::Tokens).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request(
            "the prompt list is empty",
            Some("prompt"),
        ));
    }
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::bad_request(
            format!(
                "at most {MAX_PROMPTS} prompts per request, got {}",
                prompts.len()
            ),
            Some("prompt"),
        ));
    }
    Ok(prompts)
}

/// Token ids of a completion prompt (blocking: run on the blocking pool).
pub fn tokenize_completion(tok: &Tokenizer, input: PromptInput) -> Result<Vec<u32>, ApiError> {
    match input {
        PromptInput::Tokens(ids) => Ok(ids),
        PromptInput::Text(text) => tok.encode(&text, true, false).map_err(|e| {
            ApiError::bad_request(format!("cannot tokenize the prompt: {e:#}"), Some("prompt"))
        }),
    }
}
