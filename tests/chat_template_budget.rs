//! Issue 59 F1: chat templates render under a step budget (minijinja fuel)
//! and an output cap, and fail with a clear error instead of hanging.

use quire::tokenizer::{render_chat_template, ChatMessage, CHATML_TEMPLATE};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Renders on a thread so that a template that hangs (the old behaviour)
/// fails the test instead of freezing it.
fn render_within(src: &'static str, limit: Duration) -> anyhow::Result<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let m = [ChatMessage::new("user", "hi")];
        let _ = tx.send(render_chat_template(src, &m, true, "", ""));
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("rendering {src:?} ran past {limit:?}"))
}

#[test]
fn nested_loop_runs_out_of_budget_fast() {
    let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let t = Instant::now();
    let err = render_within(src, Duration::from_secs(60)).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("the chat template exceeded its budget"),
        "{msg}"
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn huge_output_hits_the_cap() {
    // 100 MB of output in few instructions: under the fuel, over the cap.
    let src = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
    let err = render_within(src, Duration::from_secs(60)).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("the chat template exceeded its budget") && msg.contains("output"),
        "{msg}"
    );
}

#[test]
fn ordinary_templates_still_render() {
    let msgs: Vec<ChatMessage> = (0..2000)
        .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "hello"))
        .collect();
    let s = render_chat_template(CHATML_TEMPLATE, &msgs, true, "", "").unwrap();
    assert!(s.ends_with("<|im_start|>assistant\n"));
    assert_eq!(s.matches("<|im_end|>").count(), 2000);
}
