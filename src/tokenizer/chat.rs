//! Chat templates: `tokenizer.chat_template` rendered with minijinja, with
//! Python string/dict methods from minijinja-contrib's pycompat and the
//! globals HF templates expect.

use anyhow::{anyhow, bail, Result};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io;

/// Instructions one rendering may execute (minijinja's fuel). Real chat
/// templates spend a few hundred per message; this stops a runaway loop in
/// well under a second.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// Bytes a rendering may produce beyond four times the messages' own bytes.
pub const TEMPLATE_OUTPUT_SLACK: usize = 1 << 20;

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// One chat turn with the fields of OpenAI's tool calling, as HF templates
/// read them: `tool_calls` (OpenAI's list, each `function.arguments` an
/// object where the client's JSON string parsed), `tool_call_id` and `name`
/// (of a `tool` turn). Absent fields are not serialized, so a template sees
/// them undefined and a turn without them renders exactly as a
/// [`ChatMessage`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl From<&ChatMessage> for ChatTurn {
    fn from(m: &ChatMessage) -> ChatTurn {
        ChatTurn {
            role: m.role.clone(),
            content: m.content.clone(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

impl ChatTurn {
    /// Bytes of text this turn brings into a rendering (for the output cap).
    fn input_bytes(&self) -> usize {
        self.role.len()
            + self.content.len()
            + self.tool_calls.as_ref().map_or(0, json_len)
            + self.tool_call_id.as_ref().map_or(0, String::len)
            + self.name.as_ref().map_or(0, String::len)
    }
}

fn json_len(v: &Value) -> usize {
    v.to_string().len()
}

/// ChatML, used when the file has no `tokenizer.chat_template`:
/// `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
/// `<|im_start|>assistant\n` when a generation prompt is asked for.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Renders `src` with the given messages and special-token strings.
pub fn render(
    src: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let turns: Vec<ChatTurn> = messages.iter().map(ChatTurn::from).collect();
    render_turns(
        src,
        &turns,
        None,
        add_generation_prompt,
        bos_token,
        eos_token,
    )
}

/// Renders `src` over turns that may carry tool calls, with `tools` (the
/// list of OpenAI tool objects) as the template's `tools` variable; None
/// leaves `tools` undefined, as HF does without tools.
pub fn render_turns(
    src: &str,
    messages: &[ChatTurn],
    tools: Option<&Value>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| -> String {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        strftime_utc(&fmt, secs)
    });
    env.set_fuel(Some(TEMPLATE_FUEL));
    let tmpl = env
        .template_from_str(src)
        .map_err(|e| anyhow!("parsing the chat template: {e:#}"))?;
    let input: usize = messages.iter().map(ChatTurn::input_bytes).sum::<usize>()
        + tools.map_or(0, json_len)
        + bos_token.len()
        + eos_token.len();
    let cap = input
        .saturating_mul(4)
        .saturating_add(TEMPLATE_OUTPUT_SLACK);
    let mut out = CappedBuf {
        buf: Vec::new(),
        cap,
        overflowed: false,
    };
    let base = context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    };
    let ctx = match tools {
        Some(t) => context! { tools => t, ..base },
        None => base,
    };
    if let Err(e) = tmpl.render_captured_to(ctx, &mut out) {
        if out.overflowed {
            bail!(
                "the chat template exceeded its budget: its output passed {cap} bytes \
                 (4 x the {input} bytes of the messages + {TEMPLATE_OUTPUT_SLACK})"
            );
        }
        if e.kind() == ErrorKind::OutOfFuel {
            bail!(
                "the chat template exceeded its budget of {TEMPLATE_FUEL} instructions \
                 (a runaway loop in tokenizer.chat_template?)"
            );
        }
        bail!("rendering the chat template: {e:#}");
    }
    String::from_utf8(out.buf).map_err(|e| anyhow!("the chat template's output is not UTF-8: {e}"))
}

/// A writer that refuses to grow past `cap` bytes.
struct CappedBuf {
    buf: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl io::Write for CappedBuf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(b.len()) > self.cap {
            self.overflowed = true;
            return Err(io::Error::other("chat template output cap reached"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A small `strftime` for UTC times: %Y %y %m %d %e %H %M %S %B %b %%;
/// other directives are copied through.
pub fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    // Civil-from-days (H. Hinnant), valid for the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{:02}", sod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", sod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", sod % 60)),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %b %B %%", 1_709_211_909),
            "2024-02-29 13:05:09 Feb February %"
        );
        assert_eq!(strftime_utc("%d %B %Y", 0), "01 January 1970");
    }

    #[test]
    fn chatml_fallback_and_raise() {
        let m = [ChatMessage::new("user", "hi")];
        let s = render(CHATML_TEMPLATE, &m, true, "", "").unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        let err = render("{{ raise_exception('bad role') }}", &m, false, "", "").unwrap_err();
        assert!(format!("{err:#}").contains("bad role"), "{err:#}");
        let py = render("{{ messages[0].content.upper() }}", &m, false, "", "").unwrap();
        assert_eq!(py, "HI");
    }

    /// A Llama-3-style template: whitespace control, `trim`, bos_token,
    /// `loop.index0`, `strftime_now`.
    #[test]
    fn llama3_style_template() {
        let src = "{{- bos_token }}\n{%- for message in messages %}\n    \
                   {%- if loop.index0 == 0 and message.role != 'system' %}{{ raise_exception('system first') }}{% endif %}\n    \
                   {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n\
                   {%- endfor %}\n\
                   {%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
        let m = [
            ChatMessage::new("system", " Be nice. "),
            ChatMessage::new("user", "Hi\n"),
        ];
        let s = render(src, &m, true, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        assert_eq!(
            s,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe nice.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        let err = render(src, &m[1..], false, "", "").unwrap_err();
        assert!(format!("{err:#}").contains("system first"));
        let year = render("{{ strftime_now('%Y') }}", &m, false, "", "").unwrap();
        assert!(
            year.len() == 4 && year.parse::<u32>().unwrap() >= 2024,
            "{year}"
        );
    }

    /// A Qwen2.5 (Hermes) style template: `tools` rendered with `tojson`,
    /// assistant `tool_calls` with object arguments, `tool` turns.
    #[test]
    fn hermes_tools_template() {
        let src = "{%- if tools %}<|im_start|>system\n<tools>\n\
                   {%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}\n\
                   {%- for message in messages %}\n\
                   {%- if message.role == 'assistant' and message.tool_calls is defined %}\
                   <|im_start|>assistant\n{{ message.content }}\
                   {%- for tc in message.tool_calls %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n\
                   {%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>[{{ message.tool_call_id }}]<|im_end|>\n\
                   {%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}\n\
                   {%- endfor %}\
                   {%- if tools is not defined %}[no tools]{%- endif %}";
        let tools = serde_json::json!([{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let turns = [
            ChatTurn::from(&ChatMessage::new("user", "Weather in Paris?")),
            ChatTurn {
                tool_calls: Some(serde_json::json!([{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])),
                ..ChatTurn::from(&ChatMessage::new("assistant", ""))
            },
            ChatTurn {
                tool_call_id: Some("call_1".into()),
                ..ChatTurn::from(&ChatMessage::new("tool", "18 C"))
            },
        ];
        let s = render_turns(src, &turns, Some(&tools), false, "", "").unwrap();
        let head =
            "<|im_start|>system\n<tools>{\"function\":{\"description\":\"Weather of a city\"";
        assert!(s.starts_with(head), "{s}");
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}";
        assert!(s.contains(call), "{s}");
        assert!(
            s.contains("<tool_response>\n18 C\n</tool_response>[call_1]"),
            "{s}"
        );
        assert!(!s.contains("[no tools]"), "{s}");
        // Without tools the variable is undefined and plain turns render as
        // ChatMessages do.
        let plain = [ChatMessage::new("user", "hi")];
        let a = render(src, &plain, false, "", "").unwrap();
        let b = render_turns(src, &[ChatTurn::from(&plain[0])], None, false, "", "").unwrap();
        assert_eq!(a, "<|im_start|>user\nhi<|im_end|>[no tools]");
        assert_eq!(a, b);
    }
}
