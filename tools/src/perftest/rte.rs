//! The out-of-band "run-time environment" between the two sides (UCX's socket RTE): group size
//! and index, length-prefixed blobs, a barrier and a collective status, all over one TCP
//! connection (server: index 0, client: index 1) or a socket pair (`-L`); `-l` is a group of
//! one where the blob a side posts is the blob it receives.
//!
//! While waiting for the peer it keeps progressing the worker (a peer may need our progress to
//! finish its flush), as UCX does with `poll(1 ms)` between progress calls.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use ucs::{Error, Result, Status};

use super::watch::PeerWatch;

/// The connection to the peer.
pub enum Link {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Link {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Link::Tcp(s) => s.read(b),
            Link::Unix(s) => s.read(b),
        }
    }

    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Link::Tcp(s) => s.write(b),
            Link::Unix(s) => s.write(b),
        }
    }

    /// Waits up to `ms` milliseconds for the link to be readable (or closed).
    fn poll_readable(&self, ms: u16) -> std::io::Result<bool> {
        let fd = match self {
            Link::Tcp(s) => s.as_fd(),
            Link::Unix(s) => s.as_fd(),
        };
        let mut pfd = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut pfd, PollTimeout::from(ms)) {
            Ok(n) => Ok(n > 0),
            Err(Errno::EINTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// The group this process belongs to.
pub enum Rte {
    Loopback { posted: Vec<u8> },
    Sock { link: Link, is_server: bool },
}

fn io_err(what: &str, e: std::io::Error) -> Error {
    ucs::error!("out-of-band connection: {what} failed: {e}");
    if matches!(
        e.kind(),
        ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe | ErrorKind::ConnectionReset
    ) {
        Status::ConnectionReset.into()
    } else {
        Status::IoError.into()
    }
}

/// The error for a collective status ([`Rte::exchange_status`]) that is not `Ok` where the
/// run cannot go on: the status itself, or `IoError` for a status that is no error (a peer
/// out of step with us sent `InProgress` where it should have sent `Ok`).
pub fn status_error(st: Status) -> Error {
    if st.is_err() {
        st.into()
    } else {
        Error::new(
            Status::IoError,
            format!(
                "the peer answered {} out of step: it is not a matching rucx-perftest",
                st.name()
            ),
        )
    }
}

/// Listens on `port` (all addresses), accepts one client and closes the listener, printing
/// what `ucx_perftest` prints.
pub fn accept(port: u16, ipv6: bool) -> Result<(TcpStream, SocketAddr)> {
    let any: SocketAddr = if ipv6 {
        (std::net::Ipv6Addr::UNSPECIFIED, port).into()
    } else {
        ([0, 0, 0, 0], port).into()
    };
    // std sets SO_REUSEADDR on listeners, as UCX does.
    let l = TcpListener::bind(any).map_err(|e| {
        ucs::error!("server failed. bind() failed: {e} (is another server on port {port}? use -p)");
        Status::IoError
    })?;
    println!("Waiting for connection...");
    let _ = std::io::stdout().flush();
    let (s, peer) = l.accept().map_err(|e| io_err("accept()", e))?;
    println!("Accepted connection from {peer}");
    Ok((s, peer))
}

/// Connects to `host:port`.
pub fn connect(host: &str, port: u16, ipv6: bool) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            ucs::error!("getaddrinfo(server:{host}, port:{port}) error: [{e}]");
            Status::IoError
        })?
        .filter(|a| a.is_ipv6() == ipv6)
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect(a) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => {
            ucs::error!("client failed. connect() failed: {e} (is the server running on {host}:{port}?)")
        }
        None => ucs::error!(
            "client failed. no {} address for {host}",
            if ipv6 { "IPv6" } else { "IPv4" }
        ),
    }
    Err(Status::IoError.into())
}

impl Rte {
    /// A group over a connected stream.
    pub fn sock(link: Link, is_server: bool) -> Result<Rte> {
        if let Link::Tcp(s) = &link {
            let _ = s.set_nodelay(true);
        }
        Ok(Rte::Sock { link, is_server })
    }

