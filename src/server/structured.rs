//! Structured outputs on the API: `response_format` (`json_object`,
//! `json_schema`, and the `grammar` extension) and forced tool calls
//! (`tool_choice` "required" or a named function), each turned into a
//! grammar the engine enforces token by token (see [`crate::constrain`]).

use serde_json::{json, Value};
use std::sync::Arc;

use super::api::{ChatRequest, ForcedTools};
use super::error::ApiError;
use super::tools::ToolFormat;
use super::AppState;
use crate::constrain::{Grammar, GrammarSpec, Grammars};
use crate::tokenizer::{TokenType, Tokenizer};

/// Longest grammar or regex source accepted (the body limit bounds it
/// too; llguidance's own limits bound its compiled size).
const MAX_GRAMMAR_BYTES: usize = 256 * 1024;

/// The grammar a `response_format` asks for: None for absent, null or
/// `{"type": "text"}`. Errors name `response_format`.
pub fn response_grammar(rf: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(m, Some("response_format")));
    let rf = match rf {
        None | Some(Value::Null) => return Ok(None),
        Some(v @ Value::Object(_)) => v,
        Some(_) => return bad("response_format: expected an object".into()),
    };
    match rf["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonObject)),
        Some("json_schema") => {
            let js = &rf["json_schema"];
            if !js.is_object() {
                return bad("response_format.json_schema: expected an object with `schema`".into());
            }
            if let Some(name) = js.get("name") {
                let ok = name
                    .as_str()
                    .is_some_and(|n| (1..=64).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
                if !ok {
                    return bad("response_format.json_schema.name: expected 1 to 64 letters, digits, '_' or '-'".into());
                }
            }
            if !(js["strict"].is_null() || js["strict"].is_boolean()) {
                return bad("response_format.json_schema.strict: expected a boolean".into());
            }
            match &js["schema"] {
                // No schema: any JSON object, as with `json_object`.
                Value::Null => Ok(Some(GrammarSpec::JsonObject)),
                s @ Value::Object(_) => Ok(Some(GrammarSpec::JsonSchema(s.clone()))),
                _ => bad("response_format.json_schema.schema: expected a JSON Schema object".into()),
            }
        }
        // Extension, in the shape of OpenAI's grammar-constrained custom
        // tools: {"type": "grammar", "grammar": {"syntax": "lark" | "regex",
        // "definition": "..."}}.
        Some("grammar") => {
            let g = &rf["grammar"];
            let Some(def) = g["definition"].as_str() else {
                return bad("response_format.grammar.definition: expected a string".into());
            };
            if def.len() > MAX_GRAMMAR_BYTES {
                return bad(format!(
                    "response_format.grammar.definition: at most {MAX_GRAMMAR_BYTES} bytes, got {}",
                    def.len()
                ));
            }
            match g["syntax"].as_str() {
                Some("lark") => Ok(Some(GrammarSpec::Lark(def.to_string()))),
                Some("regex") => Ok(Some(GrammarSpec::Regex(def.to_string()))),
                _ => bad("response_format.grammar.syntax: expected \"lark\" or \"regex\"".into()),
            }
        }
        _ => bad(format!(
            "response_format.type: expected \"text\", \"json_object\", \"json_schema\" or \"grammar\", got {}",
            rf["type"]
        )),
    }
}

/// `schema` with `additionalProperties: false` on every object schema that
/// lists `properties` and does not say: a tool's arguments are the
/// parameters it declares (a model otherwise pads calls with keys it saw
/// in the schema, such as "maxLength").
fn close_objects(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    if o.contains_key("properties") && !o.contains_key("additionalProperties") {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, v) in o.iter_mut() {
        match k.as_str() {
            "properties" | "$defs" | "definitions" | "patternProperties" => {
                if let Value::Object(m) = v {
                    m.values_mut().for_each(close_objects);
                }
            }
            "items" | "additionalProperties" | "not" => close_objects(v),
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Value::Array(a) = v {
                    a.iter_mut().for_each(close_objects);
                }
            }
            _ => {}
        }
    }
}

