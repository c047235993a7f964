//! Out-of-band channel: a plain TCP connection that carries the uct addresses and the barriers.
//!
//! Wire format (symmetric, both sides send the same kinds of frames, little-endian):
//! 1. three address frames, each `u64 length` + bytes: device address, interface address,
//!    endpoint address (empty for connect-to-iface transports);
//! 2. barrier: 4 bytes (`u32` 0) each way;
//! 3. after the message: 1 byte from the receiver to the sender, 1 = arrived intact, 0 = not.
//!
//! Every wait has a deadline and keeps the uct workers progressing (a peer may need our
//! progress to complete its connection), like UCX's barrier that polls with `worker_progress`.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Failure, Res};

/// Address frames longer than this are refused: the peer is not this program.
const MAX_FRAME: u64 = 64 * 1024;
const POLL: Duration = Duration::from_millis(1);

pub struct Oob {
    stream: TcpStream,
    timeout: Duration,
}

fn timed_out(what: &str, timeout: Duration, hint: &str) -> Failure {
    Failure::status(
        format!("timed out after {:.1} s {what}", timeout.as_secs_f64()),
        ucs::Status::TimedOut,
        hint,
    )
}

/// Binds the server's listening socket (all addresses, like UCX's passive `getaddrinfo`).
pub fn listen(addr: &str, port: u16) -> Res<TcpListener> {
    TcpListener::bind((addr, port)).map_err(|e| {
        Failure::io(
            format!("cannot listen on {addr}:{port}"),
            &e,
            "pick another port with -p, or stop the program using it",
        )
    })
}

/// Accepts exactly one client.
pub fn accept(listener: &TcpListener, timeout: Duration) -> Res<Oob> {
    let io = |e: std::io::Error| Failure::io("accept failed", &e, "");
    listener.set_nonblocking(true).map_err(io)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => return Oob::new(stream, timeout),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if Instant::now() >= deadline {
                    return Err(timed_out(
                        "waiting for a client",
                        timeout,
                        "start the client with -n <this host>, or raise -T",
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io(e)),
        }
    }
}

