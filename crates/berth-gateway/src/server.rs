//! The HTTP side: routing, authentication by attempt token, the scripted answers, journaling.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::dialect::{self, Dialect, Reply, Turn};
use crate::journal::{bounded, redacted_headers, Entry, JOURNAL_SCHEMA};
use crate::script::{Action, Usage};
use crate::{Attempt, Gateway, Upstream};

/// The header a CLI that authenticates with its own login presents the attempt token in.
pub const TOKEN_HEADER: &str = "x-berth-token";

/// The largest request body accepted (agent prompts with long histories are large).
pub(crate) const MAX_REQUEST_BYTES: usize = 32 << 20;

// What a process in a sandbox (it holds its attempt's token) can make the host hold. Measured
// before these: 3,000 connections that never finished their head were all kept open, and 40
// connections each sending 32 MiB held 1.3 GB.

/// Connections served at once; more wait to be accepted (a docker sandbox's forward also
/// closes any beyond its own 64).
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// A request's head must arrive within this from when its connection opened or its last
/// response ended: an idle keep-alive connection is closed after it.
pub(crate) const HEAD_DEADLINE: Duration = Duration::from_secs(60);
/// A request's body must arrive within this once its head has.
pub(crate) const BODY_DEADLINE: Duration = Duration::from_secs(60);
/// Request bodies held at once, across every connection; a request that would pass it is
/// answered 503 (the agent CLIs retry).
pub(crate) const MAX_HELD_BYTES: usize = 256 << 20;

/// Bytes of request bodies the gateway holds now.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held(Arc<AtomicUsize>);

/// A request body's share of [`Held`], given back when dropped (with the request).
#[derive(Debug)]
pub(crate) struct Reservation {
    held: Held,
    bytes: usize,
}

impl Reservation {
    /// Takes `more` bytes, unless that would pass [`MAX_HELD_BYTES`].
    fn grow(&mut self, more: usize) -> bool {
        let before = self.held.0.fetch_add(more, Ordering::SeqCst);
        if before + more > MAX_HELD_BYTES {
            self.held.0.fetch_sub(more, Ordering::SeqCst);
            return false;
        }
        self.bytes += more;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.held.0.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// Reads a request body within [`BODY_DEADLINE`], [`MAX_REQUEST_BYTES`] and the gateway's
/// share of [`MAX_HELD_BYTES`].
async fn read_body(
    body: Incoming,
    held: &Held,
) -> Result<(Bytes, Reservation), (StatusCode, String)> {
    let mut reservation = Reservation {
        held: held.clone(),
        bytes: 0,
    };
    let mut buffer = BytesMut::new();
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let unreadable = |_| {
                (
                    StatusCode::BAD_REQUEST,
                    "the request body could not be read".to_owned(),
                )
            };
            let Ok(data) = frame.map_err(unreadable)?.into_data() else {
                continue;
            };
            if buffer.len() + data.len() > MAX_REQUEST_BYTES {
                return Err((
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body over {MAX_REQUEST_BYTES} bytes"),
                ));
            }
            if !reservation.grow(data.len()) {
                return Err((
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the gateway already holds {MAX_HELD_BYTES} bytes of requests; retry"),
                ));
            }
            buffer.extend_from_slice(&data);
        }
        Ok(())
    };
    match tokio::time::timeout(BODY_DEADLINE, read).await {
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                BODY_DEADLINE.as_secs()
            ),
        )),
        Ok(Err(refused)) => Err(refused),
        Ok(Ok(())) => Ok((buffer.freeze(), reservation)),
    }
}

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// A gateway serving on a local port; stops accepting when stopped or dropped.
#[derive(Debug)]
pub struct RunningGateway {
    addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
    handed: tokio::sync::mpsc::UnboundedSender<tokio::net::UnixStream>,
}

/// Hands the gateway connections that arrived some other way than its port (a sandbox's
/// loopback forward). Served like any other, and closed when the gateway stops.
#[derive(Debug, Clone)]
pub struct Connections(tokio::sync::mpsc::UnboundedSender<tokio::net::UnixStream>);