/// `{"type": "object", "properties": {"name": {"const": NAME}, ARGS:
/// PARAMS}, ...}` with `name` first: the model writes the name before the
/// arguments (serde_json keeps insertion order here).
fn call_schema(name: &str, args_key: &str, params: &Value) -> Value {
    // No `parameters`: a function without parameters (OpenAI's meaning),
    // so its arguments are `{}`.
    let mut params = if params.is_object() {
        params.clone()
    } else {
        json!({"type": "object", "properties": {}})
    };
    close_objects(&mut params);
    let mut props = serde_json::Map::new();
    props.insert("name".into(), json!({ "const": name }));
    props.insert(args_key.into(), params);
    json!({
        "type": "object",
        "properties": Value::Object(props),
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// A Lark string literal of `s`.
fn lark_str(s: &str) -> String {
    // JSON string escaping is valid Lark string escaping for these texts.
    Value::String(s.to_string()).to_string()
}

/// The grammar of a forced call in `format`: the output is the call(s) and
/// nothing else, each call's arguments valid against its tool's
/// `parameters` (checked tools, chat shape). `parallel`: several calls
/// are allowed ("required" only; a named function is called once).
pub fn tool_grammar(
    format: ToolFormat,
    tools: &[Value],
    forced: &ForcedTools,
    parallel: bool,
    tok: &Tokenizer,
) -> GrammarSpec {
    let args_key = match format {
        ToolFormat::Llama3 => "parameters",
        ToolFormat::Hermes | ToolFormat::Mistral => "arguments",
    };
    let choices: Vec<Value> = tools
        .iter()
        .filter_map(|t| {
            let f = &t["function"];
            let name = f["name"].as_str()?;
            match forced {
                ForcedTools::Named(n) if n != name => None,
                _ => Some(call_schema(name, args_key, &f["parameters"])),
            }
        })
        .collect();
    let mut body = if choices.len() == 1 {
        choices[0].clone()
    } else {
        json!({ "anyOf": choices })
    };
    body["x-guidance"] = crate::constrain::json_options();
    let many = parallel && *forced == ForcedTools::Required;
    let obj = format!("%json {body}");
    let lark = match format {
        ToolFormat::Hermes => {
            let call = format!(
                "call: {} {obj} {}",
                lark_str("<tool_call>\n"),
                lark_str("\n</tool_call>")
            );
            let start = if many {
                format!("start: call ({} call)*", lark_str("\n"))
            } else {
                "start: call".to_string()
            };
            format!("{start}\n{call}\n")
        }
        // One JSON object; Llama 3.x writes one call per turn.
        ToolFormat::Llama3 => format!("start: {obj}\n"),
        ToolFormat::Mistral => {
            // `[TOOL_CALLS]` is a control token in Mistral's tokenizers
            // (named by id: grammar text never produces a control token);
            // plain text in older ones.
            let marker = match tok.token_id("[TOOL_CALLS]") {
                Some(id) if tok.token_type(id) == Some(TokenType::Control) => format!("<[{id}]>"),
                _ => lark_str("[TOOL_CALLS]"),
            };
            let list = if many {
                "\"[\" call (\", \" call)* \"]\"".to_string()
            } else {
                "\"[\" call \"]\"".to_string()
            };
            format!("start: {marker} {list}\ncall: {obj}\n")
        }
    };
    GrammarSpec::Lark(lark)
}

/// The server's grammar compiler, built on first use (a trie over the
/// vocabulary: milliseconds to a second for large vocabularies).
/// Blocking.
pub fn grammars(state: &AppState) -> Result<Arc<Grammars>, ApiError> {
    state
        .grammars
        .get_or_init(|| {
            Grammars::new(&state.tok)
                .map(Arc::new)
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(|e| ApiError::internal(format!("structured output is unavailable: {e}")))
}

/// Compiles `spec` off the async runtime; an invalid grammar is a 400
/// naming `param`.
pub async fn compile(
    state: &Arc<AppState>,
    spec: GrammarSpec,
    param: &'static str,
) -> Result<Grammar, ApiError> {
    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        let g = grammars(&st)?;
        g.compile(&spec).map_err(|e| {
            ApiError::bad_request(format!("{param}: invalid grammar: {e:#}"), Some(param))
        })
    })
    .await
    .map_err(|e| ApiError::internal(format!("grammar task: {e}")))?
}

/// The grammar a chat request's output follows: the calls its
/// `tool_choice` obliges (`tools`: its checked tools, `format`: the
/// template's call format) or its `response_format`, not both (the output
/// cannot be a call and a document at once). None: free text. Errors name
/// the field at fault.
pub async fn chat_grammar(
    state: &Arc<AppState>,
    req: &ChatRequest,
    tools: Option<&Value>,
    format: Option<ToolFormat>,
) -> Result<Option<Grammar>, ApiError> {
    let forced = req.forced_tools();
    let spec = response_grammar(req.common.response_format.as_ref())?;
    match (forced, tools, format, spec) {
        (Some(_), _, _, Some(_)) => Err(ApiError::bad_request(
            "response_format cannot be combined with a tool_choice that obliges a call",
            Some("response_format"),
        )),
        (Some(f), Some(Value::Array(all)), Some(format), None) => {
            let parallel = req.parallel_tool_calls.unwrap_or(true);
            let spec = tool_grammar(format, all, &f, parallel, &state.tok);
            Ok(Some(compile(state, spec, "tools").await?))
        }
        (None, _, _, Some(spec)) => Ok(Some(compile(state, spec, "response_format").await?)),
        _ => Ok(None),
    }
}
