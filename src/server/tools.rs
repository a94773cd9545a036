//! OpenAI tool calls: finding them in generated text, and the prompt side
//! for chat templates that know nothing of tools.
//!
//! Models write calls in their template's format:
//! - Hermes / Qwen: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`,
//!   one block per call;
//! - Llama 3.x: `{"name": .., "parameters": {..}}` at the start of the output
//!   (the `<|python_tag|>` before it is a control token the detokenizer
//!   drops, but is recognised when present), several separated by `;`;
//! - Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]` (the
//!   marker is a control token too: a bare array at the start counts).
//!
//! [`ToolStream`] is fed text deltas and splits them into content and
//! calls; the non-streamed [`parse`] is the same machine fed once, so both
//! paths give the same calls. Invariant: text that may still become part of
//! a call (a marker's prefix, an unfinished call) is held back, never
//! emitted as content; a call that does not parse is given back as text,
//! verbatim, in order.

use crate::tokenizer::content::ChatTurn;
use rand::distr::Alphanumeric;
use rand::Rng;
use serde_json::{json, Value};

/// How a model writes its calls, read from its chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
}

impl ToolFormat {
    /// The format a template's source asks for; Hermes when it names none
    /// (it is also what [`fallback_turns`] teaches).
    pub fn from_template(src: &str) -> ToolFormat {
        if src.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if src.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if src.contains("<|python_tag|>") || src.contains("\"parameters\"") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        }
    }

    /// The text that opens calls anywhere in the output.
    fn marker(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Llama3 => "<|python_tag|>",
            ToolFormat::Mistral => "[TOOL_CALLS]",
        }
    }

    /// The character that opens calls when it starts the output (after
    /// whitespace): the formats whose marker is a control token.
    fn start_char(self) -> Option<char> {
        match self {
            ToolFormat::Hermes => None,
            ToolFormat::Llama3 => Some('{'),
            ToolFormat::Mistral => Some('['),
        }
    }

    /// A fresh call id: `call_` and 24 alphanumerics; Mistral templates
    /// refuse any id but 9 alphanumerics, so a client sending the call back
    /// gets those there.
    fn new_id(self) -> String {
        let alnum = |n: usize| -> String {
            rand::rng()
                .sample_iter(&Alphanumeric)
                .take(n)
                .map(char::from)
                .collect()
        };
        match self {
            ToolFormat::Mistral => alnum(9),
            ToolFormat::Hermes | ToolFormat::Llama3 => format!("call_{}", alnum(24)),
        }
    }
}

/// One parsed call, in OpenAI's shape (`arguments` a JSON string).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// The call as an element of a message's `tool_calls`.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }

    /// The call as a streamed `delta` (`index`: the call's place among the
    /// choice's calls; the whole arguments string in this one delta).
    pub fn delta(&self, index: usize) -> Value {
        let mut c = self.to_json();
        c["index"] = json!(index);
        json!({ "tool_calls": [c] })
    }
}

/// What [`ToolStream`] emits, in output order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Call(ToolCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Text,
    /// After a marker (or the start character): calls until the format's
    /// end.
    Call,
}

