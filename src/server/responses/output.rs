//! A response's output items built from its text deltas, and the stream
//! events that announce them. Streamed and non-streamed responses run the
//! same builder (the latter drops the events), so both hold the same items.
//!
//! With tools, the deltas go through [`ToolStream`] (the chat path's
//! parser): text becomes `message` items, each call a `function_call` item,
//! in output order. A message is opened at its first text that is not
//! whitespace; whitespace alone next to calls is dropped (the chat path's
//! null content), and an output with no item at all gets one message, so a
//! response always has output.

use super::super::tools::{Piece, ToolCall, ToolFormat, ToolStream};
use serde_json::{json, Value};

/// An event to send: its `type` and its other fields (the sender adds
/// `type` and `sequence_number`).
pub type Ev = (&'static str, Value);

/// 48 random hex digits (ids are not guessable).
pub fn random_hex() -> String {
    format!(
        "{:016x}{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// A fresh item id: `prefix`, `_`, random hex.
fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex())
}

/// The message being written.
struct OpenMsg {
    id: String,
    text: String,
    /// Its place in `output`.
    index: usize,
}

pub struct Builder {
    tools: Option<ToolStream>,
    /// Finished items, in output order.
    items: Vec<Value>,
    open: Option<OpenMsg>,
    /// Whitespace not yet given to a message.
    pending: String,
}

fn message(id: &str, status: &str, content: Value) -> Value {
    json!({
        "type": "message", "id": id, "status": status,
        "role": "assistant", "content": content,
    })
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

impl Builder {
    /// `tools`: the format to parse calls in (None: everything is text).
    pub fn new(tools: Option<ToolFormat>) -> Builder {
        Builder {
            tools: tools.map(ToolStream::new),
            items: Vec::new(),
            open: None,
            pending: String::new(),
        }
    }

    /// Adds a text delta; returns the events it causes.
    pub fn push(&mut self, delta: &str) -> Vec<Ev> {
        let pieces = match &mut self.tools {
            Some(t) => t.push(delta),
            None => vec![Piece::Text(delta.to_string())],
        };
        let mut ev = Vec::new();
        self.pieces(pieces, &mut ev);
        ev
    }

    /// The output ended (`incomplete`: cut by its length limit): the
    /// parser's held text is decided, the open message closed.
    pub fn finish(&mut self, incomplete: bool) -> Vec<Ev> {
        let mut ev = Vec::new();
        if let Some(t) = &mut self.tools {
            let pieces = t.finish();
            self.pieces(pieces, &mut ev);
        }
        if self.open.is_none() && self.items.is_empty() {
            let text = std::mem::take(&mut self.pending);
            self.open_message(&text, &mut ev);
        }
        self.close_message(incomplete, &mut ev);
        ev
    }

    /// The output items (all finished after [`Builder::finish`]).
    pub fn items(&self) -> &[Value] {
        &self.items
    }

    fn pieces(&mut self, pieces: Vec<Piece>, ev: &mut Vec<Ev>) {
        for p in pieces {
            match p {
                Piece::Text(t) => self.text(&t, ev),
                Piece::Call(c) => {
                    self.close_message(false, ev);
                    self.pending.clear();
                    self.call(&c, ev);
                }
            }
        }
    }

    fn text(&mut self, t: &str, ev: &mut Vec<Ev>) {
        if let Some(m) = &mut self.open {
            m.text.push_str(t);
            ev.push(delta_event(m, t));
            return;
        }
        self.pending.push_str(t);
        if !self.pending.trim().is_empty() {
            let text = std::mem::take(&mut self.pending);
            self.open_message(&text, ev);
        }
    }

    /// Opens a message holding `text` (announced, then sent as one delta
    /// when not empty).
    fn open_message(&mut self, text: &str, ev: &mut Vec<Ev>) {
        let m = OpenMsg {
            id: item_id("msg"),
            text: text.to_string(),
            index: self.items.len(),
        };
        ev.push((
            "response.output_item.added",
            json!({"output_index": m.index, "item": message(&m.id, "in_progress", json!([]))}),
        ));
        ev.push((
            "response.content_part.added",
            json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
                   "part": text_part("")}),
        ));
        if !text.is_empty() {
            ev.push(delta_event(&m, text));
        }
        self.open = Some(m);
    }

    fn close_message(&mut self, incomplete: bool, ev: &mut Vec<Ev>) {
        let Some(m) = self.open.take() else {
            return;
        };
        let (id, index, text) = (m.id, m.index, m.text);
        ev.push((
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "text": text, "logprobs": []}),
        ));
        ev.push((
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": text_part(&text)}),
        ));
        let status = if incomplete {
            "incomplete"
        } else {
            "completed"
        };
        let item = message(&id, status, json!([text_part(&text)]));
        ev.push((
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.items.push(item);
    }

    /// A parsed call: announced, its arguments as one delta, done.
    fn call(&mut self, c: &ToolCall, ev: &mut Vec<Ev>) {
        let id = item_id("fc");
        let index = self.items.len();
        let item = |arguments: &str, status: &str| {
            json!({"type": "function_call", "id": id, "call_id": c.id, "name": c.name,
                   "arguments": arguments, "status": status})
        };
        ev.push((
            "response.output_item.added",
            json!({"output_index": index, "item": item("", "in_progress")}),
        ));
        ev.push((
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": c.arguments}),
        ));
        ev.push((
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": c.name,
                   "arguments": c.arguments}),
        ));
        let done = item(&c.arguments, "completed");
        ev.push((
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        ));
        self.items.push(done);
    }
}

