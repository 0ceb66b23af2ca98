//! A minimal OpenAI client for the benchmark: one model call per turn
//! (`/v1/completions` with token ids, or `/v1/chat/completions`), whole or
//! streamed, with a deadline on every request; `/programs/release`;
//! `/metrics`.
//!
//! Token mode needs the generated ids back to build the next prompt
//! exactly: the request sets `return_token_ids: true`, which vLLM (≥ 0.10.2)
//! and agentd both honour (`choices[0].token_ids`, per chunk when
//! streaming). A server that ignores it is reported as an error rather than
//! silently measured on a prompt it never cached.
//!
//! An NVIDIA Dynamo frontend refuses `return_token_ids`; for such a target
//! ([`Client::dynamo`]) the request asks `nvext.extra_fields:
//! ["engine_data", "worker_id"]` instead: the final chunk's
//! `nvext.engine_data.completion_token_ids` are the generated ids (what
//! Dynamo's own workers return to RL clients), and `nvext.worker_id` names
//! the worker that served the step. The program travels as Dynamo's session
//! headers (`x-dynamo-session-id`, `x-dynamo-session-final`), not in the body.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::prom::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {url}: {msg}")]
    Connect { url: String, msg: String },
    #[error("{url}: no complete answer within {secs:.0} s")]
    Timeout { url: String, secs: f64 },
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: {msg}")]
    Protocol { url: String, msg: String },
}

/// How a turn is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `/v1/completions` with a token-id prompt: exact counts.
    Tokens,
    /// `/v1/chat/completions` with messages whose words stand for tokens.
    Chat,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tokens" | "completions" => Ok(Mode::Tokens),
            "chat" => Ok(Mode::Chat),
            o => Err(format!("mode {o:?}: expected tokens or chat")),
        }
    }
}

/// How a program's end reaches a Dynamo frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionFinal {
    /// `x-dynamo-session-final: true` on the program's last model call: the
    /// KV router forwards it and the worker (agentd) releases the program
    /// after that call.
    LastTurn,
    /// A separate one-token request with the final header after the last
    /// call: `dynamo.thunderagent_router` answers it itself (it never
    /// forwards a final request) and drops the program from its table.
    Terminal,
    /// No final flag (programs end by the servers' leases).
    Never,
}

impl std::str::FromStr for SessionFinal {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "last-turn" => Ok(SessionFinal::LastTurn),
            "terminal" => Ok(SessionFinal::Terminal),
            "none" => Ok(SessionFinal::Never),
            o => Err(format!(
                "session final {o:?}: expected last-turn, terminal or none"
            )),
        }
    }
}

/// One model call's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepReply {
    /// Generated ids (token mode).
    pub token_ids: Vec<u32>,
    /// Generated text (chat mode).
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// `usage.prompt_tokens_details.cached_tokens`, when the server sends it.
    pub cached_tokens: Option<usize>,
    /// Time to the first generated token, when streaming.
    pub ttft_s: Option<f64>,
    /// The Dynamo worker that served it (`nvext.worker_id.decode_worker_id`).
    pub worker: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub model: String,
    pub stream: bool,
    pub(crate) timeout: Duration,
    /// The target is a Dynamo frontend: session headers, `nvext` token ids,
    /// and how programs end.
    pub dynamo: Option<SessionFinal>,
}

