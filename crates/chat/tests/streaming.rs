//! The streaming parser against the whole-text parser: same message for any
//! chunking, partial tags never leak, tool calls come id/name first.

use agentd_chat::{
    parse_output, ChatDelta, DeltaAccumulator, FunctionDelta, OutputOptions, ParsedOutput,
    ReasoningMode, StreamParser, ToolCallDelta, ToolCallIds,
};
use proptest::prelude::*;

fn opts(reasoning: ReasoningMode, tool_calls: bool) -> OutputOptions {
    OutputOptions {
        reasoning,
        tool_calls,
        ..OutputOptions::default()
    }
}

fn whole(text: &str, o: OutputOptions) -> ParsedOutput {
    parse_output(text, &o, &mut ToolCallIds::sequential("t"))
}

/// Streams `chunks` and returns every delta plus the reassembled message.
fn stream(chunks: &[&str], o: OutputOptions) -> (Vec<ChatDelta>, ParsedOutput) {
    let mut parser = StreamParser::new(o, ToolCallIds::sequential("t"));
    let mut deltas = Vec::new();
    for chunk in chunks {
        deltas.extend(parser.push(chunk));
    }
    deltas.extend(parser.finish());
    let mut acc = DeltaAccumulator::default();
    for d in &deltas {
        acc.add(d);
    }
    (deltas, acc.finish())
}

fn content_of(deltas: &[ChatDelta]) -> Vec<&str> {
    deltas.iter().filter_map(|d| d.content.as_deref()).collect()
}

#[test]
fn partial_tool_tag_is_held_back() {
    let o = opts(ReasoningMode::Disabled, true);
    let mut p = StreamParser::new(o.clone(), ToolCallIds::sequential("t"));
    let first = p.push("Checking <tool_");
    assert_eq!(content_of(&first), vec!["Checking "]);
    let second = p.push("call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
    assert_eq!(
        second,
        vec![
            ChatDelta {
                tool_calls: vec![ToolCallDelta {
                    index: 0,
                    id: Some("call_t0".into()),
                    kind: Some("function".into()),
                    function: FunctionDelta {
                        name: Some("f".into()),
                        arguments: Some(String::new()),
                    },
                }],
                ..ChatDelta::default()
            },
            ChatDelta {
                tool_calls: vec![ToolCallDelta {
                    index: 0,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: Some(r#"{"a": 1}"#.into()),
                    },
                }],
                ..ChatDelta::default()
            },
        ]
    );
    assert!(p.finish().is_empty());
}

#[test]
fn lookalike_tag_is_released_as_content() {
    let o = opts(ReasoningMode::Disabled, true);
    let mut p = StreamParser::new(o.clone(), ToolCallIds::sequential("t"));
    assert!(p
        .push("a <tool")
        .iter()
        .all(|d| d.content.as_deref() == Some("a ")));
    assert_eq!(content_of(&p.push("box>")), vec!["<toolbox>"]);
    // A dangling prefix at the very end is text.
    assert!(p.push("<").is_empty());
    assert_eq!(content_of(&p.finish()), vec!["<"]);
}

#[test]
fn think_tags_split_across_chunks() {
    let o = opts(ReasoningMode::Enabled, true);
    let (deltas, msg) = stream(&["<thi", "nk>\nplan", "</th", "ink>\n\nanswer"], o);
    assert_eq!(msg.reasoning_content.as_deref(), Some("\nplan"));
    assert_eq!(msg.content.as_deref(), Some("\n\nanswer"));
    for d in &deltas {
        for text in [&d.reasoning_content, &d.content].into_iter().flatten() {
            assert!(!text.contains('<'), "tag leaked in {d:?}");
        }
    }
}

#[test]
fn reasoning_streams_before_it_closes() {
    let o = opts(ReasoningMode::Enabled, false);
    let mut p = StreamParser::new(o.clone(), ToolCallIds::sequential("t"));
    assert!(p.push("<think>").is_empty());
    let d = p.push("first thought </");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].reasoning_content.as_deref(), Some("first thought "));
}

