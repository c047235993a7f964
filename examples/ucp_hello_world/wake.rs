//! The three ways a side waits for its worker (UCX's `-b`, `-w`, `-f`): spin on `progress`;
//! sleep in `Worker::wait`; or arm the worker and sleep in `poll(2)` on its event fd, where
//! `arm` answering `Busy` means "progress again instead of sleeping".

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use ucp::{Status, Worker};

/// How a side waits for its worker to have something to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Spin on `progress` (`-b`, the default).
    Busy,
    /// `Worker::wait` (`-w`).
    Wait,
    /// `Worker::arm` and `poll(2)` on `Worker::event_fd` (`-f`).
    Fd,
}

impl Wake {
    pub fn flag(self) -> &'static str {
        match self {
            Wake::Busy => "-b",
            Wake::Wait => "-w",
            Wake::Fd => "-f",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Wake::Busy => "busy polling",
            Wake::Wait => "Worker::wait",
            Wake::Fd => "event fd + poll",
        }
    }
}

/// A safety net for every wait: the example never hangs for good on a lost peer.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Progresses `w` until `done()` holds, sleeping between events as `mode` says; gives up
/// after [`DEADLINE`].
pub fn progress_until(w: &Worker, mode: Wake, what: &str, done: impl FnMut() -> bool) -> Result<(), String> {
    run(w, mode, Some((what, Instant::now() + DEADLINE)), done)
}

/// [`progress_until`] without a deadline (a server waiting for its clients).
#[allow(dead_code)] // the rpc example's
pub fn progress_until_forever(w: &Worker, mode: Wake, done: impl FnMut() -> bool) -> Result<(), String> {
    run(w, mode, None, done)
}

fn run(
    w: &Worker,
    mode: Wake,
    deadline: Option<(&str, Instant)>,
    mut done: impl FnMut() -> bool,
) -> Result<(), String> {
    loop {
        if mode == Wake::Busy {
            w.progress();
        } else {
            // Everything pending must be progressed before arming.
            while w.progress() > 0 {}
        }
        if done() {
            return Ok(());
        }
        if let Some((what, t)) = deadline {
            if Instant::now() > t {
                return Err(format!("timed out waiting for {what}"));
            }
        }
        match mode {
            Wake::Busy => {}
            Wake::Wait => w.wait().map_err(|e| format!("Worker::wait: {e}"))?,
            Wake::Fd => match w.arm() {
                // Sleep until the worker has events; wake each second for a deadline.
                Ok(()) => {
                    let fd = w.event_fd().map_err(|e| format!("Worker::event_fd: {e}"))?;
                    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                    match poll(&mut fds, PollTimeout::from(1000u16)) {
                        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                        Err(e) => return Err(format!("poll: {e}")),
                    }
                }
                Err(e) if e == Status::Busy => {}
                Err(e) => return Err(format!("Worker::arm: {e}")),
            },
        }
    }
}
