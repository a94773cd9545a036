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

mod sandbox {
    use quire::tokenizer::sandbox::{RenderSandbox, SandboxOptions, WorkerConfig};
    use quire::tokenizer::ChatMessage;
    use std::time::Duration;

    /// Doubles a string 60 times when the first message says "boom": 2^60
    /// bytes, far past any memory, in a few hundred instructions of fuel.
    const DOUBLING: &str = "{% if messages[0].content == 'boom' %}\
        {% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\
        {{ ns.s|length }}{% else %}ok:{{ messages[0].content }}{% endif %}";

    fn sandbox(template: &str, timeout: Duration) -> RenderSandbox {
        let mut opts = SandboxOptions::new(env!("CARGO_BIN_EXE_quire").into());
        opts.memory_mib = 256;
        opts.timeout = timeout;
        opts.max_workers = 2;
        let cfg = WorkerConfig {
            template: template.into(),
            bos_token: String::new(),
            eos_token: String::new(),
        };
        RenderSandbox::new(opts, cfg).expect("starting the sandbox")
    }

    #[test]
    fn string_doubling_kills_the_worker_not_the_process() {
        let sb = sandbox(DOUBLING, Duration::from_secs(30));
        let ok = sb.render(&[ChatMessage::new("user", "hi")], true).unwrap();
        assert_eq!(ok, "ok:hi");
        let err = sb
            .render(&[ChatMessage::new("user", "boom")], true)
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("the chat template exceeded its budget") && msg.contains("memory"),
            "{msg}"
        );
        // A fresh worker takes the next request.
        for i in 0..4 {
            let s = format!("again{i}");
            let ok = sb
                .render(&[ChatMessage::new("user", s.clone())], true)
                .unwrap();
            assert_eq!(ok, format!("ok:{s}"));
        }
    }

    #[test]
    fn slow_rendering_hits_the_timeout_and_errors_pass_through() {
        let src = "{% if messages[0].content == 'slow' %}{% for i in range(100000) %}\
                   {% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}\
                   {% if messages[0].content == 'raise' %}{{ raise_exception('no') }}{% endif %}done";
        // 20 ms stops the slow branch before its fuel runs out. The renders
        // after it use a sandbox with room to start a worker on a loaded
        // machine (a fresh worker after a kill is string_doubling's check).
        let sb = sandbox(src, Duration::from_millis(20));
        let err = sb
            .render(&[ChatMessage::new("user", "slow")], true)
            .unwrap_err();
        assert!(format!("{err:#}").contains("took more than"), "{err:#}");
        let sb = sandbox(src, Duration::from_secs(10));
        let err = sb
            .render(&[ChatMessage::new("user", "raise")], true)
            .unwrap_err();
        assert!(format!("{err:#}").contains("no"), "{err:#}");
        assert_eq!(
            sb.render(&[ChatMessage::new("user", "x")], true).unwrap(),
            "done"
        );
    }
}