impl Connections {
    /// Serves `stream` (HTTP/1.1, as on the port). `Err` when the gateway has stopped.
    pub fn serve(&self, stream: std::os::unix::net::UnixStream) -> std::io::Result<()> {
        stream.set_nonblocking(true)?;
        let stream = tokio::net::UnixStream::from_std(stream)?;
        self.0.send(stream).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the model gateway has stopped",
            )
        })
    }
}

impl RunningGateway {
    /// The address it listens on (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where connections from elsewhere (a sandbox's loopback forward) are handed in.
    pub fn connections(&self) -> Connections {
        Connections(self.handed.clone())
    }

    /// Stops: no new connection is accepted, and open ones are closed.
    pub fn stop(self) {}
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

pub(crate) fn serve(gateway: Gateway, listener: tokio::net::TcpListener) -> RunningGateway {
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    let (handed, mut arrivals) = tokio::sync::mpsc::unbounded_channel();
    let accept = tokio::spawn(async move {
        // Owned here, so stopping the gateway also ends every connection it is serving.
        let mut connections = tokio::task::JoinSet::new();
        let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            while connections.try_join_next().is_some() {}
            // At the cap, nothing more is accepted until a connection ends.
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else {
                        // Out of descriptors or similar: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_http(gateway.clone(), stream, permit));
                }
                Some(stream) = arrivals.recv() => {
                    connections.spawn(serve_http(gateway.clone(), stream, permit));
                }
            }
        }
    });
    RunningGateway {
        addr,
        accept,
        handed,
    }
}

async fn serve_http<S>(gateway: Gateway, stream: S, _permit: tokio::sync::OwnedSemaphorePermit)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let gateway = gateway.clone();
        async move { Ok::<_, Infallible>(handle(&gateway, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEAD_DEADLINE)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

pub(crate) fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(full(body))
        .expect("a valid response")
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    respond(status, "application/json", value.to_string())
}

/// The attempt token a request presents: `x-berth-token: …` (when the CLI's key header carries
/// its own subscription login), else `Authorization: Bearer …` or `x-api-key: …`.
fn presented_token(req: &Request<Incoming>) -> Option<String> {
    let headers = req.headers();
    if let Some(token) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        return Some(token.trim().to_owned());
    }
    if let Some(bearer) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(bearer.trim().to_owned());
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
}

pub(crate) fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What every journal line of one request shares.
pub(crate) struct Exchange {
    pub(crate) attempt: Arc<Attempt>,
    pub(crate) dialect: Dialect,
    pub(crate) path: String,
    pub(crate) at_unix_ms: u64,
    pub(crate) started: Instant,
    pub(crate) request_headers: std::collections::BTreeMap<String, String>,
    pub(crate) request_body: Bytes,
    /// The body's share of what the gateway holds, for as long as the exchange lives.
    pub(crate) _reservation: Reservation,
    pub(crate) model: Option<String>,
    pub(crate) stream: bool,
}

impl Exchange {
    /// Journals the exchange's outcome (a journal that cannot be written is reported on
    /// stderr, never silently skipped).
    pub(crate) fn journal(
        &self,
        gateway: &Gateway,
        status: u16,
        step: Option<usize>,
        response: &[u8],
        usage: Option<Usage>,
    ) {
        let (request_body, request_truncated) = bounded(&self.request_body);
        let (response_body, response_truncated) = bounded(response);
        let (cost_usd, cost_unknown) = match &gateway.config.prices {
            None => (None, Some("no price table".to_owned())),
            Some(prices) => match prices.cost(self.model.as_deref(), usage) {
                Ok(cost) => (Some(cost), None),
                Err(why) => (None, Some(why)),
            },
        };
        let entry = Entry {
            schema: JOURNAL_SCHEMA.into(),
            attempt: self.attempt.key.clone(),
            seq: 0,
            at_unix_ms: self.at_unix_ms,
            latency_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            dialect: self.dialect.as_str().into(),
            upstream: gateway.config.upstream.name().into(),
            path: self.path.clone(),
            model: self.model.clone(),
            stream: self.stream,
            status,
            step,
            request_headers: self.request_headers.clone(),
            request_body,
            request_truncated,
            response_body,
            response_truncated,
            usage,
            cost_usd,
            cost_unknown,
        };
        let mut secrets = gateway.secrets();
        secrets.extend(self.attempt.secrets.iter().cloned());
        if let Err(err) = self.attempt.journal.append(entry, &secrets) {
            eprintln!(
                "berth-gateway: cannot journal a request of attempt {} to {}: {err}",
                self.attempt.key,
                self.attempt.journal.path().display()
            );
        }
    }
}

