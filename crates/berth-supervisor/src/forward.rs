//! Loopback forwarding: a listener on `127.0.0.1:PORT` inside the sandbox whose connections
//! the host claims one by one over the supervisor's socket — how a sandbox without a network
//! reaches one service on the host (Berth's model gateway) and nothing else.
//!
//! `listen` holds the listener for as long as its control connection stays open, announcing
//! each accepted connection with a [`TAG_CONNECTION`] frame; `attach` takes an announced
//! connection and splices it with the attaching stream. Connections never attached are closed
//! when their listener ends.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::{write_frame, Exit, TAG_CONNECTION};

fn pending() -> &'static Mutex<HashMap<u64, Pending>> {
    static PENDING: OnceLock<Mutex<HashMap<u64, Pending>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// Forwarded connections open at once (announced or spliced), across every forward. A
/// connection beyond [`MAX_LIVE`] is closed at once: a process in the sandbox cannot pile up
/// host sockets or the supervisor's threads.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The most forwarded connections open at once.
pub(crate) const MAX_LIVE: usize = 64;

/// Gives back one [`LIVE`] slot when dropped.
struct Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection waiting to be claimed, holding its slot.
struct Pending {
    tcp: TcpStream,
    _slot: Slot,
}

/// Serves a `listen` request until its client goes away. `Err`: the port could not be opened
/// (sent as the reply's exit frame).
pub(crate) fn listen(
    control: &UnixStream,
    out: &Arc<Mutex<UnixStream>>,
    port: u16,
) -> Result<(), Exit> {
    let listener = TcpListener::bind(("127.0.0.1", port)).map_err(|e| Exit::SpawnFailed {
        kind: if e.kind() == io::ErrorKind::AddrInUse {
            "in_use".into()
        } else {
            "other".into()
        },
        message: format!("cannot listen on 127.0.0.1:{port} in the sandbox: {e}"),
    })?;
    {
        // An empty announcement: the port is open (the client returns only after this).
        let mut writer = out.lock().unwrap_or_else(|p| p.into_inner());
        if write_frame(&mut *writer, TAG_CONNECTION, &[]).is_err() {
            return Ok(());
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let announced = Arc::new(Mutex::new(Vec::new()));
    let acceptor = {
        let (stop, announced, out) = (stop.clone(), announced.clone(), out.clone());
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(tcp) = tcp else { continue };
                if LIVE.fetch_add(1, Ordering::SeqCst) >= MAX_LIVE {
                    LIVE.fetch_sub(1, Ordering::SeqCst);
                    let _ = tcp.shutdown(Shutdown::Both);
                    continue;
                }
                let slot = Slot;
                let _ = tcp.set_nodelay(true);
                let id = NEXT.fetch_add(1, Ordering::SeqCst);
                pending()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, Pending { tcp, _slot: slot });
                announced.lock().unwrap_or_else(|p| p.into_inner()).push(id);
                let mut writer = out.lock().unwrap_or_else(|p| p.into_inner());
                if write_frame(&mut *writer, TAG_CONNECTION, id.to_string().as_bytes()).is_err() {
                    break;
                }
            }
        })
    };
    // The client sends nothing after its request: a read returns when it hangs up.
    let mut byte = [0u8; 1];
    let _ = (&*control).read(&mut byte);
    stop.store(true, Ordering::SeqCst);
    // Wake the acceptor out of its blocking accept.
    let _ = TcpStream::connect(("127.0.0.1", port));
    let _ = acceptor.join();
    // Nobody will claim what is still pending: close it.
    let mut table = pending().lock().unwrap_or_else(|p| p.into_inner());
    for id in announced
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
    {
        if let Some(waiting) = table.remove(&id) {
            let _ = waiting.tcp.shutdown(Shutdown::Both);
        }
    }
    Ok(())
}

/// Takes an announced connection (its slot stays held until the splice ends).
pub(crate) fn take(id: u64) -> Option<Claimed> {
    pending()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id)
        .map(Claimed)
}

/// A claimed connection.
pub(crate) struct Claimed(Pending);

/// Copies bytes both ways until each side has closed its half.
pub(crate) fn splice(host: &UnixStream, claimed: Claimed) -> io::Result<()> {
    let Pending { tcp, _slot } = claimed.0;
    splice_tcp(host, tcp)
}

/// Connects to `127.0.0.1:port` in the sandbox for the host (`berth port`): the connection
/// counts against [`MAX_LIVE`] like a forwarded one. `Err`: nothing listens there, or the
/// limit is reached (sent as the reply's exit frame).
pub(crate) fn connect(port: u16) -> Result<(TcpStream, impl Drop), Exit> {
    if LIVE.fetch_add(1, Ordering::SeqCst) >= MAX_LIVE {
        LIVE.fetch_sub(1, Ordering::SeqCst);
        return Err(Exit::SpawnFailed {
            kind: "limit".into(),
            message: format!("{MAX_LIVE} connections are already open through this sandbox"),
        });
    }
    let slot = Slot;
    match TcpStream::connect(("127.0.0.1", port)) {
        Ok(tcp) => {
            let _ = tcp.set_nodelay(true);
            Ok((tcp, slot))
        }
        Err(e) => Err(Exit::SpawnFailed {
            kind: if e.kind() == io::ErrorKind::ConnectionRefused {
                "refused".into()
            } else {
                "other".into()
            },
            message: format!("cannot connect to 127.0.0.1:{port} in the sandbox: {e}"),
        }),
    }
}

/// Copies bytes between `host` and `tcp` both ways until each side has closed its half.
pub fn splice_tcp(host: &UnixStream, tcp: TcpStream) -> io::Result<()> {
    let (mut host_in, mut tcp_out) = (host.try_clone()?, tcp.try_clone()?);
    let inbound = std::thread::spawn(move || {
        let _ = io::copy(&mut host_in, &mut tcp_out);
        let _ = tcp_out.shutdown(Shutdown::Write);
    });
    let (mut tcp_in, mut host_out) = (tcp, host.try_clone()?);
    let _ = io::copy(&mut tcp_in, &mut host_out);
    let _ = host_out.shutdown(Shutdown::Write);
    let _ = inbound.join();
    Ok(())
}