/// Splits streamed text into content and tool calls.
pub struct ToolStream {
    format: ToolFormat,
    /// Text received and not yet emitted.
    buf: String,
    state: State,
    /// Nothing but whitespace received yet.
    at_start: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream {
            format,
            buf: String::new(),
            state: State::Text,
            at_start: true,
        }
    }

    /// Adds a text delta; returns what is now certain.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        self.step(false, &mut out);
        out
    }

    /// The output ended: everything held is decided (an unfinished call
    /// that parses counts, the rest is text).
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.step(true, &mut out);
        if !self.buf.is_empty() {
            text(&mut out, std::mem::take(&mut self.buf));
        }
        out
    }

    fn call(&self, name: String, arguments: String) -> Piece {
        Piece::Call(ToolCall {
            id: self.format.new_id(),
            name,
            arguments,
        })
    }

    /// Emits what can be decided from `buf`; with `eof`, everything.
    fn step(&mut self, eof: bool, out: &mut Vec<Piece>) {
        loop {
            let more = match self.state {
                State::Text => self.step_text(eof, out),
                State::Call => match self.format {
                    ToolFormat::Hermes => self.step_hermes(eof, out),
                    ToolFormat::Llama3 => self.step_llama(eof, out),
                    ToolFormat::Mistral => self.step_mistral(eof, out),
                },
            };
            if !more {
                return;
            }
        }
    }

    /// Content mode. Returns whether to step again.
    fn step_text(&mut self, eof: bool, out: &mut Vec<Piece>) -> bool {
        if self.at_start {
            let t = self.buf.trim_start();
            if t.is_empty() {
                // Leading whitespace waits for what follows it.
                return false;
            }
            self.at_start = false;
            if let Some(c) = self.format.start_char() {
                if t.starts_with(c) {
                    self.buf = t.to_string();
                    self.state = State::Call;
                    return true;
                }
            }
        }
        let marker = self.format.marker();
        if let Some(p) = self.buf.find(marker) {
            let before: String = self.buf.drain(..p).collect();
            text(out, before);
            self.buf.drain(..marker.len());
            self.state = State::Call;
            return true;
        }
        let keep = if eof {
            0
        } else {
            partial_marker(&self.buf, marker)
        };
        let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
        text(out, emit);
        false
    }

    /// `<tool_call> ... </tool_call>`; the opening tag is consumed.
    fn step_hermes(&mut self, eof: bool, out: &mut Vec<Piece>) -> bool {
        const END: &str = "</tool_call>";
        let (body_end, consumed) = match self.buf.find(END) {
            Some(q) => (q, q + END.len()),
            // A model may stop right after the object, before the tag.
            None if eof => (self.buf.len(), self.buf.len()),
            None => return false,
        };
        let raw: String = self.buf.drain(..consumed).collect();
        match parse_call(raw[..body_end].trim()) {
            Some((name, args)) => out.push(self.call(name, args)),
            None => text(out, format!("{}{raw}", self.format.marker())),
        }
        self.state = State::Text;
        true
    }

    /// `{..}; {..}` after the marker or at the start; separators dropped.
    fn step_llama(&mut self, eof: bool, out: &mut Vec<Piece>) -> bool {
        let t = self
            .buf
            .trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        self.buf = t.to_string();
        if self.buf.is_empty() {
            if eof {
                self.state = State::Text;
            }
            return false;
        }
        if !self.buf.starts_with('{') {
            self.state = State::Text;
            return true;
        }
        let Some(e) = json_end(&self.buf) else {
            if eof {
                self.state = State::Text;
                let rest = std::mem::take(&mut self.buf);
                text(out, rest);
            }
            return false;
        };
        let obj: String = self.buf.drain(..e).collect();
        match parse_call(&obj) {
            Some((name, args)) => out.push(self.call(name, args)),
            None => {
                text(out, obj);
                self.state = State::Text;
            }
        }
        true
    }

    /// `[{..}, ..]` after the marker or at the start.
    fn step_mistral(&mut self, eof: bool, out: &mut Vec<Piece>) -> bool {
        let t = self.buf.trim_start();
        let undecided = t.is_empty()
            || (t.starts_with('[') && t[1..].trim_start().is_empty())
            || (t.starts_with('[')
                && t[1..].trim_start().starts_with('{')
                && json_end(t).is_none());
        if undecided && !eof {
            return false;
        }
        let looks_like_calls = t.starts_with('[') && t[1..].trim_start().starts_with('{');
        self.state = State::Text;
        let Some(e) = json_end(t).filter(|_| looks_like_calls) else {
            // Not a call list after all: plain text from here.
            self.buf = t.to_string();
            return true;
        };
        let arr = t[..e].to_string();
        self.buf = t[e..].to_string();
        let calls: Option<Vec<(String, String)>> = serde_json::from_str::<Vec<Value>>(&arr)
            .ok()
            .and_then(|v| v.iter().map(parse_call_value).collect());
        match calls {
            Some(calls) if !calls.is_empty() => {
                for (name, args) in calls {
                    out.push(self.call(name, args));
                }
            }
            _ => text(out, arr),
        }
        true
    }
}

/// Appends text, merged with a text piece just before it.
fn text(out: &mut Vec<Piece>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(Piece::Text(t)) = out.last_mut() {
        t.push_str(&s);
    } else {
        out.push(Piece::Text(s));
    }
}

/// Bytes at the end of `s` that begin `marker` (a marker split across
/// deltas): the longest proper prefix of `marker` that ends `s`.
fn partial_marker(s: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&k| s.as_bytes().ends_with(&marker.as_bytes()[..k]))
        .unwrap_or(0)
}

