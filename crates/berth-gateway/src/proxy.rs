//! The proxy upstream: forwards to a real endpoint and adds the real credential itself.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::http::request::Parts;
use hyper::{HeaderMap, Request, Response, StatusCode, Uri};

use crate::dialect::{self, Dialect};
use crate::journal::MAX_JOURNALED_BODY;
use crate::server::{full, Body, Exchange};
use crate::{Gateway, GatewayError};

/// Headers never forwarded: the sandbox's token, hop-by-hop headers, and compression (the
/// gateway reads usage from the response).
const DROPPED: &[&str] = &[
    "authorization",
    "x-api-key",
    "proxy-authorization",
    "cookie",
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "accept-encoding",
    "upgrade",
    "te",
    "trailer",
];

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A real endpoint and its credential.
pub struct Proxy {
    origin: Uri,
    credential: String,
    /// Kept-alive upstream connections (HTTP/1.1: one request at a time each).
    idle: std::sync::Mutex<Vec<Sender>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("origin", &self.origin)
            .field("credential", &"[redacted]")
            .finish()
    }
}

impl Proxy {
    /// Forwards to `origin` (`http://host:port`; request paths are forwarded unchanged), adding
    /// `credential` as the dialect's key header (`x-api-key` for Anthropic, a bearer token
    /// otherwise).
    pub fn new(origin: &str, credential: String) -> Result<Proxy, GatewayError> {
        let uri: Uri = origin
            .parse()
            .map_err(|e| GatewayError::Proxy(format!("`{origin}` is not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(GatewayError::Proxy(
                    "https upstreams are not supported by this build yet (no TLS client); put \
                     a local TLS-terminating forwarder in front, or use http"
                        .into(),
                ))
            }
            _ => {
                return Err(GatewayError::Proxy(format!(
                    "`{origin}`: the scheme must be http"
                )))
            }
        }
        if uri.authority().is_none() {
            return Err(GatewayError::Proxy(format!("`{origin}` names no host")));
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(GatewayError::Proxy(format!(
                "`{origin}`: give the origin only (paths are forwarded unchanged)"
            )));
        }
        if credential.is_empty() || credential.contains(['\r', '\n']) {
            return Err(GatewayError::Proxy(
                "the credential is empty or spans lines".into(),
            ));
        }
        Ok(Proxy {
            origin: uri,
            credential,
            idle: std::sync::Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn credential(&self) -> &str {
        &self.credential
    }

    async fn send(
        &self,
        parts: &Parts,
        path: &str,
        dialect: Dialect,
        body: Bytes,
    ) -> Result<Response<Incoming>, String> {
        let authority = self.origin.authority().expect("checked in new").clone();
        let mut sender = match self.idle_sender() {
            Some(sender) => sender,
            None => {
                let stream = tokio::net::TcpStream::connect(authority.as_str())
                    .await
                    .map_err(|e| format!("cannot reach the upstream {authority}: {e}"))?;
                let _ = stream.set_nodelay(true);
                let (sender, connection) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .map_err(|e| format!("upstream handshake: {e}"))?;
                tokio::spawn(connection);
                sender
            }
        };
        let mut request = Request::builder()
            .method(parts.method.clone())
            .uri(path)
            .header("host", authority.as_str());
        for (name, value) in &parts.headers {
            if !DROPPED.contains(&name.as_str()) {
                request = request.header(name, value);
            }
        }
        request = match dialect {
            Dialect::Anthropic => request.header("x-api-key", &self.credential),
            Dialect::Chat | Dialect::Responses => {
                request.header("authorization", format!("Bearer {}", self.credential))
            }
        };
        let request = request
            .body(Full::new(body))
            .map_err(|e| format!("cannot build the upstream request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("upstream request: {e}"))?;
        // Ready again once this response's body has been read; until then it is skipped.
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(sender);
        Ok(response)
    }

    /// A kept-alive connection that can take a request now (closed ones are dropped).
    fn idle_sender(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|s| !s.is_closed());
        let at = idle.iter().position(|s| s.is_ready())?;
        Some(idle.swap_remove(at))
    }

    /// A request that is not a model turn (`GET /models`): forwarded, not journaled.
    pub(crate) async fn forward_plain(
        &self,
        req: Request<Incoming>,
        dialect: Dialect,
    ) -> Response<Body> {
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        let (parts, _) = req.into_parts();
        match self.send(&parts, &path, dialect, Bytes::new()).await {
            Ok(response) => {
                let (parts, body) = response.into_parts();
                Response::from_parts(parts, body.boxed())
            }
            Err(why) => bad_gateway(dialect, &why),
        }
    }

    /// A model turn: forwarded with the credential, the response streamed back unchanged and
    /// journaled (with its usage) when it ends.
    pub(crate) async fn forward(
        &self,
        gateway: &Gateway,
        parts: Parts,
        exchange: Exchange,
    ) -> Response<Body> {
        let dialect = exchange.dialect;
        let sent = self
            .send(
                &parts,
                &exchange.path,
                dialect,
                exchange.request_body.clone(),
            )
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(why) => {
                let response = bad_gateway(dialect, &why);
                exchange.journal(gateway, 502, None, why.as_bytes(), None);
                return response;
            }
        };
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let status = parts.status.as_u16();
        let gateway = gateway.clone();
        let tee = Tee {
            inner: body,
            captured: Vec::new(),
            finished: Some(Box::new(move |captured: Vec<u8>| {
                let usage = dialect::usage_of(dialect, &String::from_utf8_lossy(&captured));
                exchange.journal(&gateway, status, None, &captured, usage);
            })),
        };
        Response::from_parts(parts, tee.boxed())
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in [
        "connection",
        "keep-alive",
        "transfer-encoding",
        "trailer",
        "upgrade",
    ] {
        headers.remove(name);
    }
}

fn bad_gateway(dialect: Dialect, why: &str) -> Response<Body> {
    Response::builder()
        .status(StatusCode::BAD_GATEWAY)
        .header("content-type", "application/json")
        .body(full(dialect.error_body(502, why).to_string()))
        .expect("a valid response")
}

type Finished = Box<dyn FnOnce(Vec<u8>) + Send + Sync>;

/// A response body passed through unchanged while a bounded copy is kept; when it ends (or
/// the client goes away) the copy is handed to `finished`.
struct Tee {
    inner: Incoming,
    captured: Vec<u8>,
    finished: Option<Finished>,
}

impl hyper::body::Body for Tee {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let room = (MAX_JOURNALED_BODY + 1).saturating_sub(self.captured.len());
                    let keep = data.len().min(room);
                    self.captured.extend_from_slice(&data[..keep]);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl Tee {
    fn finish(&mut self) {
        if let Some(finished) = self.finished.take() {
            finished(std::mem::take(&mut self.captured));
        }
    }
}

impl Drop for Tee {
    fn drop(&mut self) {
        self.finish();
    }
}
