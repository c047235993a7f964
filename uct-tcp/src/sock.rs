//! Socket plumbing: non-blocking connect, listening on a port range, socket options, and the
//! `send`/`sendmsg`/`recv` calls of the data path (all with `MSG_NOSIGNAL`: a closed peer is
//! an error return, never a `SIGPIPE`), the latter made by `sys` without libc's cancellation
//! wrappers.

use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::{self, sockopt, AddressFamily, MsgFlags, SockFlag, SockType, SockaddrIn, SockaddrIn6};
use ucs::{Result, Status};

use crate::config::{Congestion, TcpConfig};
use crate::sys;

const SEND_FLAGS: i32 = MsgFlags::MSG_NOSIGNAL.union(MsgFlags::MSG_DONTWAIT).bits();

/// `send()` of one buffer.
#[inline]
pub fn send(sock: &TcpStream, buf: &[u8]) -> std::result::Result<usize, Errno> {
    loop {
        match sys::send(sock.as_raw_fd(), buf, SEND_FLAGS) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// `sendmsg()` gathering `iov`.
#[inline]
pub fn sendv(sock: &TcpStream, iov: &[IoSlice<'_>]) -> std::result::Result<usize, Errno> {
    loop {
        match sys::sendv(sock.as_raw_fd(), iov, SEND_FLAGS) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// `recv()` into `buf`; `Ok(0)` is end of stream.
#[inline]
pub fn recv(sock: &TcpStream, buf: &mut [u8]) -> std::result::Result<usize, Errno> {
    loop {
        match sys::recv(sock.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT.bits()) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

/// Sets TCP_CONGESTION; a refusal is logged once per process (a name the kernel lacks or does
/// not allow would otherwise be logged for every connection) and the connection goes on with
/// the system's default.
fn set_congestion(sock: &TcpStream, name: &str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let r = socket::setsockopt(sock, sockopt::TcpCongestion, &std::ffi::OsString::from(name));
    if let Err(e) = r {
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            ucs::warn!(
                "tcp: congestion control {name:?} refused ({e}); connections use the system's default. \
                 Pick one listed in /proc/sys/net/ipv4/tcp_allowed_congestion_control (or \
                 tcp_available_congestion_control, with CAP_NET_ADMIN) with RUCX_TCP_CONGESTION, \
                 or set it to default"
            );
        }
    }
}

/// The status a failed socket call reports.
pub fn errno_status(e: Errno) -> Status {
    match e {
        Errno::ECONNRESET | Errno::EPIPE | Errno::ECONNABORTED | Errno::ENOTCONN | Errno::ESHUTDOWN => {
            Status::ConnectionReset
        }
        Errno::ETIMEDOUT => Status::EndpointTimeout,
        Errno::ECONNREFUSED => Status::Rejected,
        Errno::EHOSTUNREACH
        | Errno::ENETUNREACH
        | Errno::EHOSTDOWN
        | Errno::ENETDOWN
        | Errno::EADDRNOTAVAIL => Status::Unreachable,
        Errno::ENOMEM | Errno::ENOBUFS => Status::NoMemory,
        _ => Status::IoError,
    }
}

/// The pending error of a socket (`SO_ERROR`), if any.
pub fn so_error(sock: &TcpStream) -> Option<Errno> {
    match socket::getsockopt(sock, sockopt::SocketError) {
        Ok(0) => None,
        Ok(e) => Some(Errno::from_raw(e)),
        Err(e) => Some(e),
    }
}

/// Applies the configured options to a data socket. Failures are logged and ignored (the
/// connection works without them), except that of making it non-blocking.
pub fn configure(sock: &TcpStream, cfg: &TcpConfig) -> Result<()> {
    sock.set_nonblocking(true).map_err(|e| {
        ucs::error!("tcp: cannot make a socket non-blocking: {e}");
        Status::IoError
    })?;
    let warn = |what: &str, r: nix::Result<()>| {
        if let Err(e) = r {
            ucs::warn!("tcp: setsockopt({what}) failed: {e}; continuing without it");
        }
    };
    if cfg.nodelay {
        warn(
            "TCP_NODELAY",
            socket::setsockopt(sock, sockopt::TcpNoDelay, &true),
        );
    }
    if let Congestion::Named(name) = &cfg.congestion {
        set_congestion(sock, name);
    }
    if let Some(b) = cfg.sndbuf {
        warn("SO_SNDBUF", socket::setsockopt(sock, sockopt::SndBuf, &b));
    }
    if let Some(b) = cfg.rcvbuf {
        warn("SO_RCVBUF", socket::setsockopt(sock, sockopt::RcvBuf, &b));
    }
    if let Some(k) = cfg.keepalive {
        warn(
            "SO_KEEPALIVE",
            socket::setsockopt(sock, sockopt::KeepAlive, &true),
        );
        warn(
            "TCP_KEEPIDLE",
            socket::setsockopt(sock, sockopt::TcpKeepIdle, &k.idle_s),
        );
        warn(
            "TCP_KEEPINTVL",
            socket::setsockopt(sock, sockopt::TcpKeepInterval, &k.intvl_s),
        );
        warn(
            "TCP_KEEPCNT",
            socket::setsockopt(sock, sockopt::TcpKeepCount, &k.cnt),
        );
    }
    if let Some(ms) = cfg.user_timeout_ms {
        warn(
            "TCP_USER_TIMEOUT",
            socket::setsockopt(sock, sockopt::TcpUserTimeout, &ms),
        );
    }
    Ok(())
}

fn family(addr: &SocketAddr) -> AddressFamily {
    if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn bind(fd: &OwnedFd, addr: SocketAddr) -> nix::Result<()> {
    match addr {
        SocketAddr::V4(a) => socket::bind(fd.as_raw_fd(), &SockaddrIn::from(a)),
        SocketAddr::V6(a) => socket::bind(fd.as_raw_fd(), &SockaddrIn6::from(a)),
    }
}

/// Starts a non-blocking connect to `target`, from `local` (the device's address, so the
/// connection leaves through the device; skipped if that bind fails). Returns the socket and
/// whether it connected at once.
pub fn start_connect(
    target: SocketAddr,
    local: Option<SocketAddr>,
    cfg: &TcpConfig,
) -> Result<(TcpStream, bool)> {
    let fd = socket::socket(
        family(&target),
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| {
        ucs::error!("tcp: socket() failed: {e} (out of file descriptors? raise `ulimit -n`)");
        errno_status(e)
    })?;
    if let Some(l) = local.filter(|l| l.is_ipv4() == target.is_ipv4()) {
        if let Err(e) = bind(&fd, l) {
            ucs::debug!("tcp: binding the source address {l} failed ({e}); letting the kernel choose");
        }
    }
    let r = match target {
        SocketAddr::V4(a) => socket::connect(fd.as_raw_fd(), &SockaddrIn::from(a)),
        SocketAddr::V6(a) => socket::connect(fd.as_raw_fd(), &SockaddrIn6::from(a)),
    };
    let sock = TcpStream::from(fd);
    configure(&sock, cfg)?;
    match r {
        Ok(()) => Ok((sock, true)),
        Err(Errno::EINPROGRESS) | Err(Errno::EINTR) => Ok((sock, false)),
        Err(e) => {
            ucs::debug!("tcp: connect to {target} failed at once: {e}");
            Err(errno_status(e).into())
        }
    }
}

/// Listens on `ip` (IPv6 link-local addresses need `scope_id`), on any port or the first free
/// one of `range`.
pub fn listen(ip: IpAddr, scope_id: u32, range: Option<(u16, u16)>) -> Result<TcpListener> {
    let addr = |port: u16| match ip {
        IpAddr::V4(a) => SocketAddr::new(IpAddr::V4(a), port),
        IpAddr::V6(a) => SocketAddr::V6(std::net::SocketAddrV6::new(a, port, 0, scope_id)),
    };
    let (first, last) = range.unwrap_or((0, 0));
    let mut last_err = None;
    for port in first..=last {
        match TcpListener::bind(addr(port)) {
            Ok(l) => {
                // std listens with a backlog of 128: a burst of connects beyond it (1000
                // endpoints created at once) loses SYNs, which the kernel retries only after
                // a second. Ask for the system's maximum (net.core.somaxconn), as UCX does.
                if let Err(e) = socket::listen(&l, socket::Backlog::MAXCONN) {
                    ucs::warn!("tcp: listen(SOMAXCONN) failed: {e}; keeping a backlog of 128");
                }
                l.set_nonblocking(true).map_err(|e| {
                    ucs::error!("tcp: cannot make the listening socket non-blocking: {e}");
                    Status::IoError
                })?;
                return Ok(l);
            }
            Err(e) => last_err = Some(e),
        }
    }
    let e = last_err.map_or_else(|| "empty range".to_string(), |e| e.to_string());
    match range {
        Some((a, b)) => ucs::error!(
            "tcp: cannot listen on {ip} in ports {a}-{b}: {e}; widen RUCX_TCP_PORT_RANGE or free a port"
        ),
        None => ucs::error!("tcp: cannot listen on {ip}: {e}"),
    }
    Err(Status::IoError.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_reach_the_socket() {
        let l = listen("127.0.0.1".parse().unwrap(), 0, None).unwrap();
        let target = l.local_addr().unwrap();
        let mut cfg = TcpConfig::read().unwrap();
        cfg.sndbuf = Some(1 << 16);
        let (s, _) = start_connect(target, Some("127.0.0.1:0".parse().unwrap()), &cfg).unwrap();
        assert!(socket::getsockopt(&s, sockopt::KeepAlive).unwrap());
        assert_eq!(socket::getsockopt(&s, sockopt::TcpKeepIdle).unwrap(), 10);
        assert_eq!(socket::getsockopt(&s, sockopt::TcpKeepInterval).unwrap(), 2);
        assert_eq!(socket::getsockopt(&s, sockopt::TcpKeepCount).unwrap(), 3);
        assert_eq!(socket::getsockopt(&s, sockopt::TcpUserTimeout).unwrap(), 16_000);
        assert!(socket::getsockopt(&s, sockopt::TcpNoDelay).unwrap());
        assert_eq!(cfg.congestion, Congestion::Auto);
        assert_eq!(cc(&s), system_cc());
        // The kernel doubles SO_SNDBUF for its bookkeeping.
        assert!(socket::getsockopt(&s, sockopt::SndBuf).unwrap() >= 1 << 16);
        assert_eq!(errno_status(Errno::ETIMEDOUT), Status::EndpointTimeout);
        assert_eq!(errno_status(Errno::ECONNRESET), Status::ConnectionReset);
    }

    fn cc(s: &TcpStream) -> String {
        let v = socket::getsockopt(s, sockopt::TcpCongestion).unwrap();
        v.to_string_lossy().trim_end_matches('\0').to_string()
    }

    fn system_cc() -> String {
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .unwrap()
            .trim()
            .to_string()
    }

    #[test]
    fn congestion_control_reaches_both_ends() {
        let l = listen("127.0.0.1".parse().unwrap(), 0, None).unwrap();
        let target = l.local_addr().unwrap();
        let cfg = TcpConfig::read().unwrap().for_device(true);
        assert_eq!(cfg.congestion, Congestion::Named("reno".into()));
        let (s, _) = start_connect(target, None, &cfg).unwrap();
        assert_eq!(cc(&s), "reno");
        let (a, _) = l.accept().unwrap();
        configure(&a, &cfg).unwrap();
        assert_eq!(cc(&a), "reno");
        // The system's default when told so.
        let mut d = cfg.clone();
        d.congestion = Congestion::System;
        let (s2, _) = start_connect(target, None, &d).unwrap();
        assert_eq!(cc(&s2), system_cc());
    }

    #[test]
    fn unknown_congestion_control_is_not_fatal() {
        let l = listen("127.0.0.1".parse().unwrap(), 0, None).unwrap();
        let target = l.local_addr().unwrap();
        let mut cfg = TcpConfig::read().unwrap();
        cfg.congestion = Congestion::Named("no_such_cc".into());
        let (s, _) = start_connect(target, None, &cfg).unwrap();
        assert_eq!(cc(&s), system_cc());
        let (mut a, _) = l.accept().unwrap();
        // The connection works.
        let mut s = s;
        s.set_nonblocking(false).unwrap();
        std::io::Write::write_all(&mut s, b"ok").unwrap();
        let mut b = [0u8; 2];
        std::io::Read::read_exact(&mut a, &mut b).unwrap();
        assert_eq!(&b, b"ok");
    }

    #[test]
    fn port_range_is_honoured() {
        let probe = listen("127.0.0.1".parse().unwrap(), 0, None).unwrap();
        let p = probe.local_addr().unwrap().port();
        drop(probe);
        let l = listen("127.0.0.1".parse().unwrap(), 0, Some((p, p))).unwrap();
        assert_eq!(l.local_addr().unwrap().port(), p);
        // The backlog is the system's maximum, not std's 128.
        let mut ss = std::process::Command::new("ss");
        if let Ok(out) = ss.args(["-ltnH", &format!("sport = :{p}")]).output() {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(q) = text.split_whitespace().nth(2) {
                assert_ne!(q, "128", "listen backlog: {text}");
            }
        }
        // The only port of the range is taken now.
        assert_eq!(
            listen("127.0.0.1".parse().unwrap(), 0, Some((p, p))).err(),
            Some(Status::IoError.into())
        );
    }
}