/// The end (exclusive) of the JSON object or array that starts `s`, by
/// bracket depth outside strings; None while it is unfinished. Brackets are
/// not matched by kind: serde_json validates what this cuts out.
fn json_end(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for (i, b) in s.bytes().enumerate() {
        if in_str {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// `{"name": .., "arguments" | "parameters": {..}}` as (name, arguments
/// JSON string); None when `s` is no such object.
fn parse_call(s: &str) -> Option<(String, String)> {
    parse_call_value(&serde_json::from_str::<Value>(s).ok()?)
}

fn parse_call_value(v: &Value) -> Option<(String, String)> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str().filter(|n| !n.is_empty())?;
    let args = match o.get("arguments").or_else(|| o.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        // Some models write the arguments already as a JSON string.
        Some(Value::String(s)) => s.clone(),
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some((name.to_string(), args))
}

/// A whole output split into content and calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// Parses a complete output (see [`ToolStream`]).
pub fn parse(format: ToolFormat, output: &str) -> Parsed {
    let mut s = ToolStream::new(format);
    let mut pieces = s.push(output);
    pieces.extend(s.finish());
    let mut p = Parsed::default();
    for piece in pieces {
        match piece {
            Piece::Text(t) => p.content.push_str(&t),
            Piece::Call(c) => p.calls.push(c),
        }
    }
    p
}

/// The finish reason of a choice that made `calls` calls: "tool_calls"
/// when it made any and was not cut by its length limit.
pub fn finish_reason(reason: &'static str, calls: usize) -> &'static str {
    if calls > 0 && reason != "length" {
        "tool_calls"
    } else {
        reason
    }
}

/// Whether a template renders the `tools` variable itself.
fn template_renders_tools(src: &str) -> bool {
    src.contains("tools")
}

/// Whether a template renders assistant `tool_calls` itself.
fn template_renders_tool_calls(src: &str) -> bool {
    src.contains("tool_calls")
}

/// What to render for template `src` (its source): the turns, the `tools`
/// variable, and the format to parse calls in (None: no tools, nothing to
/// parse). A template that ignores tools gets them described in the system
/// turn and its output parsed as Hermes; one that ignores `tool_calls`
/// gets the calls written into the assistant contents (see
/// [`fallback_turns`]).
pub fn prompt_side(
    src: &str,
    turns: Vec<ChatTurn>,
    tools: Option<Value>,
) -> (Vec<ChatTurn>, Option<Value>, Option<ToolFormat>) {
    let native = template_renders_tools(src);
    let format = tools.as_ref().map(|_| {
        if native {
            ToolFormat::from_template(src)
        } else {
            ToolFormat::Hermes
        }
    });
    let calls_in_content =
        !template_renders_tool_calls(src) && turns.iter().any(|t| t.tool_calls.is_some());
    let describe = tools.is_some() && !native;
    if !(describe || calls_in_content) {
        return (turns, tools, format);
    }
    let (described, kept) = if describe {
        (tools, None)
    } else {
        (None, tools)
    };
    let turns = fallback_turns(&turns, described.as_ref(), calls_in_content);
    (turns, kept, format)
}

/// For a template that ignores tools, the turns with the tools described
/// in the system turn (Hermes' wording; the output is then parsed as
/// Hermes) and, when `calls_in_content`, each assistant's `tool_calls`
/// written into its content in that format. Without this the model would
/// never see what the client sent.
pub fn fallback_turns(
    turns: &[ChatTurn],
    tools: Option<&Value>,
    calls_in_content: bool,
) -> Vec<ChatTurn> {
    let mut out: Vec<ChatTurn> = turns
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if let (true, Some(Value::Array(calls))) = (calls_in_content, &t.tool_calls) {
                for c in calls {
                    let f = &c["function"];
                    // Name first, as the preamble shows it.
                    let call = format!(
                        "{{\"name\": {}, \"arguments\": {}}}",
                        f["name"], f["arguments"]
                    );
                    if !t.content.is_empty() {
                        t.content.push('\n');
                    }
                    t.content
                        .push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
                }
                t.tool_calls = None;
            }
            t
        })
        .collect();
    let Some(Value::Array(list)) = tools else {
        return out;
    };
    let mut pre = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in list {
        pre.push('\n');
        pre.push_str(&t.to_string());
    }
    pre.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    match out.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{pre}", first.content);
        }
        _ => out.insert(
            0,
            ChatTurn {
                role: "system".into(),
                content: pre,
                tool_calls: None,
                tool_call_id: None,
                name: None,
            },
        ),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls as (name, arguments), content as one string.
    fn shape(pieces: &[Piece]) -> (String, Vec<(String, String)>, Vec<usize>) {
        let mut content = String::new();
        let mut calls = Vec::new();
        // Where each call sat in the content (its order against the text).
        let mut at = Vec::new();
        for p in pieces {
            match p {
                Piece::Text(t) => content.push_str(t),
                Piece::Call(c) => {
                    at.push(content.len());
                    calls.push((c.name.clone(), c.arguments.clone()));
                }
            }
        }
        (content, calls, at)
    }

    fn feed(format: ToolFormat, parts: &[&str]) -> Vec<Piece> {
        let mut s = ToolStream::new(format);
        let mut out = Vec::new();
        for p in parts {
            out.extend(s.push(p));
        }
        out.extend(s.finish());
        out
    }

    /// Checks `text` parses to `content` and `calls`, and that the stream
    /// gives the same when the text is split at every position and fed one
    /// character at a time; no content piece may hold a marker's prefix
    /// that later became a call (the shapes would differ).
    fn check(format: ToolFormat, text: &str, content: &str, calls: &[(&str, &str)]) {
        let want_calls: Vec<(String, String)> = calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect();
        let whole = shape(&feed(format, &[text]));
        assert_eq!(whole.0, content, "content of {text:?}");
        assert_eq!(whole.1, want_calls, "calls of {text:?}");
        let p = parse(format, text);
        assert_eq!(p.content, content);
        assert_eq!(p.calls.len(), calls.len());
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let split = shape(&feed(format, &[&text[..i], &text[i..]]));
            assert_eq!(split, whole, "{text:?} split at {i}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(shape(&feed(format, &refs)), whole, "{text:?} char by char");
    }

    #[test]
    fn format_from_template() {
        assert_eq!(
            ToolFormat::from_template("{{ '<tool_call>' }}"),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::from_template("{{- '<|python_tag|>' }}"),
            ToolFormat::Llama3
        );
        assert_eq!(
            ToolFormat::from_template("{\"name\": ..., \"parameters\": ...}"),
            ToolFormat::Llama3
        );
        assert_eq!(
            ToolFormat::from_template("[TOOL_CALLS] {\"parameters\"}"),
            ToolFormat::Mistral
        );
        assert_eq!(ToolFormat::from_template("plain"), ToolFormat::Hermes);
    }

    #[test]
    fn hermes_calls() {
        let h = ToolFormat::Hermes;
        check(
            h,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "",
            &[("get_weather", r#"{"city":"Paris"}"#)],
        );
        // Text before, two calls, text between and after.
        check(
            h,
            "Let me look. <tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": [1, \"}\"]}}</tool_call> done",
            "Let me look. \n done",
            &[("a", "{}"), ("b", r#"{"x":[1,"}"]}"#)],
        );
        // Malformed JSON stays text, verbatim; a later call still parses.
        check(
            h,
            "<tool_call>{\"name\": \"a\", \"arguments\": {oops}</tool_call>x<tool_call>{\"name\":\"c\"}</tool_call>",
            "<tool_call>{\"name\": \"a\", \"arguments\": {oops}</tool_call>x",
            &[("c", "{}")],
        );
        // No closing tag at the end of the output: the call still counts;
        // an unfinished one is text.
        check(
            h,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": 1}}\n",
            "",
            &[("a", r#"{"k":1}"#)],
        );
        check(
            h,
            "é <tool_call>{\"name\": ",
            "é <tool_call>{\"name\": ",
            &[],
        );
        // A marker's prefix that goes nowhere is text.
        check(h, "a <tool b <tool_c", "a <tool b <tool_c", &[]);
        check(h, "no calls at all", "no calls at all", &[]);
    }

    #[test]
    fn llama3_calls() {
        let l = ToolFormat::Llama3;
        check(
            l,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            "",
            &[("get_weather", r#"{"city":"Paris"}"#)],
        );
        check(
            l,
            " <|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}}; {\"name\": \"b\", \"parameters\": {}}",
            " ",
            &[("a", r#"{"q":"x;y"}"#), ("b", "{}")],
        );
        // Text before the tag stays content.
        check(
            l,
            "Sure.<|python_tag|>{\"type\": \"function\", \"name\": \"a\", \"parameters\": {}}",
            "Sure.",
            &[("a", "{}")],
        );
        // JSON that is no call is content; so is a brace later in the text.
        check(l, "{\"answer\": 42}", "{\"answer\": 42}", &[]);
        check(l, "{\"name\": 7}", "{\"name\": 7}", &[]);
        check(l, "x {\"name\": \"a\"}", "x {\"name\": \"a\"}", &[]);
        check(l, "{\"name\": \"a\", \"par", "{\"name\": \"a\", \"par", &[]);
        check(
            l,
            "{\"name\": \"a\"} then text",
            "then text",
            &[("a", "{}")],
        );
    }

    #[test]
    fn mistral_calls() {
        let m = ToolFormat::Mistral;
        check(
            m,
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]",
            "",
            &[("a", r#"{"x":1}"#), ("b", "{}")],
        );
        // The marker is a control token the detokenizer may drop.
        check(
            m,
            " [{\"name\": \"a\", \"arguments\": {}}]",
            "",
            &[("a", "{}")],
        );
        check(
            m,
            "Calling. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": \"{\\\"s\\\": 1}\"}]",
            "Calling. ",
            &[("a", r#"{"s": 1}"#)],
        );
        check(m, "[1] a footnote", "[1] a footnote", &[]);
        check(
            m,
            "[{\"name\": \"a\", \"arguments\": 5}] x",
            "[{\"name\": \"a\", \"arguments\": 5}] x",
            &[],
        );
        check(m, "[{\"name\": \"a\"", "[{\"name\": \"a\"", &[]);
    }

    #[test]
    fn ids_and_shapes() {
        let p = parse(
            ToolFormat::Hermes,
            "<tool_call>{\"name\":\"f\"}</tool_call>",
        );
        let id = &p.calls[0].id;
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        assert!(id[5..].chars().all(|c| c.is_ascii_alphanumeric()));
        let m = parse(ToolFormat::Mistral, "[{\"name\":\"f\"}]");
        assert_eq!(m.calls[0].id.len(), 9);
        let d = p.calls[0].delta(2);
        assert_eq!(d["tool_calls"][0]["index"], 2);
        assert_eq!(d["tool_calls"][0]["type"], "function");
        assert_eq!(d["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(d["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(finish_reason("stop", 1), "tool_calls");
        assert_eq!(finish_reason("length", 1), "length");
        assert_eq!(finish_reason("stop", 0), "stop");
    }

    #[test]
    fn fallback_describes_tools() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
        let user = ChatTurn::from(&crate::tokenizer::ChatMessage::new("user", "hi"));
        let asst = ChatTurn {
            tool_calls: Some(json!([{"id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": {"a": 1}}}])),
            ..ChatTurn::from(&crate::tokenizer::ChatMessage::new("assistant", ""))
        };
        let out = fallback_turns(&[user.clone(), asst.clone()], Some(&tools), true);
        assert_eq!(out[0].role, "system");
        assert!(out[0]
            .content
            .contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"f\""));
        assert_eq!(out[1], user);
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n</tool_call>"
        );
        assert!(out[2].tool_calls.is_none());
        // Through prompt_side: a template with tools but no tool_calls keeps
        // its `tools` variable and gets the calls in the content.
        let turns = vec![user.clone(), asst];
        let src = "{% for t in tools %}{{ t.function.name }}{% endfor %}<tool_call>";
        let (t2, v, f) = prompt_side(src, turns.clone(), Some(tools.clone()));
        assert_eq!(t2, out[1..]);
        assert_eq!((v.as_ref(), f), (Some(&tools), Some(ToolFormat::Hermes)));
        // A template that knows both gets everything as sent.
        let src = "{{ tools }}{{ m.tool_calls }}[TOOL_CALLS]";
        let (t3, v, f) = prompt_side(src, turns.clone(), Some(tools.clone()));
        assert_eq!(t3, turns);
        assert_eq!((v.as_ref(), f), (Some(&tools), Some(ToolFormat::Mistral)));
        let (t4, v, f) = prompt_side("{{ messages }}", vec![user.clone()], None);
        assert_eq!((t4, v, f), (vec![user.clone()], None, None));
        // An existing system turn is extended, not doubled.
        let sys = ChatTurn::from(&crate::tokenizer::ChatMessage::new("system", "Be brief."));
        let out = fallback_turns(&[sys], Some(&tools), false);
        assert_eq!(out.len(), 1);
        assert!(out[0].content.starts_with("Be brief.\n\n# Tools"));
    }
}