async fn handle(gateway: &Gateway, req: Request<Incoming>) -> Response<Body> {
    let started = Instant::now();
    let at_unix_ms = now_unix_ms();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    let bare_path = req.uri().path().trim_end_matches('/').to_owned();
    // Claude Code's connectivity probe, and a plain GET for humans.
    if req.method() == Method::HEAD || (req.method() == Method::GET && bare_path.is_empty()) {
        return respond(StatusCode::OK, "text/plain", "berth gateway\n");
    }
    let dialect = Dialect::of_path(&bare_path);
    let error_dialect = dialect.unwrap_or(if bare_path.ends_with("/count_tokens") {
        Dialect::Anthropic
    } else {
        Dialect::Chat
    });
    let refuse = |status: StatusCode, message: &str| {
        json_response(status, &error_dialect.error_body(status.as_u16(), message))
    };
    let Some(attempt) = presented_token(&req).and_then(|t| gateway.attempt(&t)) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "unknown or revoked attempt token (this gateway answers only the attempts it admitted)",
        );
    };
    if req.method() == Method::GET && bare_path.ends_with("/models") {
        if let Upstream::Proxy(proxy) = &gateway.config.upstream {
            return proxy.forward_plain(req, Dialect::Chat).await;
        }
        return json_response(
            StatusCode::OK,
            &json!({ "object": "list", "data": [{ "id": "scripted", "object": "model", "owned_by": "berth" }] }),
        );
    }
    if req.method() != Method::POST {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, "use POST");
    }
    let request_headers = redacted_headers(req.headers());
    let (parts, body) = req.into_parts();
    let (request_body, reservation) = match read_body(body, &gateway.held).await {
        Ok(read) => read,
        Err((status, message)) => return refuse(status, &message),
    };
    if bare_path.ends_with("/messages/count_tokens") {
        // An estimate, clearly one: about four bytes a token.
        return json_response(
            StatusCode::OK,
            &json!({ "input_tokens": request_body.len() / 4 }),
        );
    }
    let Some(dialect) = dialect else {
        return refuse(StatusCode::NOT_FOUND, &format!("no route for {bare_path}"));
    };
    let parsed: Option<Value> = serde_json::from_slice(&request_body).ok();
    let exchange = Exchange {
        attempt,
        dialect,
        path,
        at_unix_ms,
        started,
        request_headers,
        model: parsed
            .as_ref()
            .and_then(|b| b["model"].as_str().map(str::to_owned)),
        stream: parsed
            .as_ref()
            .and_then(|b| b["stream"].as_bool())
            .unwrap_or(false),
        request_body,
        _reservation: reservation,
    };
    match &gateway.config.upstream {
        Upstream::Proxy(proxy) => proxy.forward(gateway, parts, exchange).await,
        Upstream::Scripted(script) => {
            let Some(body) = parsed else {
                let error = dialect.error_body(400, "the request body is not JSON");
                exchange.journal(gateway, 400, None, error.to_string().as_bytes(), None);
                return json_response(StatusCode::BAD_REQUEST, &error);
            };
            let turn = Turn::read(dialect, &body);
            let (index, step) = script.step_of(exchange.attempt.ordinal, turn.step());
            if let Some(delay) = step.delay_ms {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            }
            let action = step.action();
            if let Action::Error(error) = &action {
                let status =
                    StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let body = dialect.error_body(error.status, &error.message).to_string();
                exchange.journal(gateway, error.status, Some(index), body.as_bytes(), None);
                return respond(status, "application/json", body);
            }
            let reply = Reply::decide(&action, &turn, &script.side_text);
            let usage = step.usage.unwrap_or(Usage::SCRIPTED_DEFAULT);
            let rendered = dialect::render(&turn, &reply, usage);
            exchange.journal(
                gateway,
                200,
                Some(index),
                rendered.body.as_bytes(),
                Some(usage),
            );
            respond(StatusCode::OK, rendered.content_type, rendered.body)
        }
    }
}
