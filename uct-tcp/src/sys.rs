//! The data path's system calls (`sendto`, `sendmsg`, `recvfrom`, `epoll_wait`), made with
//! `syscall(2)` rather than through libc's wrappers.
//!
//! Why: these calls are POSIX cancellation points, so in a process with more than one thread
//! (every rucx process: the async thread) glibc wraps each in `__pthread_enable_asynccancel` /
//! `__pthread_disable_asynccancel`, two atomic read-modify-writes of the thread's cancel state.
//! Measured with callgrind on tcp am_lat 8000 B: 121 instructions per message on the client, a
//! tenth of the transport's own user path, for a feature rucx never uses (nothing in a Rust
//! program calls `pthread_cancel` on our threads). `syscall()` itself is a plain stub.
//!
//! The crate's second unsafe module besides `direct`: raw pointers into the caller's slices
//! are handed to the kernel, which reads or writes within the lengths given.
#![allow(unsafe_code)]

use std::io::IoSlice;
use std::os::fd::RawFd;

use nix::errno::Errno;
use nix::libc;
use nix::sys::epoll::EpollFlags;

/// One epoll event as the kernel writes it (`packed` on x86-64: read fields by value).
pub type Event = libc::epoll_event;

/// An event slot before the kernel fills it.
pub const EMPTY_EVENT: Event = libc::epoll_event { events: 0, u64: 0 };

/// The token registered with the event's file descriptor.
#[inline]
pub fn ev_token(ev: &Event) -> u64 {
    ev.u64
}

/// What the event reports.
#[inline]
pub fn ev_flags(ev: &Event) -> EpollFlags {
    EpollFlags::from_bits_retain(ev.events as i32)
}

/// A `syscall()` result: the count, or the errno it set.
#[inline]
fn result(r: libc::c_long) -> Result<usize, Errno> {
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r as usize)
    }
}

/// `send(fd, buf, flags)`.
#[inline]
pub fn send(fd: RawFd, buf: &[u8], flags: libc::c_int) -> Result<usize, Errno> {
    // SAFETY: the kernel reads at most `buf.len()` bytes from `buf`, which is borrowed for the
    // call; a null address with length 0 is `send()` as `sendto()`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sendto,
            fd,
            buf.as_ptr(),
            buf.len(),
            flags,
            std::ptr::null::<libc::sockaddr>(),
            0 as libc::socklen_t,
        )
    };
    result(r)
}

/// `recv(fd, buf, flags)`.
#[inline]
pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> Result<usize, Errno> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`, which is borrowed
    // mutably for the call; null address pointers ask for no source address.
    let r = unsafe {
        libc::syscall(
            libc::SYS_recvfrom,
            fd,
            buf.as_mut_ptr(),
            buf.len(),
            flags,
            std::ptr::null_mut::<libc::sockaddr>(),
            std::ptr::null_mut::<libc::socklen_t>(),
        )
    };
    result(r)
}

/// `sendmsg(fd, {iov}, flags)`: gathers `iov`, no address, no control data.
#[inline]
pub fn sendv(fd: RawFd, iov: &[IoSlice<'_>], flags: libc::c_int) -> Result<usize, Errno> {
    // SAFETY (of the zeroed value): `msghdr` is plain data; all-zero is "no name, no iov, no
    // control data".
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is ABI-compatible with `iovec` on Unix (documented by std); the kernel only
    // reads through this pointer.
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` points at `iov`, borrowed for the call, with its length; the kernel reads
    // the header and the buffers the entries describe, all valid for the call.
    let r = unsafe { libc::syscall(libc::SYS_sendmsg, fd, &msg as *const libc::msghdr, flags) };
    result(r)
}

/// `epoll_wait(epfd, events, timeout_ms)`: the `epoll_wait` system call where the architecture
/// has it (x86-64; a little less kernel work than `epoll_pwait`, which checks and restores a
/// signal mask), else `epoll_pwait` with no signal mask.
#[inline]
pub fn epoll_wait(epfd: RawFd, events: &mut [Event], timeout_ms: libc::c_int) -> Result<usize, Errno> {
    let max = events.len().min(libc::c_int::MAX as usize) as libc::c_int;
    // SAFETY: the kernel writes at most `max` events into `events`, borrowed mutably for the
    // call.
    #[cfg(target_arch = "x86_64")]
    let r = unsafe { libc::syscall(libc::SYS_epoll_wait, epfd, events.as_mut_ptr(), max, timeout_ms) };
    // SAFETY: as above; a null mask means the signal mask is left as is.
    #[cfg(not(target_arch = "x86_64"))]
    let r = unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait,
            epfd,
            events.as_mut_ptr(),
            max,
            timeout_ms,
            std::ptr::null::<libc::sigset_t>(),
            0usize,
        )
    };
    result(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn send_recv_sendv_move_the_bytes() {
        let (mut a, b) = pair();
        b.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(
            recv(b.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT),
            Err(Errno::EAGAIN)
        );
        assert_eq!(send(a.as_raw_fd(), b"hello", libc::MSG_NOSIGNAL), Ok(5));
        let parts = [IoSlice::new(b", "), IoSlice::new(b"world")];
        assert_eq!(sendv(a.as_raw_fd(), &parts, libc::MSG_NOSIGNAL), Ok(7));
        a.flush().unwrap();
        let mut got = Vec::new();
        while got.len() < 12 {
            match recv(b.as_raw_fd(), &mut buf, 0) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN) => std::thread::yield_now(),
                Err(e) => panic!("recv: {e}"),
            }
        }
        assert_eq!(got, b"hello, world");
        // The other way, and end of stream.
        let mut b2 = b.try_clone().unwrap();
        b2.write_all(b"x").unwrap();
        drop(b2);
        drop(b);
        let mut one = [0u8; 2];
        a.read_exact(&mut one[..1]).unwrap();
        assert_eq!(recv(a.as_raw_fd(), &mut one, 0), Ok(0));
        // A bad descriptor is an errno, not a crash.
        assert_eq!(send(-1, b"x", 0), Err(Errno::EBADF));
    }

    #[test]
    fn epoll_wait_reports_a_readable_socket() {
        use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent};
        let (a, b) = pair();
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        ep.add(&b, EpollEvent::new(EpollFlags::EPOLLIN, 7)).unwrap();
        let mut evs = [EMPTY_EVENT; 4];
        assert_eq!(epoll_wait(ep.0.as_raw_fd(), &mut evs, 0), Ok(0));
        assert_eq!(send(a.as_raw_fd(), b"x", 0), Ok(1));
        assert_eq!(epoll_wait(ep.0.as_raw_fd(), &mut evs, 1000), Ok(1));
        assert_eq!(ev_token(&evs[0]), 7);
        assert!(ev_flags(&evs[0]).contains(EpollFlags::EPOLLIN));
        assert_eq!(epoll_wait(-1, &mut evs, 0), Err(Errno::EBADF));
    }
}
