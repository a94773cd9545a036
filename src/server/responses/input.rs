//! The Responses request side in chat-completions terms: input items become
//! chat messages (the JSON [`super::super::api::ChatRequest`] reads), flat
//! function tools become chat tools, `tool_choice` and `text.format` are
//! mapped or refused. Every refusal is a 400 whose `param` names the
//! Responses field (`input`, `tools`, `tool_choice`, `text.format`).

use super::super::error::ApiError;
use serde_json::{json, Map, Value};

/// Most input items per request (bounds the work of the conversion; the
/// body limit bounds it too).
pub const MAX_INPUT_ITEMS: usize = 10_000;

fn bad(i: usize, m: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("input[{i}]{m}"), Some("input"))
}

/// Refuses keys of `obj` outside `allowed` (a client passing back output
/// items sends `id` and `status`, which are allowed where they appear).
fn only_keys(i: usize, obj: &Map<String, Value>, allowed: &[&str]) -> Result<(), ApiError> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(bad(i, format!(".{k}: unknown field"))),
        None => Ok(()),
    }
}

/// A non-empty string field of item `i`.
fn string_field<'a>(i: usize, obj: &'a Map<String, Value>, key: &str) -> Result<&'a str, ApiError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        _ => Err(bad(i, format!(".{key}: expected a non-empty string"))),
    }
}

/// A content (a string, or text parts) as one string. Parts are
/// `input_text` or `output_text` (a client may pass back output messages
/// whole, annotations and log-probs included); anything else is refused.
fn text_of(i: usize, what: &str, v: &Value) -> Result<String, ApiError> {
    let parts = match v {
        Value::String(s) => return Ok(s.clone()),
        Value::Array(p) => p,
        _ => {
            return Err(bad(
                i,
                format!(".{what}: expected a string or a list of parts"),
            ))
        }
    };
    let mut s = String::new();
    for (k, p) in parts.iter().enumerate() {
        let Some(o) = p.as_object() else {
            return Err(bad(i, format!(".{what}[{k}]: expected an object")));
        };
        let kind = o.get("type").and_then(Value::as_str).unwrap_or("");
        if !matches!(kind, "input_text" | "output_text") {
            return Err(bad(
                i,
                format!(".{what}[{k}].type: `{kind}` is not supported (only input_text and output_text)"),
            ));
        }
        if let Some(key) = o
            .keys()
            .find(|k| !matches!(k.as_str(), "type" | "text" | "annotations" | "logprobs"))
        {
            return Err(bad(i, format!(".{what}[{k}].{key}: unknown field")));
        }
        match o.get("text") {
            Some(Value::String(t)) => s.push_str(t),
            _ => return Err(bad(i, format!(".{what}[{k}].text: expected a string"))),
        }
    }
    Ok(s)
}

/// `input` as chat messages: a string is one user turn; a list holds
/// messages, `function_call` items (joined to the assistant turn before
/// them, or a new one, as that turn's `tool_calls`) and
/// `function_call_output` items (`tool` turns).
pub fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::bad_request(
                "input: expected a string or a list of input items",
                Some("input"),
            ))
        }
    };
    if items.len() > MAX_INPUT_ITEMS {
        return Err(ApiError::bad_request(
            format!("at most {MAX_INPUT_ITEMS} input items, got {}", items.len()),
            Some("input"),
        ));
    }
    let mut out: Vec<Value> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(obj) = item.as_object() else {
            return Err(bad(i, ": expected an object"));
        };
        let kind = match obj.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(_) => return Err(bad(i, ".type: expected a string")),
        };
        match kind {
            "message" => {
                only_keys(i, obj, &["type", "role", "content", "id", "status", "phase"])?;
                let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(bad(
                        i,
                        format!(".role: `{role}` is not one of user, assistant, system, developer"),
                    ));
                }
                let content = text_of(i, "content", obj.get("content").unwrap_or(&Value::Null))?;
                out.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                only_keys(
                    i,
                    obj,
                    &["type", "call_id", "name", "arguments", "id", "status"],
                )?;
                let call = json!({
                    "id": string_field(i, obj, "call_id")?,
                    "type": "function",
                    "function": {
                        "name": string_field(i, obj, "name")?,
                        "arguments": match obj.get("arguments") {
                            Some(Value::String(a)) => a.as_str(),
                            _ => return Err(bad(i, ".arguments: expected a JSON string")),
                        },
                    },
                });
                // Calls right after an assistant turn are that turn's: the
                // chat shape of "said this, then called that".
                match out.last_mut() {
                    Some(m) if m["role"] == "assistant" => match m["tool_calls"].as_array_mut() {
                        Some(calls) => calls.push(call),
                        None => m["tool_calls"] = json!([call]),
                    },
                    _ => out.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                only_keys(i, obj, &["type", "call_id", "output", "id", "status"])?;
                let id = string_field(i, obj, "call_id")?;
                let output = text_of(i, "output", obj.get("output").unwrap_or(&Value::Null))?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            other => {
                return Err(ApiError {
                    code: Some("unsupported_parameter"),
                    ..bad(
                        i,
                        format!(".type: `{other}` items are not supported (only message, function_call and function_call_output)"),
                    )
                })
            }
        }
    }
    Ok(out)
}

