//! Structured output on the OpenAI endpoints, all through the engine's one constraint
//! ([`colibri_engine::generate::grammar`]): `response_format` (`json_object`,
//! `json_schema` with `strict`), llama.cpp's `grammar` extension (GBNF or Lark), and
//! function calling (`tools` / `tool_choice`): the model writes one call as
//! `{"name": ..., "arguments": {...}}` under a JSON Schema built from the tools, and the
//! response carries it as OpenAI's `tool_calls`.
//!
//! Grammars are checked against the engine's limits
//! ([`colibri_engine::generate::grammar::limits`]) before the model is even loaded, then
//! compiled on a thread of their own with a large stack, a few at a time
//! ([`compile`]), never on an async worker.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use colibri_engine::generate::{CompileCancel, Constraint, Grammar};
use colibri_engine::tokenizer::{ChatMessage, Tokenizer};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::api_error::ApiError;

/// Stack of a grammar-compiling thread: 16 times what the largest grammar within the limits
/// took in a debug build (a `$ref` chain at the depth limit, or an object with the most
/// properties: under 1 MiB each; docs/api.md, "Limits").
const COMPILE_STACK: usize = 16 << 20;

/// Grammars compiled at once; more wait their turn (a client that leaves while waiting
/// leaves the queue: its request future, which waits, is dropped). A compilation whose
/// client left, or that ran past [`super::Limits::grammar_compile_timeout`], is cancelled
/// ([`CompileCancel`]): llguidance's parser construction runs to its end (the limits bound
/// it), its first mask is skipped or stopped, and the place is freed.
static COMPILING: Semaphore = Semaphore::const_new(2);

/// Cancels a compilation when dropped, unless it finished.
struct CancelOnDrop(Option<CompileCancel>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.cancel();
        }
    }
}

/// A 400 naming `param` when `grammar` is past the engine's compile limits.
pub fn check(grammar: &Grammar, param: &'static str) -> Result<(), ApiError> {
    grammar.check_limits().map_err(|e| bad(format!("{param}: {e}"), param))
}

/// Compiles `grammar` for the model's tokenizer on a thread with a [`COMPILE_STACK`] stack;
/// a 400 naming `param` when it is refused or takes longer than `timeout`.
pub async fn compile(
    loaded: Arc<crate::load::Loaded>,
    grammar: Grammar,
    param: &'static str,
    timeout: Duration,
) -> Result<Constraint, ApiError> {
    check(&grammar, param)?;
    let failed = || ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, "the grammar could not be compiled");
    let permit = COMPILING.acquire().await.map_err(|_| failed())?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let cancel = CompileCancel::default();
    // Dropped with this future: when the client leaves, or at the timeout below.
    let mut on_drop = CancelOnDrop(Some(cancel.clone()));
    std::thread::Builder::new()
        .name("coli-grammar".into())
        .stack_size(COMPILE_STACK)
        .spawn(move || {
            let tok = loaded.tokenizer.as_ref().ok_or_else(|| "this model has no tokenizer".to_string());
            let r = tok
                .and_then(|tok| Constraint::new_cancellable(tok, &grammar, Some(&cancel)).map_err(|e| e.to_string()));
            drop(permit);
            let _ = tx.send(r);
        })
        .map_err(|_| failed())?;
    let Ok(r) = tokio::time::timeout(timeout, rx).await else {
        return Err(bad(
            format!(
                "{param}: compiling the grammar took longer than the limit of {} s; simplify it",
                timeout.as_secs_f64()
            ),
            param,
        ));
    };
    on_drop.0 = None;
    r.map_err(|_| failed())?.map_err(|e| bad(e, param))
}

