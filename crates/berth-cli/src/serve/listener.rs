//! The listening socket, guarded: a bounded number of connections, and none held open by a
//! client that never finishes asking or has gone quiet.
//!
//! axum's `serve` sets no timeouts, so a client could open connections and dribble a request
//! line forever (each one a file descriptor and a task). Every accepted connection here holds
//! a permit of a fixed pool (further clients wait in the kernel's backlog) and deadlines read
//! off the bytes: a request's head (up to its blank line) must arrive within
//! [`REQUEST_DEADLINE`] of its first byte (of the connection, for the first request); while the
//! request is handled there is none (an exec may run for minutes); once the server answers, the
//! connection must not sit without a byte either way for [`IDLE_DEADLINE`] (event streams send
//! a keep-alive comment every 15 s), and the client's next byte begins a new request. A body
//! sent slowly is bounded only by the connection limit.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// A request's head must have arrived this long after its first byte — or after the
/// connection opened, for the first request.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// Between requests, or while answering, a connection may be silent both ways this long.
pub(crate) const IDLE_DEADLINE: Duration = Duration::from_secs(120);

/// A `TcpListener` whose connections are [`Guarded`].
pub(crate) struct GuardedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    request: Duration,
    idle: Duration,
}

impl GuardedListener {
    pub(crate) fn new(inner: TcpListener) -> Self {
        Self::with_limits(inner, MAX_CONNECTIONS, REQUEST_DEADLINE, IDLE_DEADLINE)
    }

    fn with_limits(
        inner: TcpListener,
        connections: usize,
        request: Duration,
        idle: Duration,
    ) -> Self {
        GuardedListener {
            inner,
            permits: Arc::new(Semaphore::new(connections)),
            request,
            idle,
        }
    }
}

impl axum::serve::Listener for GuardedListener {
    type Io = Guarded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Guarded, SocketAddr) {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the permit pool is never closed");
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    return (Guarded::new(stream, permit, self.request, self.idle), addr)
                }
                // Out of descriptors, or a connection reset before accept: wait, never spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Where a connection is in its request/answer cycle, as far as bytes show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The client is sending a request's head; `lf` says the last byte other than CR was LF
    /// (a second LF ends the head).
    Asking { lf: bool },
    /// The head is in and the server has not answered yet: no deadline.
    Handling,
    /// The server has begun to answer; the client's next byte begins a new request.
    Answered,
}

/// An accepted connection under its deadlines (see the module documentation).
pub(crate) struct Guarded {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    phase: Phase,
    deadline: Pin<Box<Sleep>>,
    request: Duration,
    idle: Duration,
}

impl Guarded {
    fn new(
        stream: TcpStream,
        permit: OwnedSemaphorePermit,
        request: Duration,
        idle: Duration,
    ) -> Self {
        Guarded {
            stream,
            _permit: permit,
            phase: Phase::Asking { lf: false },
            deadline: Box::pin(tokio::time::sleep(request)),
            request,
            idle,
        }
    }

