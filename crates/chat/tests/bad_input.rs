//! Invalid requests fail with a typed error whose message says what and where
//! (the server returns it as an HTTP 400 body).

use agentd_chat::{ChatError, ChatMessage, ChatTemplate, RenderOptions};
use serde_json::{json, Value as Json};

fn render_json(
    messages: Json,
    tools: Option<Json>,
    opts: &RenderOptions,
) -> Result<String, ChatError> {
    let messages: Vec<ChatMessage> =
        serde_json::from_value(messages).expect("request shape parses");
    let tools: Option<Vec<Json>> =
        tools.map(|t| serde_json::from_value(t).expect("tools are a list"));
    let template = ChatTemplate::qwen3().expect("loads");
    template.render(&messages, tools.as_deref(), opts)
}

fn err(messages: Json) -> String {
    render_json(messages, None, &RenderOptions::default())
        .expect_err("must be rejected")
        .to_string()
}

#[test]
fn unknown_role() {
    assert_eq!(
        err(json!([{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}])),
        "messages[1].role: unknown role 'bot'; expected one of system, developer, user, assistant, tool"
    );
}

#[test]
fn empty_conversation() {
    assert_eq!(
        err(json!([])),
        "messages: must contain at least one message"
    );
}

#[test]
fn tool_message_without_id() {
    assert_eq!(
        err(json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "42"}
        ])),
        "messages[2].tool_call_id: a tool message requires 'tool_call_id'"
    );
}

#[test]
fn malformed_tool_call_arguments() {
    let e = err(json!([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1,"}}]}
    ]));
    assert!(
        e.starts_with("messages[1].tool_calls[0].function.arguments: is not valid JSON ("),
        "{e}"
    );
}

#[test]
fn tool_calls_on_a_user_message() {
    assert_eq!(
        err(json!([{"role": "user", "content": "hi", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}])),
        "messages[0].tool_calls: only assistant messages may carry tool_calls, not user"
    );
}

#[test]
fn tool_call_of_unknown_type_or_nameless() {
    assert_eq!(
        err(json!([{"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "retrieval", "function": {"name": "f"}}]}])),
        "messages[0].tool_calls[0].type: unsupported tool call type 'retrieval'; expected 'function'"
    );
    assert_eq!(
        err(
            json!([{"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": ""}}]}])
        ),
        "messages[0].tool_calls[0].function.name: must be a non-empty string"
    );
}

#[test]
fn missing_content() {
    assert_eq!(
        err(json!([{"role": "user"}])),
        "messages[0].content: a user message requires 'content'"
    );
    assert_eq!(
        err(json!([{"role": "user", "content": null}])),
        "messages[0].content: a user message requires 'content'"
    );
}

#[test]
fn non_text_content_part() {
    assert_eq!(
        err(json!([{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])),
        "messages[0].content[1]: unsupported content part type 'image_url'; this model accepts text parts only"
    );
    assert_eq!(
        err(json!([{"role": "user", "content": [{"type": "text"}]}])),
        "messages[0].content[0]: a text part requires 'text'"
    );
}

#[test]
fn content_of_the_wrong_type_is_a_serde_error() {
    let e = serde_json::from_value::<Vec<ChatMessage>>(json!([{"role": "user", "content": 5}]))
        .expect_err("rejected");
    assert!(
        e.to_string()
            .contains("a string or a list of content parts"),
        "{e}"
    );
}

#[test]
fn bad_tool_definitions() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let opts = RenderOptions::default();
    let e = |tools: Json| {
        render_json(msgs.clone(), Some(tools), &opts)
            .expect_err("rejected")
            .to_string()
    };
    assert_eq!(e(json!(["f"])), "tools[0]: a tool must be a JSON object");
    assert_eq!(
        e(json!([{"type": "code_interpreter"}])),
        "tools[0].type: unsupported tool type 'code_interpreter'; expected 'function'"
    );
    assert_eq!(
        e(json!([{"type": "function", "function": {"name": "ok"}}, {"type": "function"}])),
        "tools[1].function: missing or not an object"
    );
    assert_eq!(
        e(json!([{"type": "function", "function": {"description": "no name"}}])),
        "tools[0].function.name: must be a non-empty string"
    );
}

#[test]
fn incompatible_options() {
    let msgs = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]);
    let opts = RenderOptions {
        add_generation_prompt: true,
        continue_final_message: true,
        ..RenderOptions::default()
    };
    let e = render_json(msgs.clone(), None, &opts).expect_err("rejected");
    assert!(e.is_client_error());
    assert!(
        e.to_string()
            .starts_with("continue_final_message: continue_final_message and add_generation_prompt are not compatible"),
        "{e}"
    );

    let mut kwargs = serde_json::Map::new();
    kwargs.insert("messages".into(), json!([]));
    let opts = RenderOptions {
        chat_template_kwargs: kwargs,
        ..RenderOptions::default()
    };
    assert_eq!(
        render_json(msgs, None, &opts)
            .expect_err("rejected")
            .to_string(),
        "chat_template_kwargs.messages: is set by the server and cannot be overridden"
    );
}

#[test]
fn raise_exception_message_is_reported_verbatim() {
    let template = ChatTemplate::new(
        "{% if messages[0].role != 'system' %}{{ raise_exception('Conversation must start with a system message') }}{% endif %}ok",
        vec![],
    )
    .expect("compiles");
    let e = template
        .render(
            &[ChatMessage::text("user", "hi")],
            None,
            &RenderOptions::default(),
        )
        .expect_err("template refuses");
    assert_eq!(
        e,
        ChatError::Template("Conversation must start with a system message".into())
    );
    assert_eq!(
        e.to_string(),
        "chat template error: Conversation must start with a system message"
    );
    assert!(e.is_client_error());
}

#[test]
fn template_runtime_error_is_reported() {
    // `'a' + 1` fails in Jinja2 as in minijinja; the error names the template line.
    let template = ChatTemplate::new("{{ messages[0].content + 1 }}", vec![]).expect("compiles");
    let e = template
        .render(
            &[ChatMessage::text("user", "hi")],
            None,
            &RenderOptions::default(),
        )
        .expect_err("fails");
    let ChatError::Template(message) = &e else {
        panic!("unexpected {e:?}")
    };
    assert!(message.contains("default:1"), "{message}");
}