/// What the body of a turn carries.
pub enum Prompt<'a> {
    Tokens(&'a [u32]),
    Chat(&'a [Value]),
}

impl Client {
    pub fn new(base: &str, timeout: Duration, stream: bool) -> Result<Client, ClientError> {
        let base = base.trim_end_matches('/').to_string();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5).min(timeout))
            .timeout(timeout)
            .pool_max_idle_per_host(256)
            .build()
            .map_err(|e| ClientError::Connect {
                url: base.clone(),
                msg: e.to_string(),
            })?;
        Ok(Client {
            http,
            base,
            model: String::new(),
            stream,
            timeout,
            dynamo: None,
        })
    }

    pub(crate) fn err(&self, url: &str, e: reqwest::Error) -> ClientError {
        if e.is_timeout() {
            ClientError::Timeout {
                url: url.to_string(),
                secs: self.timeout.as_secs_f64(),
            }
        } else if e.is_connect() {
            ClientError::Connect {
                url: url.to_string(),
                msg: error_chain(&e),
            }
        } else {
            ClientError::Protocol {
                url: url.to_string(),
                msg: error_chain(&e),
            }
        }
    }

    async fn get_text(&self, path: &str, timeout: Duration) -> Result<String, ClientError> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .http
            .get(&url)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| self.err(&url, e))?;
        let status = resp.status().as_u16();
        let body = resp.text().await.map_err(|e| self.err(&url, e))?;
        if status != 200 {
            return Err(ClientError::Status {
                url,
                status,
                body: truncate(&body),
            });
        }
        Ok(body)
    }

    /// The served model ids (`GET /v1/models`).
    pub async fn models(&self) -> Result<Vec<String>, ClientError> {
        let url = format!("{}/v1/models", self.base);
        let body = self
            .get_text("/v1/models", Duration::from_secs(10).min(self.timeout))
            .await?;
        let v: Value = serde_json::from_str(&body).map_err(|e| ClientError::Protocol {
            url: url.clone(),
            msg: format!("bad JSON: {e}"),
        })?;
        let ids: Vec<String> = v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if ids.is_empty() {
            return Err(ClientError::Protocol {
                url,
                msg: "no model listed".into(),
            });
        }
        Ok(ids)
    }

    /// Sends `model` in requests, or, when `None`, the first model the
    /// server lists.
    pub async fn use_model(&mut self, model: Option<&String>) -> Result<(), ClientError> {
        self.model = match model {
            Some(m) => m.clone(),
            None => self.models().await?.into_iter().next().unwrap_or_default(),
        };
        Ok(())
    }

    /// The server's counters; `None` when `/metrics` is missing or fails.
    pub async fn metrics(&self) -> Option<Metrics> {
        match self.get_text("/metrics", Duration::from_secs(10)).await {
            Ok(t) => Some(Metrics::parse(&t)),
            Err(e) => {
                tracing::debug!(error = %e, "no metrics");
                None
            }
        }
    }

    /// `POST /programs/release`; any failure (vLLM has no such route) is
    /// ignored.
    pub async fn release(&self, program_id: &str) {
        let url = format!("{}/programs/release", self.base);
        let r = self
            .http
            .post(&url)
            .timeout(Duration::from_secs(5).min(self.timeout))
            .header("content-type", "application/json")
            .body(json!({ "program_id": program_id }).to_string())
            .send()
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, program_id, "release failed");
        }
    }

    /// One model call generating exactly `max_tokens` tokens; `last` marks
    /// the program's last call.
    pub async fn step(
        &self,
        program_id: &str,
        prompt: Prompt<'_>,
        max_tokens: usize,
        last: bool,
    ) -> Result<StepReply, ClientError> {
        self.step_with(program_id, prompt, max_tokens, last, &[])
            .await
    }

    /// [`Client::step`] with `extra` body fields set last (they override
    /// the defaults, e.g. `temperature`; the rollout adds `group_id`).
    pub async fn step_with(
        &self,
        program_id: &str,
        prompt: Prompt<'_>,
        max_tokens: usize,
        last: bool,
        extra: &[(&str, Value)],
    ) -> Result<StepReply, ClientError> {
        let tokens = matches!(prompt, Prompt::Tokens(_));
        let (path, mut body) = match prompt {
            Prompt::Tokens(ids) => ("/v1/completions", json!({ "prompt": ids })),
            Prompt::Chat(messages) => (
                "/v1/chat/completions",
                json!({"messages": messages,
                       "chat_template_kwargs": {"enable_thinking": false}}),
            ),
        };
        if let Some(b) = body.as_object_mut() {
            b.insert("model".into(), json!(self.model));
            b.insert("max_tokens".into(), json!(max_tokens));
            b.insert("ignore_eos".into(), json!(true));
            b.insert("temperature".into(), json!(0));
            if self.dynamo.is_some() {
                let fields = if tokens {
                    json!(["engine_data", "worker_id"])
                } else {
                    json!(["worker_id"])
                };
                b.insert("nvext".into(), json!({ "extra_fields": fields }));
            } else {
                b.insert("program_id".into(), json!(program_id));
                if tokens {
                    b.insert("return_token_ids".into(), json!(true));
                }
            }
            if self.stream {
                b.insert("stream".into(), json!(true));
                b.insert("stream_options".into(), json!({"include_usage": true}));
            }
            for (k, v) in extra {
                b.insert((*k).to_string(), v.clone());
            }
        }
        let final_header = last && self.dynamo == Some(SessionFinal::LastTurn);
        self.send(path, program_id, &body, final_header, tokens, max_tokens)
            .await
    }

    /// Ends a program on a Dynamo frontend in [`SessionFinal::Terminal`]
    /// mode: a one-token request carrying the final header. Failures are
    /// logged, not counted (like [`Client::release`]).
    pub async fn end_session(&self, program_id: &str, first_token: u32) {
        if self.dynamo != Some(SessionFinal::Terminal) {
            return;
        }
        let body = json!({"model": self.model, "prompt": [first_token], "max_tokens": 1});
        if let Err(e) = self
            .send("/v1/completions", program_id, &body, true, false, 1)
            .await
        {
            tracing::debug!(error = %e, program_id, "terminal session request failed");
        }
    }

    async fn send(
        &self,
        path: &str,
        program_id: &str,
        body: &Value,
        final_header: bool,
        tokens: bool,
        max_tokens: usize,
    ) -> Result<StepReply, ClientError> {
        let url = format!("{}{path}", self.base);
        let started = Instant::now();
        let mut req = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .header("x-session-id", program_id);
        if self.dynamo.is_some() {
            req = req.header("x-dynamo-session-id", program_id);
            if final_header {
                req = req.header("x-dynamo-session-final", "true");
            }
        }
        let resp = req
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.err(&url, e))?;
        let status = resp.status().as_u16();
        let reply = if status != 200 || body["stream"].as_bool() != Some(true) {
            self.read_whole(resp, status, &url).await?
        } else {
            self.read_stream(resp, started, &url).await?
        };
        finish(reply, tokens, max_tokens, &url)
    }

    /// A reply read as one JSON body (or the error a non-200 status is).
    async fn read_whole(
        &self,
        resp: reqwest::Response,
        status: u16,
        url: &str,
    ) -> Result<StepReply, ClientError> {
        let text = resp.text().await.map_err(|e| self.err(url, e))?;
        if status != 200 {
            return Err(ClientError::Status {
                url: url.to_string(),
                status,
                body: truncate(&text),
            });
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| ClientError::Protocol {
            url: url.to_string(),
            msg: format!("bad JSON: {e}"),
        })?;
        let mut reply = StepReply::default();
        absorb(&mut reply, &v);
        Ok(reply)
    }

    /// A reply read from its server-sent events up to `[DONE]`; the first
    /// chunk that adds text or tokens sets the time to first token.
    async fn read_stream(
        &self,
        mut resp: reqwest::Response,
        started: Instant,
        url: &str,
    ) -> Result<StepReply, ClientError> {
        let mut reply = StepReply::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut done = false;
        while !done {
            let chunk = resp.chunk().await.map_err(|e| self.err(url, e))?;
            let Some(chunk) = chunk else { break };
            buf.extend_from_slice(&chunk);
            while let Some(end) = find_event_end(&buf) {
                let event: Vec<u8> = buf.drain(..end.0 + end.1).collect();
                let event = String::from_utf8_lossy(&event[..end.0]).into_owned();
                done |= absorb_event(&mut reply, &event, started, url)?;
            }
        }
        if !done {
            return Err(ClientError::Protocol {
                url: url.to_string(),
                msg: "stream ended without [DONE]".into(),
            });
        }
        Ok(reply)
    }
}

