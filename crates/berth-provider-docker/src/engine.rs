//! A thin Docker Engine API client over the Unix socket: one HTTP/1.1 connection per request,
//! the API version negotiated once, every failure classified in [`classify`].

use std::path::{Path, PathBuf};

use berth_contract::{ErrorKind, ProviderError, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::PROVIDER_ID;

/// Newest API version this adapter speaks; older engines are used at their own version.
const MAX_API: (u32, u32) = (1, 43);
/// Oldest API version this adapter needs (Docker 19.03).
const MIN_API: (u32, u32) = (1, 40);

/// The most an ordinary answer of the engine is read into memory: lists and inspections are far
/// smaller, and what a sandbox can make long (a container's log lines) must not exhaust the
/// host's memory.
const ANSWER_LIMIT: usize = 64 * 1024 * 1024;

/// An engine client. The API version is negotiated on first use, so constructing a client
/// never touches the socket.
#[derive(Debug, Clone)]
pub struct Engine {
    socket: PathBuf,
    negotiated: std::sync::Arc<tokio::sync::OnceCell<Negotiated>>,
}

#[derive(Debug, Clone)]
struct Negotiated {
    prefix: String,
    server_version: String,
}

/// A request's body: whole, or produced as it is sent.
type RequestBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// A request body of exactly `len` bytes produced elsewhere (a blocking reader) and sent as it
/// arrives: each piece through a bounded channel, so at most a few pieces are held. An error
/// from the producer ends the request (the engine sees it cut short).
#[derive(Debug)]
pub struct ChannelBody {
    pieces: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
    len: u64,
}

impl ChannelBody {
    /// A body of `len` bytes and the sender its producer fills it through.
    pub fn new(
        len: u64,
    ) -> (
        tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
        ChannelBody,
    ) {
        let (sender, pieces) = tokio::sync::mpsc::channel(4);
        (sender, ChannelBody { pieces, len })
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<hyper::body::Frame<Bytes>, std::io::Error>>>
    {
        self.pieces
            .poll_recv(cx)
            .map(|piece| piece.map(|piece| piece.map(hyper::body::Frame::data)))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        // Sent with its length, so a body cut short is a broken request, never a shorter one.
        hyper::body::SizeHint::with_exact(self.len)
    }
}

/// What the engine says about a path in a container (a Go `os.FileMode` in `mode`).
#[derive(Debug, Clone, Deserialize)]
pub struct PathStat {
    /// Type bits (high) and permission bits.
    pub mode: u32,
}

impl PathStat {
    /// Go's type bits: directory, symlink, named pipe, socket, device, char device, irregular.
    const TYPE_BITS: u32 = 1 << 31 | 1 << 27 | 1 << 25 | 1 << 24 | 1 << 26 | 1 << 21 | 1 << 19;

    /// The permission bits of a regular file; `None` for anything else.
    pub fn regular_permissions(&self) -> Option<u32> {
        (self.mode & Self::TYPE_BITS == 0).then_some(self.mode & 0o777)
    }
}

/// A raw response.
#[derive(Debug)]
pub struct Response {
    /// HTTP status.
    pub status: StatusCode,
    /// Body bytes.
    pub body: Bytes,
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The socket named by `DOCKER_HOST` (only `unix://` is supported), or the default.
pub fn socket_from_docker_host(docker_host: Option<&str>) -> Result<PathBuf> {
    match docker_host {
        None | Some("") => Ok(PathBuf::from("/var/run/docker.sock")),
        Some(host) => match host.strip_prefix("unix://") {
            Some(path) => Ok(PathBuf::from(path)),
            None => Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                PROVIDER_ID,
                format!(
                    "DOCKER_HOST `{host}` is not a unix:// socket; this adapter speaks to local \
                     engines over their Unix socket only"
                ),
            )),
        },
    }
}

impl Engine {
    /// A client for the engine at `socket`.
    pub fn new(socket: &Path) -> Engine {
        Engine {
            socket: socket.to_owned(),
            negotiated: Default::default(),
        }
    }

    /// Negotiates the API version once: the engine's own version, capped at the newest this
    /// adapter knows. An engine older than the minimum is refused.
    async fn negotiated(&self) -> Result<&Negotiated> {
        self.negotiated
            .get_or_try_init(|| async {
                #[derive(serde::Deserialize)]
                struct Version {
                    #[serde(rename = "ApiVersion")]
                    api_version: String,
                    #[serde(rename = "Version")]
                    version: String,
                }
                let response = self.send(Method::GET, "/version".into(), None).await?;
                let response = ok("/version", response)?;
                let version: Version = serde_json::from_slice(&response.body).map_err(|e| {
                    ProviderError::new(
                        ErrorKind::Unknown,
                        PROVIDER_ID,
                        "unexpected /version answer",
                    )
                    .with_source(e)
                })?;
                let server = parse_version(&version.api_version).ok_or_else(|| {
                    ProviderError::new(
                        ErrorKind::Unknown,
                        PROVIDER_ID,
                        format!("engine reported API version `{}`", version.api_version),
                    )
                })?;
                if server < MIN_API {
                    return Err(ProviderError::new(
                        ErrorKind::Setup,
                        PROVIDER_ID,
                        format!(
                            "engine API {} is older than the {}.{} this adapter needs",
                            version.api_version, MIN_API.0, MIN_API.1
                        ),
                    ));
                }
                let (major, minor) = server.min(MAX_API);
                Ok(Negotiated {
                    prefix: format!("/v{major}.{minor}"),
                    server_version: version.version,
                })
            })
            .await
    }

    /// The negotiated API version (e.g. `1.41`) and the engine's version.
    pub async fn versions(&self) -> Result<(String, String)> {
        let negotiated = self.negotiated().await?;
        Ok((
            negotiated.prefix.trim_start_matches("/v").to_owned(),
            negotiated.server_version.clone(),
        ))
    }

    /// Sends one request; `path` excludes the version prefix. The answer's body is read whole,
    /// up to a limit no ordinary answer comes near.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Response> {
        let uri = format!("{}{}", self.negotiated().await?.prefix, path);
        self.send(method, uri, body).await
    }

    /// Sends one request and returns the answer's status and its body unread, for answers
    /// (archives) that are read as they arrive and may be given up part way.
    pub async fn open(
        &self,
        method: Method,
        path: &str,
    ) -> Result<(StatusCode, hyper::body::Incoming)> {
        let uri = format!("{}{}", self.negotiated().await?.prefix, path);
        let response = self.start(method, &uri, None).await?;
        Ok((response.status(), response.into_body()))
    }

    /// The engine's stat of `path` in container `name` (the archive API's
    /// `X-Docker-Container-Path-Stat` header): `None` when nothing is there.
    pub async fn stat_path(&self, name: &str, path: &str) -> Result<Option<PathStat>> {
        let uri = format!(
            "{}/containers/{name}/archive?path={}",
            self.negotiated().await?.prefix,
            crate::query_escape(path)
        );
        let response = self.start(Method::HEAD, &uri, None).await?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let header = response
            .headers()
            .get("x-docker-container-path-stat")
            .map(|v| v.as_bytes().to_vec());
        let answer = read_answer(&uri, response).await?;
        let _ = ok("archive stat", answer)?;
        let bad = |why: String| {
            ProviderError::new(
                ErrorKind::Unknown,
                PROVIDER_ID,
                format!("the engine's stat of `{path}`: {why}"),
            )
        };
        let header = header.ok_or_else(|| bad("no stat header".into()))?;
        use base64::Engine as _;
        let json = base64::engine::general_purpose::STANDARD
            .decode(&header)
            .map_err(|e| bad(e.to_string()))?;
        serde_json::from_slice(&json)
            .map(Some)
            .map_err(|e| bad(e.to_string()))
    }

    async fn send(
        &self,
        method: Method,
        uri: String,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Response> {
        let response = self.start(method, &uri, body).await?;
        read_answer(&uri, response).await
    }

    /// Sends `body` as it is produced (an archive of a file of any size) and reads the answer
    /// like [`Engine::request`]. The request ends early, and fails, when the body does.
    pub async fn request_streamed(
        &self,
        method: Method,
        path: &str,
        content_type: &'static str,
        body: ChannelBody,
    ) -> Result<Response> {
        let uri = format!("{}{}", self.negotiated().await?.prefix, path);
        let response = self
            .start_with(method, &uri, Some((content_type, body.boxed())))
            .await?;
        read_answer(&uri, response).await
    }

    async fn start(
        &self,
        method: Method,
        uri: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let body = body.map(|(content_type, bytes)| {
            let full = Full::new(Bytes::from(bytes)).map_err(|never| match never {});
            (content_type, full.boxed())
        });
        self.start_with(method, uri, body).await
    }

    async fn start_with(
        &self,
        method: Method,
        uri: &str,
        body: Option<(&'static str, RequestBody)>,
    ) -> Result<hyper::Response<hyper::body::Incoming>> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|err| unreachable(&self.socket, err))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| transport("handshake", e))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut builder = Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "docker");
        let body = match body {
            Some((content_type, body)) => {
                builder = builder.header("content-type", content_type);
                body
            }
            None => Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed(),
        };
        let request = builder.body(body).map_err(|e| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                PROVIDER_ID,
                format!("bad request `{uri}`"),
            )
            .with_source(e)
        })?;
        sender
            .send_request(request)
            .await
            .map_err(|e| transport("send request", e))
    }

    /// Sends a request with an optional JSON body and decodes a JSON answer; non-2xx is a
    /// classified error.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T> {
        let response = self
            .request(
                method,
                path,
                body.map(|b| ("application/json", serde_json::to_vec(&b).expect("json"))),
            )
            .await?;
        let response = ok(path, response)?;
        serde_json::from_slice(&response.body).map_err(|e| {
            ProviderError::new(
                ErrorKind::Unknown,
                PROVIDER_ID,
                format!("unexpected answer to `{path}`"),
            )
            .with_source(e)
        })
    }

    /// Sends a request and requires a 2xx (or one of `also_ok`) status.
    pub async fn expect(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
        also_ok: &[StatusCode],
    ) -> Result<Response> {
        let response = self.request(method, path, body).await?;
        if also_ok.contains(&response.status) {
            return Ok(response);
        }
        ok(path, response)
    }
}

