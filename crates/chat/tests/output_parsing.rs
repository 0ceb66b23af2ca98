//! Whole-text parsing of Qwen3 output into reasoning / content / tool calls.

use agentd_chat::{
    parse_output, FunctionCall, OutputOptions, ParsedOutput, ReasoningMode, ToolCall, ToolCallIds,
};

fn parse(text: &str, reasoning: ReasoningMode, tool_calls: bool) -> ParsedOutput {
    let mut ids = ToolCallIds::sequential("t");
    parse_output(
        text,
        &OutputOptions {
            reasoning,
            tool_calls,
            ..OutputOptions::default()
        },
        &mut ids,
    )
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.to_string(),
        kind: "function".to_string(),
        function: FunctionCall {
            name: name.to_string(),
            arguments: arguments.to_string(),
        },
    }
}

const ON: ReasoningMode = ReasoningMode::Enabled;
const OFF: ReasoningMode = ReasoningMode::Disabled;

#[test]
fn reasoning_then_answer() {
    let out = parse("<think>\nLet me add.\n</think>\n\n2+2 = 4.", ON, true);
    assert_eq!(out.reasoning_content.as_deref(), Some("\nLet me add.\n"));
    assert_eq!(out.content.as_deref(), Some("\n\n2+2 = 4."));
    assert!(out.tool_calls.is_empty());
}

#[test]
fn think_opened_by_prompt() {
    let out = parse("still thinking</think>done", ON, false);
    assert_eq!(out.reasoning_content.as_deref(), Some("still thinking"));
    assert_eq!(out.content.as_deref(), Some("done"));
}

#[test]
fn truncated_while_thinking_is_all_reasoning() {
    let out = parse("<think>\nstep 1, step 2", ON, true);
    assert_eq!(out.reasoning_content.as_deref(), Some("\nstep 1, step 2"));
    assert_eq!(out.content, None);
}

#[test]
fn thinking_disabled_keeps_everything_as_content() {
    let out = parse("<think>x</think>y", OFF, false);
    assert_eq!(out.reasoning_content, None);
    assert_eq!(out.content.as_deref(), Some("<think>x</think>y"));
}

#[test]
fn empty_output_is_all_none() {
    assert_eq!(parse("", ON, true), ParsedOutput::default());
    assert_eq!(parse("<think></think>", ON, true), ParsedOutput::default());
}

#[test]
fn qwen3_tool_call_after_reasoning() {
    let text = "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
    let out = parse(text, ON, true);
    assert_eq!(
        out.reasoning_content.as_deref(),
        Some("\nI need the weather.\n")
    );
    // vLLM keeps the text before the first call verbatim, blank or not.
    assert_eq!(out.content.as_deref(), Some("\n\n"));
    assert_eq!(
        out.tool_calls,
        vec![call(
            "call_t0",
            "get_weather",
            r#"{"city": "Paris", "unit": "celsius"}"#
        )]
    );
}

#[test]
fn several_calls_separated_by_newlines() {
    let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2.5, true, null]}}\n</tool_call>\n";
    let out = parse(text, OFF, true);
    assert_eq!(out.content, None);
    assert_eq!(
        out.tool_calls,
        vec![
            call("call_t0", "a", "{}"),
            call("call_t1", "b", r#"{"x": [1, 2.5, true, null]}"#)
        ]
    );
}