/// The error of a grammar that failed while the output was generated (a parser limit of
/// llguidance reached mid-way, nothing left to allow): a 400 `invalid_request_error`
/// naming the parameter the grammar came from. 400, not 500: the request's grammar is
/// at fault and retrying it fails the same way, which is what OpenAI clients take a 400
/// to mean (openai-python's BadRequestError; 5xx are retried); it is also the answer the
/// same grammar gets when the failure shows while it is compiled. Not 422: OpenAI
/// answers invalid schemas with 400, and some clients treat 422 as a validation error of
/// the request's shape.
pub fn failed_while_generating(msg: String, param: Option<&'static str>) -> ApiError {
    ApiError::invalid(msg, param).with_code("grammar_failed")
}

fn bad(msg: impl Into<String>, param: &'static str) -> ApiError {
    ApiError::invalid(msg, Some(param))
}

/// Function calling, as decided from `tools` and `tool_choice`.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The tools as given (for the chat template).
    pub list: Value,
    /// `required` or a named function: the answer is a call. `auto`: text or a call.
    pub must_call: bool,
    /// What the output must match.
    pub grammar: Grammar,
}

/// The schema of one call to `function` (`{name, description, parameters}`).
fn call_schema(f: &Value) -> Value {
    let name = f.get("name").cloned().unwrap_or(Value::Null);
    let params = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": false
    })
}

/// `tools` and `tool_choice` (`none`, `auto` (the default), `required`, or
/// `{"type": "function", "function": {"name"}}`); None when no call can come out.
pub fn tools(tools: Option<&Value>, choice: Option<&Value>) -> Result<Option<Tools>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("tools must be a list", "tools")),
    };
    let mut functions = Vec::with_capacity(list.len());
    for t in list {
        let f = t.get("function").filter(|_| t.get("type").and_then(Value::as_str) == Some("function"));
        let f = f.ok_or_else(|| bad("each tool must be {\"type\": \"function\", \"function\": {...}}", "tools"))?;
        let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| bad("each function needs a name", "tools"))?;
        if let Some(p) = f.get("parameters").filter(|p| !p.is_object()) {
            return Err(bad(
                format!("the parameters of function {name} must be a JSON Schema object, got {p}"),
                "tools",
            ));
        }
        functions.push((name.to_string(), f));
    }
    let (must_call, only) = match choice {
        None | Some(Value::Null) => (false, None),
        Some(Value::String(s)) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => (false, None),
            "required" => (true, None),
            _ => return Err(bad("tool_choice must be none, auto, required or a function", "tool_choice")),
        },
        Some(v) => {
            let name = v.pointer("/function/name").and_then(Value::as_str).ok_or_else(|| {
                bad(
                    "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\"}}",
                    "tool_choice",
                )
            })?;
            if !functions.iter().any(|(n, _)| n == name) {
                return Err(bad(format!("tool_choice names function {name}, which is not in tools"), "tool_choice"));
            }
            (true, Some(name.to_string()))
        }
    };
    let calls: Vec<Value> =
        functions.iter().filter(|(n, _)| only.as_ref().is_none_or(|o| o == n)).map(|(_, f)| call_schema(f)).collect();
    let call = colibri_engine::generate::grammar::with_json_style(json!({"anyOf": calls}), false);
    let grammar = if must_call {
        Grammar::json_schema(call)
    } else {
        // Text that does not start with `{`, or a call.
        Grammar::Lark(format!("start: TEXT | call\nTEXT: /[^{{](?s:.)*/\ncall: %json {call}\n"))
    };
    Ok(Some(Tools { list: Value::Array(list.clone()), must_call, grammar }))
}

/// An assistant message's earlier `tool_calls` as the text the model wrote for them.
pub fn calls_as_text(tool_calls: &Value) -> String {
    let calls = tool_calls.as_array().map(Vec::as_slice).unwrap_or_default();
    let text: Vec<String> = calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            // Arguments arrive as a JSON string (OpenAI) or an object.
            let args = match &f["arguments"] {
                Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                v => v.clone(),
            };
            json!({"name": f["name"], "arguments": args}).to_string()
        })
        .collect();
    text.join("\n")
}