/// An answer read whole, up to a limit no ordinary answer comes near.
async fn read_answer(
    uri: &str,
    response: hyper::Response<hyper::body::Incoming>,
) -> Result<Response> {
    let status = response.status();
    let body = collect_limited(response.into_body(), ANSWER_LIMIT)
        .await?
        .ok_or_else(|| {
            let path = uri.split('?').next().unwrap_or(uri);
            ProviderError::new(
                ErrorKind::Unknown,
                PROVIDER_ID,
                format!(
                    "the engine's answer to `{path}` is larger than {} MiB",
                    ANSWER_LIMIT >> 20
                ),
            )
        })?;
    Ok(Response { status, body })
}

/// Reads a whole body of at most `limit` bytes; `None` when it is longer (found before more
/// than `limit` bytes are held).
pub async fn collect_limited(body: hyper::body::Incoming, limit: usize) -> Result<Option<Bytes>> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(Some(collected.to_bytes())),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Ok(None),
        Err(e) => Err(transport("read response", e)),
    }
}

/// A 2xx response, or the classified error.
pub fn ok(path: &str, response: Response) -> Result<Response> {
    if response.status.is_success() {
        Ok(response)
    } else {
        Err(classify(path, response.status, &response.body))
    }
}

/// The one place Engine API failures become error kinds.
pub fn classify(path: &str, status: StatusCode, body: &[u8]) -> ProviderError {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    let kind = match status.as_u16() {
        400 => ErrorKind::InvalidRequest,
        401 | 403 => ErrorKind::Auth,
        404 => ErrorKind::NotFound,
        409 => ErrorKind::Conflict,
        // Some engines answer a missing image with 500; one deleted by another call while this
        // one looked it up is "unrecognized image ID" (seen when two housekeepings raced).
        500 if message.contains("No such image") || message.contains("unrecognized image ID") => {
            ErrorKind::NotFound
        }
        503 => ErrorKind::Unavailable,
        500..=599 => ErrorKind::Provider5xx,
        _ => ErrorKind::Unknown,
    };
    let path = path.split('?').next().unwrap_or(path);
    ProviderError::new(
        kind,
        PROVIDER_ID,
        format!("engine answered {} to `{path}`: {message}", status.as_u16()),
    )
}