/// Takes one server-sent event's `data:` lines into `reply`; true when one
/// of them was `[DONE]`. An `error` object in the stream ends the step.
fn absorb_event(
    reply: &mut StepReply,
    event: &str,
    started: Instant,
    url: &str,
) -> Result<bool, ClientError> {
    let mut done = false;
    for line in event.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| ClientError::Protocol {
            url: url.to_string(),
            msg: format!("bad stream chunk: {e}"),
        })?;
        if let Some(err) = v.get("error") {
            return Err(ClientError::Protocol {
                url: url.to_string(),
                msg: format!("error in stream: {}", truncate(&err.to_string())),
            });
        }
        let before = (reply.token_ids.len(), reply.text.len());
        absorb(reply, &v);
        if reply.ttft_s.is_none() && (reply.token_ids.len(), reply.text.len()) != before {
            reply.ttft_s = Some(started.elapsed().as_secs_f64());
        }
    }
    Ok(done)
}

/// (index of the blank line ending the first event, separator length).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Folds one response or stream chunk into `reply`.
fn absorb(reply: &mut StepReply, v: &Value) {
    if let Some(choice) = v["choices"].get(0) {
        if let Some(ids) = choice["token_ids"].as_array() {
            reply
                .token_ids
                .extend(ids.iter().filter_map(|t| t.as_u64()).map(|t| t as u32));
        }
        if let Some(t) = choice["text"].as_str() {
            reply.text.push_str(t);
        }
        for part in [&choice["message"], &choice["delta"]] {
            if let Some(t) = part["content"].as_str() {
                reply.text.push_str(t);
            }
        }
    }
    // Dynamo: the whole list of generated ids on the final chunk.
    let nvext = &v["nvext"];
    if let Some(ids) = nvext["engine_data"]["completion_token_ids"].as_array() {
        reply.token_ids = ids
            .iter()
            .filter_map(|t| t.as_u64())
            .map(|t| t as u32)
            .collect();
    }
    if let Some(w) = nvext["worker_id"]["decode_worker_id"].as_u64() {
        reply.worker = Some(w);
    }
    let usage = &v["usage"];
    if usage.is_object() {
        reply.prompt_tokens = usage["prompt_tokens"].as_u64().unwrap_or(0) as usize;
        reply.completion_tokens = usage["completion_tokens"].as_u64().unwrap_or(0) as usize;
        reply.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .map(|c| c as usize);
    }
}

fn finish(
    mut reply: StepReply,
    tokens: bool,
    max_tokens: usize,
    url: &str,
) -> Result<StepReply, ClientError> {
    if tokens && reply.token_ids.is_empty() {
        return Err(ClientError::Protocol {
            url: url.to_string(),
            msg: "no choices[0].token_ids in the answer: the server must support \
                  \"return_token_ids\" (vLLM >= 0.10.2, agentd) for token mode, or \
                  nvext.engine_data (a Dynamo frontend: --dynamo-target); \
                  use --mode chat otherwise"
                .into(),
        });
    }
    if reply.completion_tokens == 0 {
        reply.completion_tokens = if tokens {
            reply.token_ids.len()
        } else {
            max_tokens
        };
    }
    Ok(reply)
}

pub(crate) fn truncate(s: &str) -> String {
    const MAX: usize = 300;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests;
