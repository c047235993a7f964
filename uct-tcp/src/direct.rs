//! Receiving a get reply straight into the user's get_zcopy buffer (no bounce copy).

use std::net::TcpStream;

use nix::errno::Errno;
use uct_transport::iov::Iov;

use crate::sock;

/// `recv()`s up to `max` bytes into `entry` at `off`.
///
/// The caller must own the destination: `entry` belongs to a get_zcopy that is still
/// outstanding (its completion has not been updated), so the host keeps the memory valid and
/// does not touch it.
pub fn recv_into(sock: &TcpStream, entry: &Iov<'static>, off: usize, max: usize) -> Result<usize, Errno> {
    if off >= entry.len() {
        return Ok(0);
    }
    entry.write_with(off, max, |dst| sock::recv(sock, dst))
}