fn unreachable(socket: &Path, err: std::io::Error) -> ProviderError {
    let kind = match err.kind() {
        std::io::ErrorKind::PermissionDenied => ErrorKind::Auth,
        _ => ErrorKind::Unavailable,
    };
    ProviderError::new(
        kind,
        PROVIDER_ID,
        format!(
            "docker engine not reachable at {} (is dockerd running? is DOCKER_HOST right?)",
            socket.display()
        ),
    )
    .with_source(err)
}

fn transport(
    what: &str,
    err: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ProviderError {
    ProviderError::new(
        ErrorKind::Unavailable,
        PROVIDER_ID,
        format!("engine connection failed during {what}"),
    )
    .with_source(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `os.FileMode` as the engine sends it: permissions of a regular file only.
    #[test]
    fn only_a_regular_file_has_permissions_to_keep() {
        let stat = |mode: u32| PathStat { mode }.regular_permissions();
        assert_eq!(stat(0o750), Some(0o750));
        // Setuid (Go's bit 23) is never carried over.
        assert_eq!(stat(1 << 23 | 0o755), Some(0o755));
        assert_eq!(stat(1 << 27 | 0o777), None, "a symlink");
        assert_eq!(stat(1 << 31 | 0o755), None, "a directory");
        assert_eq!(stat(1 << 25 | 0o644), None, "a named pipe");
        assert_eq!(stat(1 << 26 | 1 << 21 | 0o666), None, "a char device");
    }

    #[test]
    fn statuses_are_classified() {
        let cases = [
            (400, "{\"message\":\"bad\"}", ErrorKind::InvalidRequest),
            (
                404,
                "{\"message\":\"No such container: x\"}",
                ErrorKind::NotFound,
            ),
            (
                409,
                "{\"message\":\"removal in progress\"}",
                ErrorKind::Conflict,
            ),
            (
                500,
                "{\"message\":\"No such image: y\"}",
                ErrorKind::NotFound,
            ),
            (
                500,
                "{\"message\":\"unrecognized image ID sha256:76487e2ab58d\"}",
                ErrorKind::NotFound,
            ),
            (500, "{\"message\":\"boom\"}", ErrorKind::Provider5xx),
            (503, "", ErrorKind::Unavailable),
            (401, "", ErrorKind::Auth),
            (418, "", ErrorKind::Unknown),
        ];
        for (status, body, kind) in cases {
            let err = classify(
                "/x?y=1",
                StatusCode::from_u16(status).unwrap(),
                body.as_bytes(),
            );
            assert_eq!(err.kind(), kind, "{status} {body}");
            assert!(
                !err.to_string().contains("y=1"),
                "query strings stay out of errors"
            );
        }
    }

    #[test]
    fn docker_host_is_honoured_for_unix_sockets_only() {
        assert_eq!(
            socket_from_docker_host(None).unwrap(),
            PathBuf::from("/var/run/docker.sock")
        );
        assert_eq!(
            socket_from_docker_host(Some("unix:///tmp/d.sock")).unwrap(),
            PathBuf::from("/tmp/d.sock")
        );
        let err = socket_from_docker_host(Some("tcp://10.0.0.1:2375")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(parse_version("1.41"), Some((1, 41)));
        assert!(parse_version("1.41").unwrap() < MAX_API);
        assert!(parse_version("1.45").unwrap().min(MAX_API) == MAX_API);
        assert_eq!(parse_version("x"), None);
    }
}
