//! Renders every case of `tests/fixtures/chat/qwen3_golden.json` (produced by
//! transformers via `scripts/make_chat_golden.py`: hand-written cases plus
//! 150 seeded random conversations) and compares byte for byte.

use agentd_chat::{ChatError, ChatMessage, ChatTemplate, ContentFormat, RenderOptions};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

#[derive(Deserialize)]
struct Fixture {
    special_tokens_map: Map<String, Json>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<ChatMessage>,
    tools: Option<Vec<Json>>,
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template_kwargs: Map<String, Json>,
    chat_template: Option<String>,
    /// The content shape the golden script gave the template ("string" or
    /// "openai"); the Rust side must detect the same from the template.
    content_format: String,
    expected: Expected,
}

/// The prompt transformers rendered, or the message of the exception the
/// template raised.
#[derive(Deserialize)]
#[serde(untagged)]
enum Expected {
    Prompt(String),
    Error { error: String },
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/chat/qwen3_golden.json"
    );
    let text = std::fs::read_to_string(path).expect("golden fixture is committed");
    serde_json::from_str(&text).expect("golden fixture parses")
}

/// First differing position, with some context, for a readable failure.
fn diff(expected: &str, got: &str) -> String {
    let at = expected
        .char_indices()
        .zip(got.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(expected.len().min(got.len()));
    let lo = expected[..at]
        .char_indices()
        .rev()
        .nth(40)
        .map_or(0, |(i, _)| i);
    format!(
        "first difference at byte {at}\n  expected: {:?}\n  got:      {:?}",
        &expected[lo..],
        got.get(lo..).unwrap_or("")
    )
}

#[test]
fn renders_exactly_like_transformers() {
    let fixture = fixture();
    assert!(fixture.cases.len() >= 180, "fixture lost cases");
    let qwen3 = ChatTemplate::qwen3().expect("embedded Qwen3 template loads");
    let special: Vec<(String, String)> = fixture
        .special_tokens_map
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
        .collect();
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let custom;
        let template = match &case.chat_template {
            Some(source) => {
                custom =
                    ChatTemplate::new(source, special.clone()).expect("custom template compiles");
                &custom
            }
            None => &qwen3,
        };
        let want_format = match case.content_format.as_str() {
            "openai" => ContentFormat::OpenAi,
            _ => ContentFormat::String,
        };
        let detected = template.content_format(case.tools.is_some());
        if detected != Ok(want_format) {
            failures.push(format!("{}: content format {detected:?}", case.name));
        }
        let opts = RenderOptions {
            add_generation_prompt: case.add_generation_prompt,
            continue_final_message: case.continue_final_message,
            chat_template_kwargs: case.chat_template_kwargs.clone(),
        };
        let got = template.render(&case.messages, case.tools.as_deref(), &opts);
        match (&case.expected, got) {
            (Expected::Prompt(want), Ok(got)) if *want == got => {}
            (Expected::Prompt(want), Ok(got)) => {
                failures.push(format!("{}: {}", case.name, diff(want, &got)))
            }
            (Expected::Error { error }, Err(ChatError::Template(got))) if *error == got => {}
            (Expected::Prompt(_), Err(e)) => failures.push(format!("{}: error {e}", case.name)),
            (Expected::Error { error }, got) => failures.push(format!(
                "{}: expected template error {error:?}, got {got:?}",
                case.name
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        fixture.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen3_special_tokens_match_transformers() {
    let fixture = fixture();
    let qwen3 = ChatTemplate::qwen3().expect("loads");
    for (name, token) in &fixture.special_tokens_map {
        assert_eq!(qwen3.special_token(name), token.as_str(), "{name}");
    }
    assert_eq!(qwen3.special_token("bos_token"), None);
}