#[test]
fn text_before_and_after_calls() {
    let text = "Let me check.\n<tool_call>{\"name\":\"f\",\"arguments\":{\"q\":\"é\\u00e9\"}}</tool_call>\nDone checking.";
    let out = parse(text, OFF, true);
    assert_eq!(
        out.content.as_deref(),
        Some("Let me check.\n\nDone checking.")
    );
    // Re-serialised like Python's json.dumps(ensure_ascii=False).
    assert_eq!(out.tool_calls, vec![call("call_t0", "f", r#"{"q": "éé"}"#)]);
}

#[test]
fn malformed_call_stays_in_content() {
    let bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>";
    let out = parse(bad, OFF, true);
    assert_eq!(out.content.as_deref(), Some(bad));
    assert!(out.tool_calls.is_empty());

    for body in [
        "{\"arguments\": {}}",              // no name
        "{\"name\": \"f\"}",                // no arguments
        "{\"name\": 3, \"arguments\": {}}", // name not a string
        "[1, 2]",                           // not an object
        "",
    ] {
        let text = format!("<tool_call>{body}</tool_call>");
        let out = parse(&text, OFF, true);
        assert_eq!(out.content.as_deref(), Some(text.as_str()), "{body}");
        assert!(out.tool_calls.is_empty(), "{body}");
    }
}

#[test]
fn malformed_call_between_good_ones() {
    let text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{oops}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>";
    let out = parse(text, OFF, true);
    assert_eq!(
        out.content.as_deref(),
        Some("<tool_call>{oops}</tool_call>\n")
    );
    assert_eq!(
        out.tool_calls,
        vec![call("call_t0", "a", "{}"), call("call_t1", "b", "{}")]
    );
}

#[test]
fn unterminated_call_at_end() {
    let out = parse(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1}}\n",
        OFF,
        true,
    );
    assert_eq!(out.content, None);
    assert_eq!(out.tool_calls, vec![call("call_t0", "f", r#"{"n": 1}"#)]);

    let cut = "<tool_call>\n{\"name\": \"f\", \"argu";
    let out = parse(cut, OFF, true);
    assert_eq!(out.content.as_deref(), Some(cut));
    assert!(out.tool_calls.is_empty());
}

#[test]
fn tool_calls_inside_reasoning_are_not_calls() {
    let text = "<think>maybe <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call></think>ok";
    let out = parse(text, ON, true);
    assert_eq!(
        out.reasoning_content.as_deref(),
        Some("maybe <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>")
    );
    assert_eq!(out.content.as_deref(), Some("ok"));
    assert!(out.tool_calls.is_empty());
}

#[test]
fn tool_parsing_off_leaves_tags() {
    let text = "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>";
    let out = parse(text, OFF, false);
    assert_eq!(out.content.as_deref(), Some(text));
}

#[test]
fn double_encoded_arguments_are_decoded() {
    let text = r#"<tool_call>{"name": "f", "arguments": "{\"city\":\"Paris\"}"}</tool_call>"#;
    let out = parse(text, OFF, true);
    assert_eq!(
        out.tool_calls,
        vec![call("call_t0", "f", r#"{"city": "Paris"}"#)]
    );
    // A string that is not JSON makes the call malformed (vLLM: content).
    let text = r#"<tool_call>{"name": "f", "arguments": "Paris"}</tool_call>"#;
    let out = parse(text, OFF, true);
    assert_eq!(out.content.as_deref(), Some(text));
}

#[test]
fn python_number_spelling_in_arguments() {
    let text = r#"<tool_call>{"name":"f","arguments":{"a":1.0,"b":1e20,"c":0.00001,"d":-0.0,"e":12345678901234567890}}</tool_call>"#;
    let out = parse(text, OFF, true);
    assert_eq!(
        out.tool_calls[0].function.arguments,
        r#"{"a": 1.0, "b": 1e+20, "c": 1e-05, "d": -0.0, "e": 12345678901234567890}"#
    );
}

#[test]
fn openai_json_shapes() {
    let out = parse(
        "<tool_call>{\"name\":\"f\",\"arguments\":{\"k\":\"v\"}}</tool_call>",
        OFF,
        true,
    );
    let json = serde_json::to_string(&out).expect("serialises");
    assert_eq!(
        json,
        r#"{"content":null,"tool_calls":[{"id":"call_t0","type":"function","function":{"name":"f","arguments":"{\"k\": \"v\"}"}}]}"#
    );
}