    /// A [`PeerWatch`] over this group's connection (loopback: none, transport failures
    /// only).
    pub fn watch(&self) -> Result<PeerWatch> {
        let fd = match self {
            Rte::Loopback { .. } => return Ok(PeerWatch::new(None)),
            Rte::Sock {
                link: Link::Tcp(s), ..
            } => s.as_fd().try_clone_to_owned(),
            Rte::Sock {
                link: Link::Unix(s), ..
            } => s.as_fd().try_clone_to_owned(),
        };
        let fd = fd.map_err(|e| io_err("dup() of the socket", e))?;
        Ok(PeerWatch::new(Some(fd)))
    }

    /// 1 for loopback, else 2.
    #[cfg(test)]
    fn group_size(&self) -> usize {
        match self {
            Rte::Loopback { .. } => 1,
            Rte::Sock { .. } => 2,
        }
    }

    /// 0 for the server (and loopback), 1 for the client.
    pub fn group_index(&self) -> usize {
        match self {
            Rte::Sock { is_server: false, .. } => 1,
            _ => 0,
        }
    }

    /// The peer's index (UCX's `rte_peer_index`: itself in a group of one).
    #[cfg(test)]
    fn peer_index(&self) -> usize {
        self.group_size() - 1 - self.group_index()
    }

