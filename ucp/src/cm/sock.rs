//! Sockets of the connection manager, watched by the worker's async context: its background
//! thread (or, in poll mode, its progress) notices readiness, a handler records it, and the
//! connection manager's progress callback does the I/O on the worker's thread. So a connection
//! in its handshake costs an idle `progress` no system call of its own.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use ucs::async_ctx::{AsyncContext, Events, HandlerId};
use ucs::{Error, Result, Status};

/// A socket with an fd handler on the async context. The handler is removed before the socket
/// closes (the async context needs the fd open while it watches it).
pub(crate) struct Watched<S: AsFd> {
    actx: AsyncContext,
    id: Option<HandlerId>,
    events: Arc<AtomicU32>,
    pub sock: S,
}

impl<S: AsFd> Watched<S> {
    /// Watches `sock` for `interest`; readiness sets `any` too.
    pub fn new(actx: &AsyncContext, sock: S, interest: Events, any: &Arc<AtomicBool>) -> Result<Self> {
        let events = Arc::new(AtomicU32::new(0));
        let (ev, any) = (events.clone(), any.clone());
        let id = actx
            .add_fd_handler(sock.as_fd().as_raw_fd(), interest, move |e: Events| {
                ev.fetch_or(e.bits(), Ordering::Relaxed);
                any.store(true, Ordering::Release);
            })
            .map_err(|e| e.context_with("ucp: connection manager: watching a socket"))?;
        Ok(Watched {
            actx: actx.clone(),
            id: Some(id),
            events,
            sock,
        })
    }

    /// Records a read event as if the socket had reported one (look at it on the next progress).
    pub fn poke(&self) {
        self.events.fetch_or(Events::READ.bits(), Ordering::Relaxed);
    }

    /// Changes the events watched (a connecting socket waits to be writable, then readable).
    pub fn set_interest(&self, interest: Events) -> Result<()> {
        match self.id {
            Some(id) => self
                .actx
                .modify_fd_handler(id, interest)
                .map_err(|e| e.context_with("ucp: connection manager: watching a socket")),
            None => Ok(()),
        }
    }

    /// The events seen since the last call.
    pub fn take_events(&self) -> Events {
        Events::from_bits_truncate(self.events.swap(0, Ordering::Relaxed))
    }
}

impl<S: AsFd> Drop for Watched<S> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.actx.remove_handler(id, false);
        }
    }
}

/// A TCP socket connecting to `to` without blocking: it becomes writable once connected or
/// refused (then `TcpStream::take_error` says which).
pub(crate) fn connect_nonblocking(to: SocketAddr) -> Result<TcpStream> {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, SockaddrStorage};
    let family = if to.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| io_error(to, "connect to", &io::Error::from(e)))?;
    match connect(fd.as_raw_fd(), &SockaddrStorage::from(to)) {
        Ok(()) | Err(Errno::EINPROGRESS) | Err(Errno::EINTR) => Ok(TcpStream::from(fd)),
        Err(e) => Err(io_error(to, "connect to", &io::Error::from(e))),
    }
}

/// The status and words for a failed connection to or with `to` (`what`: connect, read...).
pub(crate) fn io_error(to: SocketAddr, what: &str, e: &io::Error) -> Error {
    use io::ErrorKind as K;
    let (st, why) = match e.kind() {
        K::ConnectionRefused => (
            Status::Unreachable,
            "nothing listens there (connection refused)".to_string(),
        ),
        K::TimedOut | K::WouldBlock => (Status::TimedOut, "no answer in time".to_string()),
        K::ConnectionReset | K::BrokenPipe | K::ConnectionAborted | K::UnexpectedEof => {
            (Status::ConnectionReset, format!("the connection broke ({e})"))
        }
        K::AddrNotAvailable | K::NetworkUnreachable | K::HostUnreachable | K::NetworkDown => {
            (Status::Unreachable, format!("no route ({e})"))
        }
        _ => (Status::IoError, e.to_string()),
    };
    Error::new(st, format!("ucp: {what} {to}: {why}"))
}
