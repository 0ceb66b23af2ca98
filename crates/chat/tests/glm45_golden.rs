//! GLM-4.5 output parsing against `tests/fixtures/chat/glm45_output_golden.json`:
//! what vLLM 0.32's own `glm45` parsers (`Glm47MoeParser`) returned for each
//! output (`scripts/glm45_output_golden.py`). Checked for the whole-text
//! parser and for the stream fed in 1-byte, 3-byte, tag-splitting and
//! uneven chunks. Streaming sends content's leading whitespace as it comes
//! (as vLLM's streaming does), so when calls were kept the stream's content
//! is compared with its leading whitespace trimmed.

use agentd_chat::{
    parse_output, DeltaAccumulator, OutputFormat, OutputOptions, ParsedOutput, ReasoningMode,
    StreamParser, ToolCallIds, ToolSchemas,
};
use serde::Deserialize;
use serde_json::Value as Json;

#[derive(Deserialize)]
struct Fixture {
    tools: Vec<Json>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    output: String,
    enable_thinking: bool,
    tools: bool,
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
        "/../../tests/fixtures/chat/glm45_output_golden.json"
    );
    let text = std::fs::read_to_string(path).expect("glm45 golden fixture is committed");
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
    let mut content = got.content.clone();
    if how != "whole" && !calls.is_empty() {
        content = content
            .map(|c| c.trim_start().to_string())
            .filter(|c| !c.is_empty());
    }
    let ok = got.reasoning_content == case.reasoning_content
        && content == case.content
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

/// Chunkings of `text` on char boundaries: every `n` chars, and cuts in the
/// middle of every tag.
fn chunkings(text: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = text.chars().collect();
    let every = |n: usize| -> Vec<String> { chars.chunks(n).map(|c| c.iter().collect()).collect() };
    let mut mid_tags = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices('<') {
        let cut = i + 3;
        if cut > start && cut < text.len() && text.is_char_boundary(cut) {
            mid_tags.push(text[start..cut].to_string());
            start = cut;
        }
    }
    mid_tags.push(text[start..].to_string());
    let uneven = {
        let mut out = Vec::new();
        let (mut i, mut n) = (0, 1);
        while i < chars.len() {
            let end = (i + n).min(chars.len());
            out.push(chars[i..end].iter().collect());
            i = end;
            n = n % 7 + 2;
        }
        out
    };
    vec![every(1), every(3), mid_tags, uneven]
}

#[test]
fn glm45_output_matches_vllm() {
    let fixture = fixture();
    assert!(fixture.cases.len() >= 400, "fixture lost cases");
    assert!(
        fixture
            .cases
            .iter()
            .filter(|c| !c.tool_calls.is_empty())
            .count()
            >= 100,
        "fixture lost its tool calls"
    );
    let tools = ToolSchemas::from_tools(&fixture.tools);
    let format = OutputFormat::resolve("glm4_moe", None, None).expect("family default");
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let opts = OutputOptions {
            reasoning: ReasoningMode::from_enable_thinking(Some(case.enable_thinking)),
            tool_calls: case.tools,
            format,
            tools: tools.clone(),
        };
        let whole = parse_output(&case.output, &opts, &mut ToolCallIds::sequential("g"));
        failures.extend(check(case, &whole, "whole"));
        for (k, chunks) in chunkings(&case.output).into_iter().enumerate() {
            let mut parser = StreamParser::new(opts.clone(), ToolCallIds::sequential("g"));
            let mut acc = DeltaAccumulator::default();
            for chunk in &chunks {
                parser.push(chunk).iter().for_each(|d| acc.add(d));
            }
            parser.finish().iter().for_each(|d| acc.add(d));
            failures.extend(check(case, &acc.finish(), &format!("stream {k}")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