/// The chat prompt with the tools: in the template's `tools` variable; where the template
/// does not use it, described in the system message (one is added if there is none).
pub fn chat_prompt(tok: &Tokenizer, turns: &[ChatMessage], tools: &Tools) -> colibri_engine::Result<String> {
    let with = tok.apply_chat_template_with_tools(turns, &tools.list, true)?;
    if with != tok.apply_chat_template(turns, true)? {
        return Ok(with);
    }
    let described: Vec<String> =
        tools.list.as_array().into_iter().flatten().map(|t| t["function"].to_string()).collect();
    let how = if tools.must_call { "Answer with a call" } else { "To call one, answer with only the call" };
    let note = format!(
        "You can call these functions:\n{}\n{how}: a JSON object {{\"name\": <function name>, \"arguments\": <its arguments>}}.",
        described.join("\n")
    );
    let mut turns = turns.to_vec();
    match turns.first_mut() {
        Some(m) if m.role == "system" => m.content = format!("{}\n\n{note}", m.content),
        _ => turns.insert(0, ChatMessage::new("system", note)),
    }
    tok.apply_chat_template(&turns, true)
}

/// The output as OpenAI's `tool_calls` when it is a call (`id` names it).
pub fn tool_calls(text: &str, id: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(text).ok()?;
    let name = v.get("name")?.as_str()?;
    let args = v.get("arguments")?;
    Some(json!([{"id": format!("call_{id}"), "type": "function",
                 "function": {"name": name, "arguments": args.to_string()}}]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `response_format` as the endpoints read it: through the engine's request check.
    fn response_format(v: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
        let mut body = json!({});
        if let Some(v) = v {
            body["response_format"] = v.clone();
        }
        let turn = colibri_engine::generate::TurnRequest::from_value(&body)?.check(None, false)?;
        Ok(turn.grammar.map(|g| g.0))
    }

    #[test]
    fn response_formats() {
        assert!(response_format(None).unwrap().is_none());
        assert!(response_format(Some(&json!({"type": "text"}))).unwrap().is_none());
        assert_eq!(response_format(Some(&json!({"type": "json_object"}))).unwrap(), Some(Grammar::JsonObject));
        let s = json!({"type": "object"});
        let g = response_format(Some(
            &json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}),
        ));
        assert_eq!(g.unwrap(), Some(Grammar::JsonSchema { schema: s.clone(), lenient: false }));
        let g = response_format(Some(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}})));
        assert_eq!(g.unwrap(), Some(Grammar::JsonSchema { schema: s, lenient: true }));
        for bad in [json!({"type": "xml"}), json!({"type": "json_schema"}), json!({}), json!("json")] {
            let e = response_format(Some(&bad)).unwrap_err();
            assert_eq!(e.param, Some("response_format"), "{bad}");
        }
    }

    #[test]
    fn tool_choices_and_calls() {
        let t = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
        assert!(tools(Some(&t), Some(&json!("none"))).unwrap().is_none());
        assert!(!tools(Some(&t), None).unwrap().unwrap().must_call);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let spec = tools(Some(&t), Some(&named)).unwrap().unwrap();
        assert!(spec.must_call && matches!(spec.grammar, Grammar::JsonSchema { .. }));
        let other = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(tools(Some(&t), Some(&other)).unwrap_err().param, Some("tool_choice"));
        assert_eq!(tools(Some(&json!([{"type": "function"}])), None).unwrap_err().param, Some("tools"));
        let calls = tool_calls(r#"{"name": "get_weather", "arguments": {"city": "Oslo"}}"#, "1").unwrap();
        assert_eq!(calls[0]["function"]["arguments"], r#"{"city":"Oslo"}"#);
        assert!(tool_calls("It is sunny.", "1").is_none());
        let back: Value = serde_json::from_str(&calls_as_text(&calls)).unwrap();
        assert_eq!(back, json!({"name": "get_weather", "arguments": {"city": "Oslo"}}));
    }
}
