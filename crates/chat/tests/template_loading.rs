//! Loading templates from `tokenizer_config.json` variants.

use agentd_chat::{ChatError, ChatMessage, ChatTemplate, RenderOptions};
use serde_json::json;

fn hi() -> Vec<ChatMessage> {
    vec![ChatMessage::text("user", "hi")]
}

#[test]
fn named_templates_pick_tool_use_when_tools_are_given() {
    let config = json!({
        "chat_template": [
            {"name": "default", "template": "D:{{ messages[0].content }}"},
            {"name": "tool_use", "template": "T:{{ tools | length }}"}
        ],
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
        "eos_token": "</s>",
        "unk_token": null
    })
    .to_string();
    let t = ChatTemplate::from_tokenizer_config(&config).expect("loads");
    assert_eq!(t.names(), vec!["default", "tool_use"]);
    assert_eq!(t.special_token("bos_token"), Some("<s>"));
    assert_eq!(t.special_token("eos_token"), Some("</s>"));
    assert_eq!(t.special_token("unk_token"), None);
    let opts = RenderOptions::default();
    assert_eq!(t.render(&hi(), None, &opts).expect("renders"), "D:hi");
    let tools = [json!({"type": "function", "function": {"name": "f"}})];
    assert_eq!(
        t.render(&hi(), Some(&tools), &opts).expect("renders"),
        "T:1"
    );
}

#[test]
fn named_templates_without_default() {
    let config = json!({"chat_template": [{"name": "rag", "template": "x"}]}).to_string();
    let t = ChatTemplate::from_tokenizer_config(&config).expect("loads");
    let e = t
        .render(&hi(), None, &RenderOptions::default())
        .expect_err("no default");
    assert!(matches!(e, ChatError::TemplateLoad(_)));
    assert!(!e.is_client_error());
}

#[test]
fn broken_configs() {
    for (config, want) in [
        ("{", "cannot load chat template: tokenizer_config.json: "),
        ("{}", "cannot load chat template: tokenizer_config.json has no chat_template"),
        (
            r#"{"chat_template": [{"name": "default"}]}"#,
            "cannot load chat template: chat_template list entries need 'name' and 'template' strings",
        ),
        (
            r#"{"chat_template": "{% if %}"}"#,
            "cannot load chat template: template 'default' does not compile: ",
        ),
    ] {
        let e = ChatTemplate::from_tokenizer_config(config).expect_err(config);
        assert!(e.to_string().starts_with(want), "{config}: {e}");
    }
    let e = ChatTemplate::from_tokenizer_config_file("/nonexistent/tokenizer_config.json")
        .expect_err("missing file");
    assert!(matches!(e, ChatError::TemplateLoad(_)));
}

#[test]
fn generation_blocks_render_their_body() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}",
        vec![],
    )
    .expect("compiles");
    assert_eq!(
        t.render(&hi(), None, &RenderOptions::default())
            .expect("renders"),
        "<hi>"
    );
}

#[test]
fn strftime_now_prints_a_date() {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", vec![]).expect("compiles");
    let out = t
        .render(&hi(), None, &RenderOptions::default())
        .expect("renders");
    let parts: Vec<&str> = out.split('-').collect();
    assert_eq!(parts.len(), 3, "{out}");
    assert!(
        parts[0].len() == 4 && parts[0].parse::<u32>().is_ok_and(|y| y >= 2024),
        "{out}"
    );
}

#[test]
fn kwargs_override_special_tokens_and_reach_the_template() {
    let t = ChatTemplate::new(
        "{{ eos_token }}|{{ enable_thinking }}",
        vec![("eos_token".into(), "E".into())],
    )
    .expect("compiles");
    let mut opts = RenderOptions::default();
    assert_eq!(t.render(&hi(), None, &opts).expect("renders"), "E|");
    opts.chat_template_kwargs
        .insert("eos_token".into(), json!("X"));
    opts.chat_template_kwargs
        .insert("enable_thinking".into(), json!(false));
    assert_eq!(opts.enable_thinking(), Some(false));
    assert_eq!(t.render(&hi(), None, &opts).expect("renders"), "X|False");
}

#[test]
fn embedded_qwen3_matches_the_committed_file() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/qwen3/tokenizer_config.json"
    );
    let from_file = ChatTemplate::from_tokenizer_config_file(path).expect("loads");
    let embedded = ChatTemplate::qwen3().expect("loads");
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    assert_eq!(
        from_file.render(&hi(), None, &opts).expect("renders"),
        embedded.render(&hi(), None, &opts).expect("renders")
    );
    assert_eq!(
        embedded.render(&hi(), None, &opts).expect("renders"),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}