/// Responses' flat function tools (`{type, name, description, parameters,
/// strict}`) in the chat shape (`{type, function: {name, description,
/// parameters}}`); names and schemas are then checked by the chat path.
/// Built-in tools (web_search, file_search...) are refused. `strict` is
/// accepted and not enforced (arguments are what the model wrote).
pub fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let bad = |m: String| ApiError::bad_request(format!("tools[{i}]{m}"), Some("tools"));
        let Some(o) = t.as_object() else {
            return Err(bad(": expected an object".into()));
        };
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    "tools",
                    &format!(
                    ": tools[{i}] is the built-in tool `{other}`; only function tools are served"
                ),
                ))
            }
            None => return Err(bad(".type: expected \"function\"".into())),
        }
        if let Some(k) = o.keys().find(|k| {
            !matches!(
                k.as_str(),
                "type" | "name" | "description" | "parameters" | "strict"
            )
        }) {
            return Err(bad(format!(".{k}: unknown field")));
        }
        if !(o
            .get("strict")
            .is_none_or(|s| s.is_null() || s.is_boolean()))
        {
            return Err(bad(".strict: expected a boolean".into()));
        }
        let mut f = Map::new();
        for key in ["name", "description", "parameters"] {
            if let Some(v) = o.get(key).filter(|v| !v.is_null()) {
                f.insert(key.to_string(), v.clone());
            }
        }
        if !f.contains_key("name") {
            return Err(bad(".name: required".into()));
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(out)
}

/// `tool_choice` in the chat shape. Strings pass as they are (the chat
/// path checks them, naming `tool_choice`); `{type: "function", name}`
/// becomes chat's `{type: "function", function: {name}}`. "required" and a
/// named function oblige a call, which the chat path's grammar enforces.
/// Other objects (built-in tools, `allowed_tools`) are refused.
pub fn chat_tool_choice(v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::Null | Value::String(_) => Ok(v.clone()),
        Value::Object(o) if o.get("type").is_some_and(|t| t == "function") => {
            match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(ApiError::bad_request(
                    "tool_choice.name: expected a string",
                    Some("tool_choice"),
                )),
            }
        }
        _ => Err(ApiError::unsupported(
            "tool_choice",
            &format!(": {v} (only \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": ...}})"),
        )),
    }
}

/// `text` checked: `{format: {type: "text"}}` (or nothing) is plain text;
/// `verbosity` may only ask for the default (null).
pub fn check_text(text: &Value) -> Result<(), ApiError> {
    let Some(o) = text.as_object() else {
        return match text {
            Value::Null => Ok(()),
            _ => Err(ApiError::bad_request(
                "text: expected an object",
                Some("text"),
            )),
        };
    };
    for (k, v) in o {
        match k.as_str() {
            "format" => {}
            "verbosity" if v.is_null() => {}
            "verbosity" => return Err(ApiError::unsupported("text.verbosity", "")),
            _ => {
                return Err(ApiError::bad_request(
                    format!("Unrecognized argument supplied: text.{k}"),
                    Some(&format!("text.{k}")),
                ))
            }
        }
    }
    Ok(())
}

