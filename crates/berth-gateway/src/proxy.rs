//! The proxy upstream: forwards to a real endpoint and adds the real credential itself, or —
//! for a CLI signed in with its own subscription login — passes that login's key header
//! through.

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
    "x-berth-token",
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

/// The variable naming a PEM file of extra certificates an https upstream may present (a
/// private CA); the system's roots are always trusted.
pub const PROXY_CA_FILE_VAR: &str = "BERTH_PROXY_CA_FILE";

/// A real endpoint and its credential.
pub struct Proxy {
    origin: Uri,
    /// `host:port` to connect to (the scheme's port when the origin names none).
    address: String,
    /// TLS for an `https` origin: the system's roots plus any trusted with [`Proxy::trust_pem`].
    tls: Option<TlsClient>,
    /// `None`: pass the CLI's own key header (its subscription login) through.
    credential: Option<String>,
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
        if credential.is_empty() || credential.contains(['\r', '\n']) {
            return Err(GatewayError::Proxy(
                "the credential is empty or spans lines".into(),
            ));
        }
        Self::build(origin, Some(credential))
    }

    /// Forwards to `origin` passing the client's own `authorization` / `x-api-key` through
    /// (a CLI signed in with a subscription login; it presents the gateway token in
    /// `x-berth-token`). The gateway adds no credential.
    pub fn passthrough(origin: &str) -> Result<Proxy, GatewayError> {
        Self::build(origin, None)
    }

    fn build(origin: &str, credential: Option<String>) -> Result<Proxy, GatewayError> {
        let uri: Uri = origin
            .parse()
            .map_err(|e| GatewayError::Proxy(format!("`{origin}` is not a URL: {e}")))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(GatewayError::Proxy(format!(
                    "`{origin}`: the scheme must be http or https"
                )))
            }
        };
        let Some(authority) = uri.authority() else {
            return Err(GatewayError::Proxy(format!("`{origin}` names no host")));
        };
        let address = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(if https { 443 } else { 80 })
        );
        let tls = if https {
            Some(TlsClient::new(authority.host(), &[])?)
        } else {
            None
        };
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(GatewayError::Proxy(format!(
                "`{origin}`: give the origin only (paths are forwarded unchanged)"
            )));
        }
        Ok(Proxy {
            origin: uri,
            address,
            tls,
            credential,
            idle: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Also trusts the certificates in `pem` (an https upstream with a private CA). Without
    /// this, only the system's roots are trusted.
    pub fn trust_pem(mut self, pem: &[u8]) -> Result<Proxy, GatewayError> {
        let Some(authority) = self.origin.authority() else {
            return Ok(self);
        };
        if self.tls.is_some() {
            self.tls = Some(TlsClient::new(authority.host(), pem)?);
        }
        Ok(self)
    }

    /// [`Proxy::trust_pem`] with the PEM file named by [`PROXY_CA_FILE_VAR`], when that is set
    /// (Berth's environment, passed in by the caller).
    pub fn trust_configured(self, ca_file: Option<&str>) -> Result<Proxy, GatewayError> {
        let Some(path) = ca_file.filter(|p| !p.is_empty()) else {
            return Ok(self);
        };
        let pem = berth_files::read_regular(std::path::Path::new(path), 1 << 20)
            .map_err(|e| GatewayError::Proxy(format!("{PROXY_CA_FILE_VAR} `{path}`: {e}")))?;
        self.trust_pem(&pem)
    }

    pub(crate) fn credential(&self) -> Option<&str> {
        self.credential.as_deref()
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
                let stream = tokio::net::TcpStream::connect(self.address.as_str())
                    .await
                    .map_err(|e| format!("cannot reach the upstream {authority}: {e}"))?;
                let _ = stream.set_nodelay(true);
                match &self.tls {
                    None => handshake(stream).await?,
                    Some(tls) => {
                        let stream = tls
                            .connector
                            .connect(tls.server_name.clone(), stream)
                            .await
                            .map_err(|e| format!("TLS with the upstream {authority}: {e}"))?;
                        handshake(stream).await?
                    }
                }
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
        request = match (&self.credential, dialect) {
            (Some(credential), Dialect::Anthropic) => request.header("x-api-key", credential),
            (Some(credential), Dialect::Chat | Dialect::Responses) => {
                request.header("authorization", format!("Bearer {credential}"))
            }
            // The login's own key header, only when the request authenticated to the gateway
            // with its token header (never the token itself).
            (None, _) if parts.headers.contains_key(crate::server::TOKEN_HEADER) => {
                for name in ["authorization", "x-api-key"] {
                    if let Some(value) = parts.headers.get(name) {
                        request = request.header(name, value);
                    }
                }
                request
            }
            (None, _) => request,
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

async fn handshake<S>(stream: S) -> Result<Sender, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("upstream handshake: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// A TLS client for one upstream host: rustls (ring), HTTP/1.1 by ALPN, the system's roots
/// (`/etc/ssl/certs` and the like) plus any extra PEM certificates.
struct TlsClient {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl TlsClient {
    fn new(host: &str, extra_pem: &[u8]) -> Result<TlsClient, GatewayError> {
        use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            let _ = roots.add(cert);
        }
        if !extra_pem.is_empty() {
            for cert in CertificateDer::pem_slice_iter(extra_pem) {
                let cert =
                    cert.map_err(|e| GatewayError::Proxy(format!("trusted certificates: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| GatewayError::Proxy(format!("trusted certificates: {e}")))?;
            }
        }
        if roots.is_empty() {
            return Err(GatewayError::Proxy(
                "no trusted certificates for an https upstream (install ca-certificates)".into(),
            ));
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| GatewayError::Proxy(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
            .map_err(|e| GatewayError::Proxy(format!("`{host}` as a TLS server name: {e}")))?
            .to_owned();
        Ok(TlsClient {
            connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)),
            server_name,
        })
    }
}
