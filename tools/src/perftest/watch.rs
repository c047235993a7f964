//! Noticing that the peer is gone, in every loop that waits for it.
//!
//! A loop that waits for a message, an acknowledgement or a completion from the peer would
//! otherwise wait for ever once the peer died: a posted receive or a sequence number in memory
//! is tied to no connection, and a shared-memory transport has none to break. So each wait
//! loop ticks a [`PeerWatch`]; every [`CHECK_EVERY`] ticks (well under a millisecond of
//! progress calls) it looks at two things, out of the loop's straight line:
//! - a failure a transport reported (the uct interface's or the ucp endpoint's error handler
//!   records it with [`PeerWatch::fail`]);
//! - the out-of-band connection: the kernel closes a dead process's sockets, so a `poll` that
//!   reports the peer's end of the stream (`POLLRDHUP`, even behind data it wrote before
//!   dying) or a reset means the peer is gone. Neither side closes it before the last
//!   barrier, after which nothing waits any more.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use ucs::{Error, Result, Status};

/// Ticks between two checks (a power of two).
const CHECK_EVERY: u32 = 1 << 12;

/// What a side checks while it waits for its peer (see the [module](self) documentation).
pub struct PeerWatch {
    /// A duplicate of the out-of-band socket; none in loopback (`-l`), which has no peer.
    link: Option<OwnedFd>,
    failure: Rc<RefCell<Option<Error>>>,
    ticks: Cell<u32>,
}

impl PeerWatch {
    /// A watch over the out-of-band socket `link` (none: transport failures only).
    pub fn new(link: Option<OwnedFd>) -> PeerWatch {
        PeerWatch {
            link,
            failure: Rc::default(),
            ticks: Cell::new(0),
        }
    }

    /// What a transport's error handler records the failure in (for [`PeerWatch::fail`]).
    pub fn failure_slot(&self) -> Rc<RefCell<Option<Error>>> {
        self.failure.clone()
    }

    /// Records a transport's failure (the first one is kept).
    pub fn fail(slot: &RefCell<Option<Error>>, e: Error) {
        let mut s = slot.borrow_mut();
        if s.is_none() {
            *s = Some(e);
        }
    }

    /// One turn of a wait loop: an error once the peer is known to be gone.
    #[inline(always)]
    pub fn tick(&self) -> Result<()> {
        let n = self.ticks.get().wrapping_add(1);
        self.ticks.set(n);
        if n & (CHECK_EVERY - 1) == 0 {
            self.check()
        } else {
            Ok(())
        }
    }

    /// Looks now: a recorded transport failure, else the out-of-band connection's end.
    #[cold]
    #[inline(never)]
    pub fn check(&self) -> Result<()> {
        if let Some(e) = self.failure.borrow().as_ref() {
            return Err(Error::new(
                e.status(),
                format!(
                    "rucx-perftest: the connection to the peer failed: {}",
                    e.context().unwrap_or("(no detail)")
                ),
            ));
        }
        let Some(fd) = &self.link else { return Ok(()) };
        let ended = PollFlags::from_bits_retain(libc::POLLRDHUP) | PollFlags::POLLHUP | PollFlags::POLLERR;
        let mut pfd = [PollFd::new(fd.as_fd(), ended)];
        let gone = match poll(&mut pfd, PollTimeout::ZERO) {
            Ok(0) | Err(Errno::EINTR) => return Ok(()),
            // Only the events asked for come back (`revents` is `None` for `POLLRDHUP`, which
            // nix does not know).
            Ok(_) if pfd[0].revents().is_some_and(|r| r.contains(PollFlags::POLLERR)) => "failed",
            Ok(_) => "closed",
            Err(_) => return Ok(()),
        };
        Err(Error::new(
            Status::ConnectionReset,
            format!(
                "rucx-perftest: the peer is gone: the out-of-band connection to it {gone} \
                 (did it exit or get killed? see its output)"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn check_after_ticks(w: &PeerWatch) -> Result<()> {
        for _ in 0..CHECK_EVERY {
            w.tick()?;
        }
        Ok(())
    }

    #[test]
    fn peer_alive_then_closed() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let w = PeerWatch::new(Some(OwnedFd::from(a)));
        check_after_ticks(&w).unwrap();
        // Data waiting (the peer's next barrier) is no end.
        b.write_all(b"x").unwrap();
        check_after_ticks(&w).unwrap();
        check_after_ticks(&w).unwrap();
        // Closed behind that data: gone all the same.
        drop(b);
        let e = check_after_ticks(&w).unwrap_err();
        assert_eq!(e.status(), Status::ConnectionReset);
        assert!(e.to_string().contains("the peer is gone"), "{e}");
        // Over TCP (what server and client use).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let w = PeerWatch::new(Some(OwnedFd::from(c)));
        s.write_all(b"barrier").unwrap();
        check_after_ticks(&w).unwrap();
        drop(s);
        // The FIN arrives asynchronously on loopback: a bounded wait for it.
        let start = std::time::Instant::now();
        while check_after_ticks(&w).is_ok() {
            assert!(start.elapsed().as_secs() < 10, "the close was never noticed");
            std::thread::yield_now();
        }
    }

    #[test]
    fn transport_failure_is_reported() {
        let w = PeerWatch::new(None);
        check_after_ticks(&w).unwrap();
        let slot = w.failure_slot();
        PeerWatch::fail(&slot, Error::new(Status::ConnectionReset, "tcp/lo: reset"));
        PeerWatch::fail(&slot, Error::new(Status::TimedOut, "later"));
        let e = w.check().unwrap_err();
        assert_eq!(e.status(), Status::ConnectionReset);
        assert!(e.to_string().contains("tcp/lo: reset"), "{e}");
    }
}