    /// Fails once the phase's deadline has passed; otherwise arranges a wake-up for it.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let why = match self.phase {
            Phase::Asking { .. } => "request head not received in time",
            Phase::Answered => "connection idle",
            Phase::Handling => return Ok(()),
        };
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(io::ErrorKind::TimedOut, why)),
            Poll::Pending => Ok(()),
        }
    }

    fn push_back(&mut self, by: Duration) {
        self.deadline.as_mut().reset(Instant::now() + by);
    }

    /// Follows the client's bytes through the phases.
    fn received(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.phase == Phase::Answered {
            self.phase = Phase::Asking { lf: false };
            let request = self.request;
            self.push_back(request);
        }
        let Phase::Asking { mut lf } = self.phase else {
            return;
        };
        for &byte in bytes {
            match byte {
                b'\r' => {}
                b'\n' if lf => {
                    self.phase = Phase::Handling;
                    return;
                }
                b'\n' => lf = true,
                _ => lf = false,
            }
        }
        self.phase = Phase::Asking { lf };
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Checked before reading too: a client dribbling bytes must not outlast the deadline.
        this.check(cx)?;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            this.received(&buf.filled()[before..]);
        }
        read
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.stream).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &written {
            if *n > 0 {
                // Answering: the connection is alive.
                this.phase = Phase::Answered;
                let idle = this.idle;
                this.push_back(idle);
            }
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::serve::Listener as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn listener(connections: usize, request: Duration, idle: Duration) -> GuardedListener {
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        GuardedListener::with_limits(inner, connections, request, idle)
    }

    /// A request line dribbled and never finished is cut at the request deadline.
    #[tokio::test]
    async fn an_unfinished_request_is_cut_at_its_deadline() {
        let mut listener = listener(4, Duration::from_millis(300), Duration::from_secs(60)).await;
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let (mut served, _) = listener.accept().await;
        let started = std::time::Instant::now();
        let mut buf = [0u8; 64];
        assert!(served.read(&mut buf).await.unwrap() > 0);
        let err = served.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Bytes that keep coming without ever ending the head do not hold the connection.
    #[tokio::test]
    async fn a_dribbled_head_is_cut_at_its_deadline() {
        let mut listener = listener(4, Duration::from_millis(300), Duration::from_secs(60)).await;
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut served, _) = listener.accept().await;
        let dribble = tokio::spawn(async move {
            for _ in 0..100 {
                if client.write_all(b"X").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let started = std::time::Instant::now();
        let mut buf = [0u8; 64];
        let err = loop {
            match served.read(&mut buf).await {
                Ok(n) => assert!(n > 0),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        dribble.abort();
    }

    /// While a request is handled (its head in, no answer yet) nothing cuts it: an exec may run
    /// for minutes.
    #[tokio::test]
    async fn a_request_being_handled_has_no_deadline() {
        let mut listener =
            listener(4, Duration::from_millis(100), Duration::from_millis(200)).await;
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .unwrap();
        let (mut served, _) = listener.accept().await;
        let mut buf = [0u8; 128];
        let mut got = 0;
        while got < 41 {
            got += served.read(&mut buf[got..]).await.unwrap();
        }
        let quiet = tokio::time::timeout(Duration::from_millis(600), served.read(&mut buf)).await;
        assert!(quiet.is_err(), "cut while handling: {quiet:?}");
        served.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
    }

    /// After an answer, the connection may stay quiet up to the idle deadline (not the request
    /// deadline), and a new request restarts the request deadline.
    #[tokio::test]
    async fn an_answered_connection_has_the_idle_deadline() {
        let mut listener =
            listener(4, Duration::from_millis(200), Duration::from_millis(900)).await;
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let (mut served, _) = listener.accept().await;
        let mut buf = [0u8; 64];
        assert!(served.read(&mut buf).await.unwrap() > 0);
        served.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        // Quiet for longer than the request deadline: still open.
        let quiet = tokio::time::timeout(Duration::from_millis(500), served.read(&mut buf)).await;
        assert!(quiet.is_err(), "cut while answered: {quiet:?}");
        // The next request's first byte starts the request deadline again.
        client.write_all(b"G").await.unwrap();
        assert_eq!(served.read(&mut buf).await.unwrap(), 1);
        let started = std::time::Instant::now();
        let err = served.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            started.elapsed() < Duration::from_millis(800),
            "{:?}",
            started.elapsed()
        );
    }

    /// Beyond the connection limit, the next client waits until a connection ends.
    #[tokio::test]
    async fn connections_beyond_the_limit_wait_for_a_permit() {
        let mut listener = listener(1, Duration::from_secs(60), Duration::from_secs(60)).await;
        let addr = listener.local_addr().unwrap();
        let _first_client = TcpStream::connect(addr).await.unwrap();
        let (first, _) = listener.accept().await;
        let _second_client = TcpStream::connect(addr).await.unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
        assert!(
            waiting.is_err(),
            "a second connection was served beyond the limit"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), listener.accept()).await;
        assert!(second.is_ok(), "the freed permit was not reused");
    }
}