fn delta_event(m: &OpenMsg, t: &str) -> Ev {
    (
        "response.output_text.delta",
        json!({"item_id": m.id, "output_index": m.index, "content_index": 0,
               "delta": t, "logprobs": []}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of the output's messages, joined (what clients compute as
    /// `output_text`).
    fn output_text(items: &[Value]) -> String {
        items
            .iter()
            .filter(|i| i["type"] == "message")
            .flat_map(|i| i["content"].as_array().into_iter().flatten())
            .filter_map(|p| p["text"].as_str())
            .collect()
    }

    fn run(tools: Option<ToolFormat>, deltas: &[&str], incomplete: bool) -> (Vec<Ev>, Vec<Value>) {
        let mut b = Builder::new(tools);
        let mut ev = Vec::new();
        for d in deltas {
            ev.extend(b.push(d));
        }
        ev.extend(b.finish(incomplete));
        (ev, b.items().to_vec())
    }

    fn types(ev: &[Ev]) -> Vec<&str> {
        ev.iter().map(|e| e.0).collect()
    }

    #[test]
    fn text_only() {
        let (ev, items) = run(None, &["Hel", "lo", " there"], false);
        assert_eq!(
            types(&ev),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        assert_eq!(items.len(), 1);
        assert_eq!(output_text(&items), "Hello there");
        assert_eq!(items[0]["status"], "completed");
        assert!(items[0]["id"].as_str().unwrap().starts_with("msg_"));
        let deltas: String = ev
            .iter()
            .filter(|e| e.0 == "response.output_text.delta")
            .map(|e| e.1["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas, "Hello there");
        assert_eq!(ev[5].1["text"], "Hello there");
        assert_eq!(ev[7].1["item"], items[0]);
        // Nothing said: one empty message; cut by length: incomplete.
        let (ev, items) = run(None, &[], true);
        assert_eq!(ev.len(), 5, "{ev:?}");
        assert_eq!(items[0]["status"], "incomplete");
        assert_eq!(output_text(&items), "");
    }

    /// Text, then two calls (Hermes): a message, then one function_call
    /// item per call; whitespace between and after the calls is dropped.
    #[test]
    fn text_then_calls() {
        let (ev, items) = run(
            Some(ToolFormat::Hermes),
            &[
                "Let me check. <tool",
                "_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n",
                "<tool_call>{\"name\": \"t\"}</tool_call>\n",
            ],
            false,
        );
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(output_text(&items), "Let me check. ");
        for (k, (name, args)) in [("w", "{\"city\":\"Paris\"}"), ("t", "{}")]
            .iter()
            .enumerate()
        {
            let it = &items[k + 1];
            assert_eq!(it["type"], "function_call");
            assert_eq!(it["name"], *name);
            assert_eq!(it["arguments"], *args);
            assert_eq!(it["status"], "completed");
            assert!(it["id"].as_str().unwrap().starts_with("fc_"));
            assert!(it["call_id"].as_str().unwrap().starts_with("call_"));
        }
        let fc: Vec<&str> = types(&ev)
            .into_iter()
            .skip_while(|t| *t != "response.output_item.done")
            .collect();
        assert_eq!(
            fc[..5],
            [
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let outputs: Vec<u64> = ev
            .iter()
            .filter(|e| e.0 == "response.output_item.done")
            .map(|e| e.1["output_index"].as_u64().unwrap())
            .collect();
        assert_eq!(outputs, [0, 1, 2]);
        // Only a call, after whitespace: no message item at all.
        let (_, items) = run(
            Some(ToolFormat::Hermes),
            &["\n<tool_call>{\"name\": \"w\"}</tool_call>"],
            false,
        );
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["type"], "function_call");
        // Text that is no call stays text, verbatim.
        let (_, items) = run(Some(ToolFormat::Hermes), &["a <tool_call>oops"], false);
        assert_eq!(output_text(&items), "a <tool_call>oops");
    }
}