/// `text.format` as the chat path's `response_format`: None for plain
/// text; `{type: "json_schema", name, schema, strict}` becomes
/// `{type: "json_schema", json_schema: {name, schema, strict}}`;
/// `json_object` and the `grammar` extension pass as they are (the chat
/// path checks them; its errors are renamed to `text.format`).
pub fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let format = &text["format"];
    match format["type"].as_str() {
        _ if format.is_null() => Ok(None),
        Some("text") => Ok(None),
        Some("json_schema") => {
            let mut js = serde_json::Map::new();
            for k in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(k) {
                    js.insert(k.to_string(), v.clone());
                }
            }
            Ok(Some(
                json!({"type": "json_schema", "json_schema": Value::Object(js)}),
            ))
        }
        Some("json_object") | Some("grammar") => Ok(Some(format.clone())),
        _ => Err(ApiError::bad_request(
            format!("text.format: unknown format {format}"),
            Some("text.format"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items map to the chat turns the chat path would get for the same
    /// conversation: calls join the assistant turn before them.
    #[test]
    fn items_to_chat_messages() {
        let m = input_messages(&json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Weather in "},
                {"type": "input_text", "text": "Paris?"}]},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "w",
             "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "w", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"type": "function_call", "call_id": "call_3", "name": "w", "arguments": "{}"},
        ]))
        .unwrap();
        assert_eq!(m.len(), 5, "{m:?}");
        assert_eq!(m[0], json!({"role": "developer", "content": "Be brief."}));
        assert_eq!(m[1]["content"], "Weather in Paris?");
        assert_eq!(m[2]["content"], "Checking.");
        let calls = m[2]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["id"], "call_1");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "18 C"})
        );
        assert!(m[4]["content"].is_null());
        assert_eq!(m[4]["tool_calls"][0]["id"], "call_3");
        assert_eq!(
            input_messages(&json!("hi")).unwrap(),
            vec![json!({"role": "user", "content": "hi"})]
        );
    }

    #[test]
    fn bad_items_name_input() {
        for bad in [
            json!(7),
            json!([1]),
            json!([{"role": "tool", "content": "x"}]),
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            json!([{"role": "user", "content": "x", "extra": 1}]),
            json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
            json!([{"type": "function_call_output", "call_id": "c"}]),
            json!([{"type": "reasoning", "summary": []}]),
        ] {
            let e = input_messages(&bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("input"), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn tools_and_choice_and_format() {
        let t = chat_tools(
            &[json!({"type": "function", "name": "f", "description": "d",
            "parameters": {"type": "object"}, "strict": true})],
        )
        .unwrap();
        assert_eq!(
            t[0],
            json!({"type": "function", "function": {"name": "f", "description": "d",
                "parameters": {"type": "object"}}})
        );
        for bad in [
            json!({"type": "web_search"}),
            json!({"type": "function"}),
            json!({"type": "function", "name": "f", "function": {}}),
            json!("f"),
        ] {
            let e = chat_tools(std::slice::from_ref(&bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("tools"), "{bad}");
        }
        assert_eq!(chat_tool_choice(&json!("auto")).unwrap(), json!("auto"));
        assert_eq!(chat_tool_choice(&json!("none")).unwrap(), json!("none"));
        assert_eq!(
            chat_tool_choice(&json!("required")).unwrap(),
            json!("required")
        );
        assert_eq!(
            chat_tool_choice(&json!({"type": "function", "name": "f"})).unwrap(),
            json!({"type": "function", "function": {"name": "f"}})
        );
        for c in [
            json!({"type": "web_search_preview"}),
            json!({"type": "function"}),
        ] {
            let e = chat_tool_choice(&c).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("tool_choice"), "{c}");
        }
        assert_eq!(
            response_format(&json!({"format": {"type": "text"}})).unwrap(),
            None
        );
        assert_eq!(response_format(&Value::Null).unwrap(), None);
        let e = response_format(&json!({"format": {"type": "yaml"}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("text.format"));
        assert_eq!(
            response_format(&json!({"format": {"type": "json_schema", "name": "n",
                "schema": {"type": "object"}, "strict": true}}))
            .unwrap(),
            Some(json!({"type": "json_schema", "json_schema": {"name": "n",
                "schema": {"type": "object"}, "strict": true}}))
        );
        assert_eq!(
            response_format(&json!({"format": {"type": "json_object"}})).unwrap(),
            Some(json!({"type": "json_object"}))
        );
        assert_eq!(
            check_text(&json!({"foo": 1})).unwrap_err().param.as_deref(),
            Some("text.foo")
        );
    }
}
