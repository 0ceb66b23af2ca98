//! Output parsing against `tests/fixtures/chat/qwen3_output_golden.json`:
//! expected values computed in Python by a restatement of vLLM's qwen3
//! reasoning + hermes tool parsers (so `arguments` strings are Python's own
//! `json.dumps`). Checked for the whole-text parser and for the streaming
//! parser fed in small uneven chunks.

use agentd_chat::{
    parse_output, DeltaAccumulator, OutputOptions, ParsedOutput, ReasoningMode, StreamParser,
    ToolCallIds,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    output: String,
    enable_thinking: bool,
    reasoning_content: Option<String>,
    content: Option<String>,
    tool_calls: Vec<Call>,
}

#[derive(Deserialize, Debug, PartialEq)]
struct Call {
    name: String,
    arguments: String,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/chat/qwen3_output_golden.json"
    );
    let text = std::fs::read_to_string(path).expect("output golden fixture is committed");
    serde_json::from_str(&text).expect("fixture parses")
}

fn check(case: &Case, got: &ParsedOutput, how: &str) -> Option<String> {
    let calls: Vec<Call> = got
        .tool_calls
        .iter()
        .map(|c| Call {
            name: c.function.name.clone(),
            arguments: c.function.arguments.clone(),
        })
        .collect();
    let ok = got.reasoning_content == case.reasoning_content
        && got.content == case.content
        && calls == case.tool_calls;
    (!ok).then(|| {
        format!(
            "{} ({how}): output {:?}\n  want reasoning={:?} content={:?} calls={:?}\n  got  reasoning={:?} content={:?} calls={:?}",
            case.name,
            case.output,
            case.reasoning_content,
            case.content,
            case.tool_calls,
            got.reasoning_content,
            got.content,
            calls
        )
    })
}

/// Splits on character boundaries into chunks of 1..=7 characters, varying
/// with the position so tags land across boundaries in many ways.
fn uneven_chunks(text: &str) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut n = 0;
    let mut chars = text.char_indices().peekable();
    while chars.peek().is_some() {
        let want = 1 + (n * 5 + 3) % 7;
        n += 1;
        let mut end = start;
        for _ in 0..want {
            match chars.next() {
                Some((i, c)) => end = i + c.len_utf8(),
                None => break,
            }
        }
        chunks.push(&text[start..end]);
        start = end;
    }
    chunks
}

#[test]
fn parses_like_vllm() {
    let fixture = fixture();
    assert!(fixture.cases.len() >= 200, "fixture lost cases");
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let opts = OutputOptions {
            reasoning: ReasoningMode::from_enable_thinking(Some(case.enable_thinking)),
            tool_calls: true,
            ..OutputOptions::default()
        };
        let whole = parse_output(&case.output, &opts, &mut ToolCallIds::sequential("g"));
        failures.extend(check(case, &whole, "whole"));

        let mut parser = StreamParser::new(opts, ToolCallIds::sequential("g"));
        let mut acc = DeltaAccumulator::default();
        for chunk in uneven_chunks(&case.output) {
            parser.push(chunk).iter().for_each(|d| acc.add(d));
        }
        parser.finish().iter().for_each(|d| acc.add(d));
        failures.extend(check(case, &acc.finish(), "stream"));
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