#[test]
fn character_by_character_matches_whole() {
    let text = "<think>\nweather? 東京\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>";
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chunks: Vec<&str> = chars.iter().map(String::as_str).collect();
    for o in [
        opts(ReasoningMode::Enabled, true),
        opts(ReasoningMode::Enabled, false),
        opts(ReasoningMode::Disabled, true),
        opts(ReasoningMode::Disabled, false),
    ] {
        let (deltas, msg) = stream(&chunks, o.clone());
        assert_eq!(msg, whole(text, o.clone()), "{o:?}");
        assert!(deltas.iter().all(
            |d| d.content.as_deref() != Some("") && d.reasoning_content.as_deref() != Some("")
        ));
    }
}

/// Pieces that exercise every state: tags, their prefixes, blank runs,
/// valid / malformed calls, non-ASCII text.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("<tool_call>".to_string()),
        Just("</tool_call>".to_string()),
        Just("<tool_".to_string()),
        Just("</thi".to_string()),
        Just("<".to_string()),
        Just("\n".to_string()),
        Just("  \n".to_string()),
        Just("{\"name\": \"f\", \"arguments\": {\"x\": 1.5, \"s\": \"é\"}}".to_string()),
        Just("\n{\"name\":\"g\",\"arguments\":{}}\n".to_string()),
        Just("{\"name\": broken".to_string()),
        Just("<tool_call>{\"name\": \"h\", \"arguments\": [1]}</tool_call>".to_string()),
        "[a-z ]{1,8}",
        "[é東🌍 ]{1,4}",
    ]
}

fn output() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..14).prop_map(|p| p.concat())
}

/// Splits `text` at the given fractions (on character boundaries).
fn chunk_at(text: &str, cuts: &[f64]) -> Vec<String> {
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
    let mut points: Vec<usize> = cuts
        .iter()
        .filter_map(|f| bounds.get((f * bounds.len() as f64) as usize).copied())
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut chunks = Vec::new();
    let mut last = 0;
    for p in points {
        chunks.push(text[last..p].to_string());
        last = p;
    }
    chunks.push(text[last..].to_string());
    chunks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_chunking_reassembles_to_the_whole_parse(
        text in output(),
        cuts in prop::collection::vec(0.0f64..1.0, 0..20),
        thinking in any::<bool>(),
        tool_calls in any::<bool>(),
    ) {
        let reasoning = if thinking { ReasoningMode::Enabled } else { ReasoningMode::Disabled };
        let o = opts(reasoning, tool_calls);
        let chunks = chunk_at(&text, &cuts);
        let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
        let (deltas, msg) = stream(&refs, o.clone());
        prop_assert_eq!(msg, whole(&text, o));
        for d in &deltas {
            prop_assert!(d.content.as_deref() != Some(""));
            prop_assert!(d.reasoning_content.as_deref() != Some(""));
            // A call's first piece names it; later pieces only add arguments.
            for piece in &d.tool_calls {
                prop_assert_eq!(piece.id.is_some(), piece.function.name.is_some());
            }
        }
    }
}

#[test]
fn large_tool_call_in_tiny_deltas_is_linear() {
    // ~200 KB of arguments fed 3 bytes at a time: quadratic rescanning would
    // take tens of seconds here; the incremental search takes milliseconds.
    let payload = "x".repeat(200_000);
    let text = format!(
        "<tool_call>{{\"name\": \"write_file\", \"arguments\": {{\"content\": \"{payload}\"}}}}</tool_call>"
    );
    let o = opts(ReasoningMode::Disabled, true);
    let mut p = StreamParser::new(o.clone(), ToolCallIds::sequential("t"));
    let start = std::time::Instant::now();
    let mut deltas = Vec::new();
    let bytes = text.as_bytes();
    for chunk in bytes.chunks(3) {
        deltas.extend(p.push(std::str::from_utf8(chunk).expect("ascii")));
    }
    deltas.extend(p.finish());
    assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
    let mut acc = DeltaAccumulator::default();
    deltas.iter().for_each(|d| acc.add(d));
    assert_eq!(acc.finish(), whole(&text, o));
}