/// Connects to the server, retrying until the deadline (it may not be listening yet).
pub fn connect(host: &str, port: u16, timeout: Duration) -> Res<Oob> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Failure::io(format!("cannot resolve {host}"), &e, "check the -n host name"))?
        .collect();
    let deadline = Instant::now() + timeout;
    loop {
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(1)) {
                Ok(s) => return Oob::new(s, timeout),
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() >= deadline {
            let why = last.map_or("no address".to_string(), |e| e.to_string());
            return Err(timed_out(
                &format!("connecting to {host}:{port} ({why})"),
                timeout,
                "start the server first (same -p, without -n), or check -n/-p",
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Oob {
    fn new(stream: TcpStream, timeout: Duration) -> Res<Oob> {
        let io = |e: std::io::Error| Failure::io("cannot set up the out-of-band socket", &e, "");
        stream.set_nodelay(true).map_err(io)?;
        stream.set_nonblocking(false).map_err(io)?;
        stream.set_read_timeout(Some(POLL)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        Ok(Oob { stream, timeout })
    }

    /// A connected pair on 127.0.0.1 (for `-l`: the same exchange, both ends in this process).
    pub fn pair(timeout: Duration) -> Res<(Oob, Oob)> {
        let l = listen("127.0.0.1", 0)?;
        let port = l
            .local_addr()
            .map_err(|e| Failure::io("local_addr", &e, ""))?
            .port();
        let client = connect("127.0.0.1", port, timeout)?;
        let server = accept(&l, timeout)?;
        Ok((server, client))
    }

    fn send(&mut self, data: &[u8], what: &str) -> Res<()> {
        self.stream.write_all(data).map_err(|e| {
            Failure::io(
                format!("cannot send the {what}"),
                &e,
                "the peer closed the connection or stopped",
            )
        })
    }

    /// Sends one length-prefixed frame.
    pub fn send_frame(&mut self, data: &[u8], what: &str) -> Res<()> {
        self.send(&(data.len() as u64).to_le_bytes(), what)?;
        self.send(data, what)
    }

    /// Fills `buf`, progressing uct through `progress` while waiting.
    pub fn recv_exact(&mut self, buf: &mut [u8], what: &str, progress: &mut dyn FnMut() -> u32) -> Res<()> {
        let deadline = Instant::now() + self.timeout;
        let mut got = 0;
        while got < buf.len() {
            progress();
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(Failure::new(
                        format!("the peer closed the connection while we waited for the {what}"),
                        "see the peer's error output",
                    ))
                }
                Ok(n) => got += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) =>
                {
                    if Instant::now() >= deadline {
                        return Err(timed_out(
                            &format!("waiting for the {what}"),
                            self.timeout,
                            "is the peer still running?",
                        ));
                    }
                }
                Err(e) => return Err(Failure::io(format!("cannot receive the {what}"), &e, "")),
            }
        }
        Ok(())
    }

    /// Receives one length-prefixed frame.
    pub fn recv_frame(&mut self, what: &str, progress: &mut dyn FnMut() -> u32) -> Res<Vec<u8>> {
        let mut len = [0u8; 8];
        self.recv_exact(&mut len, what, progress)?;
        let len = u64::from_le_bytes(len);
        if len > MAX_FRAME {
            return Err(Failure::new(
                format!("the peer announced a {len}-byte {what} (limit {MAX_FRAME})"),
                "the peer is not uct_hello_world: check -n/-p",
            ));
        }
        let mut data = vec![0; len as usize];
        self.recv_exact(&mut data, what, progress)?;
        Ok(data)
    }

    /// First half of a barrier: tell the peer we got here.
    pub fn barrier_send(&mut self) -> Res<()> {
        self.send(&0u32.to_le_bytes(), "barrier")
    }

    /// Second half: wait until the peer got here too.
    pub fn barrier_wait(&mut self, progress: &mut dyn FnMut() -> u32) -> Res<()> {
        let mut b = [0u8; 4];
        self.recv_exact(&mut b, "barrier", progress)
    }

    /// Receiver to sender: whether the message arrived intact.
    pub fn send_ack(&mut self, intact: bool) -> Res<()> {
        self.send(&[intact as u8], "acknowledgement")
    }

    pub fn recv_ack(&mut self, progress: &mut dyn FnMut() -> u32) -> Res<bool> {
        let mut b = [0u8; 1];
        self.recv_exact(&mut b, "acknowledgement", progress)?;
        Ok(b[0] == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `recv_frame` over what a peer may send: a random length (sometimes past the limit or
    /// huge), all, part or none of the bytes, then the peer closes. The frame, or an error naming
    /// the cause; never a panic or an allocation of the announced size. Built into
    /// tests/hello_world_oob.rs: `cargo test --test hello_world_oob`.
    #[test]
    fn recv_frame_survives_random_truncated_and_oversized_input() {
        let mut rng: u64 = 0x0bad_5eed_1234_5678;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n.max(1)
        };
        for _ in 0..200 {
            let (mut tx, mut rx) = Oob::pair(Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
            let len = match next(5) {
                0 => u64::MAX - next(10),
                1 => MAX_FRAME + 1 + next(1 << 30),
                2 => MAX_FRAME,
                _ => next(2000),
            };
            let mut raw = len.to_le_bytes().to_vec();
            raw.extend((0..len.min(2000)).map(|i| i as u8));
            let sent = if next(3) == 0 {
                next(raw.len() as u64 + 1) as usize
            } else {
                raw.len()
            };
            tx.stream.write_all(&raw[..sent]).unwrap();
            drop(tx);
            let got = rx.recv_frame("device address", &mut || 0);
            match got {
                Ok(d) => assert!(sent >= 8 && (sent - 8) as u64 == len && d == raw[8..]),
                Err(e) if len > MAX_FRAME && sent >= 8 => assert!(e.what.contains("announced"), "{e}"),
                Err(e) => {
                    assert!(sent < raw.len() || (sent - 8) as u64 != len, "{e}");
                    assert!(e.what.contains("closed"), "{e}");
                }
            }
        }
    }
}
