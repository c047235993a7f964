//! The TCP side channel that carries the server's worker address to the client (UCX's
//! `connect_common`: the server listens, the client connects, the server sends a length and
//! the address), and the one-byte messages both sides use to stay in step.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

/// Longest worker address accepted from the channel (a guard against a wrong peer).
const MAX_ADDRESS: u64 = 1 << 20;

pub struct Channel(TcpStream);

/// Listens on `port` (0: any free port); returns the listener and the port it got.
pub fn listen(port: u16) -> Result<(TcpListener, u16), String> {
    let l = TcpListener::bind(("0.0.0.0", port)).map_err(|e| format!("listen on port {port}: {e}"))?;
    let port = l
        .local_addr()
        .map_err(|e| format!("listener address: {e}"))?
        .port();
    Ok((l, port))
}

/// Accepts one client and sends it `address`.
pub fn accept(l: &TcpListener, address: &[u8]) -> Result<(Channel, String), String> {
    let (mut s, peer) = l.accept().map_err(|e| format!("accept: {e}"))?;
    s.write_all(&(address.len() as u64).to_le_bytes())
        .and_then(|_| s.write_all(address))
        .map_err(|e| format!("sending the worker address to {peer}: {e}"))?;
    Ok((Channel(s), peer.to_string()))
}

/// Connects to the server and reads its address.
pub fn connect(host: &str, port: u16) -> Result<(Channel, Vec<u8>), String> {
    let mut s = TcpStream::connect((host, port)).map_err(|e| format!("connect to {host}:{port}: {e}"))?;
    let mut n = [0u8; 8];
    s.read_exact(&mut n)
        .map_err(|e| format!("reading the server's address: {e}"))?;
    let n = u64::from_le_bytes(n);
    if n == 0 || n > MAX_ADDRESS {
        return Err(format!(
            "{host}:{port} sent a {n}-byte address length: not a server of this example?"
        ));
    }
    let mut a = vec![0u8; n as usize];
    s.read_exact(&mut a)
        .map_err(|e| format!("reading the server's address: {e}"))?;
    Ok((Channel(s), a))
}

impl Channel {
    pub fn send_byte(&mut self) -> Result<(), String> {
        self.0.write_all(&[1]).map_err(|e| format!("side channel: {e}"))
    }

    pub fn recv_byte(&mut self) -> Result<(), String> {
        let mut b = [0u8];
        self.0
            .read_exact(&mut b)
            .map_err(|e| format!("side channel: {e}"))
    }

    /// Both sides reach this point before either goes on.
    pub fn barrier(&mut self) -> Result<(), String> {
        self.send_byte()?;
        self.recv_byte()
    }

    /// Returns once the peer's end is closed (its process exited or died).
    pub fn wait_closed(&mut self) -> Result<(), String> {
        let mut b = [0u8; 64];
        loop {
            match self.0.read(&mut b) {
                Ok(0) | Err(_) => return Ok(()),
                Ok(_) => {}
            }
        }
    }
}