    /// Writes all of `data`; writes of these sizes do not block for long, so no progress.
    fn write_all(link: &mut Link, data: &[u8]) -> Result<()> {
        let mut off = 0;
        while off < data.len() {
            match link.write(&data[off..]) {
                Ok(0) => return Err(io_err("send()", ErrorKind::WriteZero.into())),
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("send()", e)),
            }
        }
        Ok(())
    }

    /// Fills `buf`, calling `progress` about every millisecond while waiting: `poll()` with a
    /// 1 ms timeout, as UCX's `sock_io`. (Not a socket receive timeout: the kernel rounds
    /// `SO_RCVTIMEO` up to scheduler ticks, and a side in a barrier would progress too rarely
    /// for its peer's final flush, which waits for the last put's acknowledgement.)
    fn read_exact(link: &mut Link, buf: &mut [u8], progress: &mut dyn FnMut()) -> Result<()> {
        let mut off = 0;
        while off < buf.len() {
            if link.poll_readable(1).map_err(|e| io_err("poll()", e))? {
                match link.read(&mut buf[off..]) {
                    Ok(0) => {
                        ucs::error!(
                            "out-of-band connection closed by the peer (did it fail? see its output)"
                        );
                        return Err(Status::ConnectionReset.into());
                    }
                    Ok(n) => off += n,
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                    Err(e) => return Err(io_err("recv()", e)),
                }
            }
            progress();
        }
        Ok(())
    }

    /// Posts `data` for the peer (`post_vec`): 8-byte little-endian length, then the bytes.
    pub fn post(&mut self, data: &[u8]) -> Result<()> {
        match self {
            Rte::Loopback { posted } => {
                *posted = data.to_vec();
                Ok(())
            }
            Rte::Sock { link, .. } => {
                Self::write_all(link, &(data.len() as u64).to_le_bytes())?;
                Self::write_all(link, data)
            }
        }
    }

    /// Receives what the peer posted (at most `max` bytes).
    pub fn recv(&mut self, max: usize, progress: &mut dyn FnMut()) -> Result<Vec<u8>> {
        match self {
            Rte::Loopback { posted } => Ok(std::mem::take(posted)),
            Rte::Sock { link, .. } => {
                let mut len = [0u8; 8];
                Self::read_exact(link, &mut len, progress)?;
                let len = u64::from_le_bytes(len);
                if len > max as u64 {
                    ucs::error!(
                        len,
                        max,
                        "out-of-band message too long: the peer is not a matching rucx-perftest"
                    );
                    return Err(Status::MessageTruncated.into());
                }
                let mut v = vec![0; len as usize];
                Self::read_exact(link, &mut v, progress)?;
                Ok(v)
            }
        }
    }

    /// Waits until the peer reaches its barrier too, progressing meanwhile.
    pub fn barrier(&mut self, progress: &mut dyn FnMut()) -> Result<()> {
        const MAGIC: u32 = 0xdead_beef;
        match self {
            Rte::Loopback { .. } => Ok(()),
            Rte::Sock { link, .. } => {
                Self::write_all(link, &MAGIC.to_le_bytes())?;
                let mut b = [0u8; 4];
                Self::read_exact(link, &mut b, progress)?;
                if u32::from_le_bytes(b) != MAGIC {
                    ucs::error!("out-of-band barrier out of step with the peer");
                    return Err(Status::IoError.into());
                }
                Ok(())
            }
        }
    }

    /// Tells the peer our status and returns the collective one (UCX's
    /// `ucx_perf_test_exchange_status`: the peer's non-OK status wins, then ours).
    pub fn exchange_status(&mut self, own: Status, progress: &mut dyn FnMut()) -> Result<Status> {
        self.post(&[own.as_raw() as u8])?;
        let peer = self.recv(1, progress)?;
        let peer = peer
            .first()
            .map_or(Status::IoError, |&b| Status::from_raw(b as i8));
        Ok(if peer != Status::Ok { peer } else { own })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_receives_what_it_posted() {
        let mut r = Rte::Loopback { posted: Vec::new() };
        assert_eq!((r.group_size(), r.group_index(), r.peer_index()), (1, 0, 0));
        r.post(b"abc").unwrap();
        assert_eq!(r.recv(10, &mut || {}).unwrap(), b"abc");
        r.barrier(&mut || {}).unwrap();
        assert_eq!(
            r.exchange_status(Status::InProgress, &mut || {}).unwrap(),
            Status::InProgress
        );
    }

    #[test]
    fn socket_pair_exchanges_blobs_barriers_and_status() {
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let mut r = Rte::sock(Link::Unix(b), false).unwrap();
            assert_eq!((r.group_index(), r.peer_index()), (1, 0));
            r.post(b"from client").unwrap();
            let got = r.recv(100, &mut || {}).unwrap();
            r.barrier(&mut || {}).unwrap();
            let st = r.exchange_status(Status::Ok, &mut || {}).unwrap();
            (got, st)
        });
        let mut r = Rte::sock(Link::Unix(a), true).unwrap();
        let mut spins = 0;
        r.post(b"from server").unwrap();
        assert_eq!(r.recv(100, &mut || spins += 1).unwrap(), b"from client");
        r.barrier(&mut || {}).unwrap();
        assert_eq!(
            r.exchange_status(Status::Unsupported, &mut || {}).unwrap(),
            Status::Unsupported
        );
        let (got, st) = t.join().unwrap();
        assert_eq!(got, b"from server");
        assert_eq!(st, Status::Unsupported);
    }

    #[test]
    fn oversized_or_closed_peer_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut r = Rte::sock(Link::Unix(a), true).unwrap();
        let mut w = Rte::sock(Link::Unix(b), false).unwrap();
        w.post(&[0; 32]).unwrap();
        assert_eq!(r.recv(8, &mut || {}).unwrap_err(), Status::MessageTruncated);
        drop(w);
        assert_eq!(r.barrier(&mut || {}).unwrap_err(), Status::ConnectionReset);
    }

    /// `recv` over whatever a peer may write: a random length prefix (sometimes huge), then
    /// all, part or none of the bytes, then the peer closes. Never a panic or an allocation of
    /// the announced size: the blob, `MessageTruncated` or `ConnectionReset`.
    #[test]
    fn recv_survives_random_truncated_and_oversized_blobs() {
        let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n.max(1)
        };
        for _ in 0..500 {
            let (a, b) = UnixStream::pair().unwrap();
            let mut r = Rte::sock(Link::Unix(a), true).unwrap();
            let max = next(300) as usize;
            let len = match next(4) {
                0 => u64::MAX - next(1000),
                1 => next(1 << 40),
                _ => next(400),
            };
            let mut raw = len.to_le_bytes().to_vec();
            let body = len.min(400);
            raw.extend((0..body).map(|i| i as u8));
            let sent = match next(3) {
                0 => next(raw.len() as u64 + 1) as usize, // cut anywhere, maybe in the prefix
                _ => raw.len(),
            };
            let mut w = Link::Unix(b);
            Rte::write_all(&mut w, &raw[..sent]).unwrap();
            drop(w);
            let got = r.recv(max, &mut || {});
            if sent < 8 {
                assert_eq!(got, Err(Status::ConnectionReset.into()));
            } else if len > max as u64 {
                assert_eq!(got, Err(Status::MessageTruncated.into()));
            } else if (sent - 8) as u64 == len {
                assert_eq!(got.unwrap(), &raw[8..]);
            } else {
                assert_eq!(got, Err(Status::ConnectionReset.into()));
            }
        }
    }
}
