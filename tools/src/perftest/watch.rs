//! Noticing that the peer is gone, in every loop that waits for it.
//!
//! A loop that waits for a message, an acknowledgement or a completion from the peer would
//! otherwise wait for ever once the peer died: a posted receive or a sequence number in memory
//! is tied to no connection, and a shared-memory transport has none to break. So each wait
//! loop ticks a [`PeerWatch`]: a counter, and every [`CHECK_EVERY`] ticks a look, out of the
//! loop's straight line, at two things (the second, a system call, at most every
//! [`POLL_INTERVAL`], so that a loop that only spins on memory is not slowed by it):
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

use super::clock;

/// Ticks between two checks (a power of two).
const CHECK_EVERY: u32 = 1 << 12;
/// Seconds between two looks at the out-of-band connection.
const POLL_INTERVAL: f64 = 5e-3;

/// What a side checks while it waits for its peer (see the [module](self) documentation).
pub struct PeerWatch {
    /// A duplicate of the out-of-band socket; none in loopback (`-l`), which has no peer.
    link: Option<OwnedFd>,
    failure: Rc<RefCell<Option<Error>>>,
    ticks: Cell<u32>,
    /// [`clock::ticks`] at the last look at `link`, and the clock's ticks between two.
    polled: Cell<u64>,
    poll_every: u64,
}

impl PeerWatch {
    /// A watch over the out-of-band socket `link` (none: transport failures only).
    pub fn new(link: Option<OwnedFd>) -> PeerWatch {
        PeerWatch {
            link,
            failure: Rc::default(),
            ticks: Cell::new(0),
            polled: Cell::new(clock::ticks()),
            poll_every: clock::ticks_from_sec(POLL_INTERVAL),
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
            self.due()
        } else {
            Ok(())
        }
    }

    /// Every [`CHECK_EVERY`] ticks: [`PeerWatch::check`] when [`POLL_INTERVAL`] has passed,
    /// else only the recorded failure.
    #[cold]
    #[inline(never)]
    fn due(&self) -> Result<()> {
        let now = clock::ticks();
        if now.wrapping_sub(self.polled.get()) >= self.poll_every {
            self.polled.set(now);
            return self.check();
        }
        self.recorded()
    }

    /// A failure a transport's error handler recorded.
    fn recorded(&self) -> Result<()> {
        if let Some(e) = self.failure.borrow().as_ref() {
            return Err(Error::new(
                e.status(),
                format!(
                    "rucx-perftest: the connection to the peer failed: {}",
                    e.context().unwrap_or("(no detail)")
                ),
            ));
        }
        Ok(())
    }

    /// Looks now: a recorded transport failure, else the out-of-band connection's end.
    pub fn check(&self) -> Result<()> {
        self.recorded()?;
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
        w.check().unwrap();
        // Data waiting (the peer's next barrier) is no end.
        b.write_all(b"x").unwrap();
        w.check().unwrap();
        check_after_ticks(&w).unwrap();
        // Closed behind that data: gone all the same.
        drop(b);
        let e = w.check().unwrap_err();
        assert_eq!(e.status(), Status::ConnectionReset);
        assert!(e.to_string().contains("the peer is gone"), "{e}");
        // Over TCP (what server and client use).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let w = PeerWatch::new(Some(OwnedFd::from(c)));
        s.write_all(b"barrier").unwrap();
        w.check().unwrap();
        drop(s);
        // Ticks alone notice it (the FIN arrives asynchronously, and the socket is looked at
        // every POLL_INTERVAL): a bounded wait.
        let start = std::time::Instant::now();
        while check_after_ticks(&w).is_ok() {
            assert!(start.elapsed().as_secs() < 10, "the close was never noticed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn transport_failure_is_reported() {
        let (a, _b) = UnixStream::pair().unwrap();
        let w = PeerWatch::new(Some(OwnedFd::from(a)));
        check_after_ticks(&w).unwrap();
        let slot = w.failure_slot();
        PeerWatch::fail(&slot, Error::new(Status::ConnectionReset, "tcp/lo: reset"));
        PeerWatch::fail(&slot, Error::new(Status::TimedOut, "later"));
        // At the next check, whether or not the socket is due for a look.
        let e = check_after_ticks(&w).unwrap_err();
        assert_eq!(e.status(), Status::ConnectionReset);
        assert!(e.to_string().contains("tcp/lo: reset"), "{e}");
        assert!(PeerWatch::new(None).check().is_ok());
    }
}
