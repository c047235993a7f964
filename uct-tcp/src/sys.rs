//! The data path's system calls (`send`, `sendmsg`, `recv`, `epoll_wait`), through nix's safe
//! wrappers of libc, with the flags and error mapping the transport uses.

use std::io::IoSlice;
use std::os::fd::RawFd;

use nix::errno::Errno;
use nix::libc;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{self, MsgFlags};

/// One epoll event.
pub type Event = EpollEvent;

/// An event slot before the kernel fills it.
#[inline]
pub fn empty_event() -> Event {
    EpollEvent::empty()
}

/// The token registered with the event's file descriptor.
#[inline]
pub fn ev_token(ev: &Event) -> u64 {
    ev.data()
}

/// What the event reports.
#[inline]
pub fn ev_flags(ev: &Event) -> EpollFlags {
    ev.events()
}

/// `send(fd, buf, flags)`.
#[inline]
pub fn send(fd: RawFd, buf: &[u8], flags: libc::c_int) -> Result<usize, Errno> {
    socket::send(fd, buf, MsgFlags::from_bits_retain(flags))
}

/// `recv(fd, buf, flags)`.
#[inline]
pub fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> Result<usize, Errno> {
    socket::recv(fd, buf, MsgFlags::from_bits_retain(flags))
}

/// `sendmsg(fd, {iov}, flags)`: gathers `iov`, no address, no control data (nothing allocated).
#[inline]
pub fn sendv(fd: RawFd, iov: &[IoSlice<'_>], flags: libc::c_int) -> Result<usize, Errno> {
    socket::sendmsg::<()>(fd, iov, &[], MsgFlags::from_bits_retain(flags), None)
}

/// `epoll_wait(epoll, events, timeout_ms)`.
#[inline]
pub fn epoll_wait(epoll: &Epoll, events: &mut [Event], timeout_ms: u16) -> Result<usize, Errno> {
    epoll.wait(events, timeout_ms)
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
        let mut evs = [empty_event(); 4];
        assert_eq!(epoll_wait(&ep, &mut evs, 0), Ok(0));
        assert_eq!(send(a.as_raw_fd(), b"x", 0), Ok(1));
        assert_eq!(epoll_wait(&ep, &mut evs, 1000), Ok(1));
        assert_eq!(ev_token(&evs[0]), 7);
        assert!(ev_flags(&evs[0]).contains(EpollFlags::EPOLLIN));
    }
}
