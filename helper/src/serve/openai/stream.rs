//! Streaming responses (`stream: true`) of the OpenAI endpoints as server-sent events:
//! chunks as the generation sends them, and always a well-formed end while the client is
//! there: the last chunk (finish_reason, usage) then `data: [DONE]`, or, for anything that
//! stops the generation once the stream has begun (the model's files failing, a grammar
//! failing, the helper shutting down), an error event in OpenAI's shape then `data: [DONE]`.

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{as_tool_calls, structured, usage_json, ApiError, Event, Kind, Logprobs, Prepared};

/// The last event of every stream.
const DONE: &[u8] = b"data: [DONE]\n\n";

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Streams events as server-sent events. Dropping the body (client gone) drops the
/// receiver, which stops the generation.
pub(super) fn stream_response(kind: Kind, mut p: Prepared) -> Response {
    let mut rx = std::mem::replace(&mut p.rx, mpsc::channel(1).1);
    let first = matches!(kind, Kind::Chat).then(|| sse(&kind.chunk(&p, Some(""), true, None, Value::Null)));
    let stream = async_stream_of(move |out| async move {
        if let Some(b) = first {
            out.send(b).await?;
        }
        let mut lp = Logprobs { kind, offset: 0 };
        let echo = p.echo.take();
        // With tools the text is held until the end: it may turn out to be a call.
        let mut held = p.tools.then(String::new);
        // Echo without logprobs: the prompt's text first (with logprobs it comes with them).
        if let (Some((_, text)), false) = (&echo, p.logprobs) {
            out.send(sse(&kind.chunk(&p, Some(text), false, None, Value::Null))).await?;
        }
        while let Some(ev) = out.next(&mut rx).await {
            match ev {
                Event::Prompt(lps) => {
                    let (ids, text) = echo.as_ref().map(|(i, t)| (i.as_slice(), t.as_str())).unwrap_or_default();
                    let v = lp.prompt(&p, ids, &lps);
                    out.send(sse(&kind.chunk(&p, Some(text), false, None, v))).await?
                }
                Event::Text(t, lps) => {
                    let v = lp.generated(&p, &lps);
                    match held.as_mut() {
                        Some(h) => {
                            h.push_str(&t);
                            if !v.is_null() {
                                out.send(sse(&kind.chunk(&p, None, false, None, v))).await?
                            }
                        }
                        None => out.send(sse(&kind.chunk(&p, Some(&t), false, None, v))).await?,
                    }
                }
                Event::Done { finish_reason, prompt_tokens, cached_tokens, completion_tokens } => {
                    let mut finish_reason = finish_reason;
                    if let Some(text) = held.take() {
                        let mut c = kind.chunk(&p, Some(&text), false, None, Value::Null);
                        if let Some(mut calls) = as_tool_calls(&p, &text, finish_reason) {
                            calls[0]["index"] = json!(0);
                            c["choices"][0]["delta"] = json!({"tool_calls": calls});
                            finish_reason = "tool_calls";
                        }
                        out.send(sse(&c)).await?;
                    }
                    out.send(sse(&kind.chunk(&p, None, false, Some(finish_reason), Value::Null))).await?;
                    if p.include_usage {
                        let mut u = kind.chunk(&p, None, false, None, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage_json(prompt_tokens, cached_tokens, completion_tokens);
                        out.send(sse(&u)).await?;
                    }
                    out.send(Bytes::from_static(DONE)).await?;
                    return Some(());
                }
                // An error ends the stream cleanly too: the text sent so far, the error, then
                // [DONE] (a client's SSE parser then sees a complete stream).
                Event::Error(msg) => {
                    return out.fail(ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, msg)).await;
                }
                Event::Grammar(msg) => {
                    return out.fail(structured::failed_while_generating(msg, p.grammar_param)).await
                }
            }
        }
        // No last event: the generation stopped before it began or ended (the helper shut
        // down while it waited for the model, or the engine panicked). A client still
        // there is told so, and its stream ends as every other.
        if out.gone() {
            return Some(());
        }
        out.fail(ApiError::server(StatusCode::SERVICE_UNAVAILABLE, "the generation stopped before it finished")).await
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(stream)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A body fed by an async producer through a small channel; the producer's sends fail
/// (and it stops) once the body is dropped.
pub(in crate::serve) fn async_stream_of<F, Fut>(produce: F) -> Body
where
    F: FnOnce(Sink) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<()>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let _ = produce(Sink(tx)).await;
    });
    let stream =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx)) },
        );
    Body::from_stream(stream)
}

/// The producer side of [`async_stream_of`]; `send` is None once the client is gone.
pub(in crate::serve) struct Sink(mpsc::Sender<Bytes>);

impl Sink {
    pub(in crate::serve) async fn send(&self, b: Bytes) -> Option<()> {
        self.0.send(b).await.ok()
    }

    /// Whether the client is gone (the body dropped).
    pub(in crate::serve) fn gone(&self) -> bool {
        self.0.is_closed()
    }

    /// Ends the stream with `e` as an error event, then `data: [DONE]`.
    async fn fail(&self, e: ApiError) -> Option<()> {
        self.send(sse(&e.body())).await?;
        self.send(Bytes::from_static(DONE)).await
    }

    /// The next event of `rx`, or None as soon as the client is gone (the body dropped),
    /// even while no event comes: dropping `rx` then takes a generation that still waits
    /// for the model out of the queue, and stops a running one at its next token.
    pub(in crate::serve) async fn next<T>(&self, rx: &mut mpsc::Receiver<T>) -> Option<T> {
        tokio::select! {
            ev = rx.recv() => ev,
            _ = self.0.closed() => None,
        }
    }
}
