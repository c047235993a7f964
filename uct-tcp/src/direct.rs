//! Receiving a get reply straight into the user's get_zcopy buffer (no bounce copy).
//!
//! The only unsafe code of the crate: [`Iov::bytes_mut`] hands out the destination, which the
//! host lent to the transport for writing until the get completes.
#![allow(unsafe_code)]

use std::net::TcpStream;

use nix::errno::Errno;
use uct::iov::Iov;

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
    let n = max.min(entry.len() - off);
    // SAFETY: the entry was lent for writing until the operation completes, which has not
    // happened (the caller holds the operation); the slice lives only for this call and no
    // other slice of the entry exists meanwhile (this thread owns the operation).
    let dst = unsafe { entry.bytes_mut() };
    sock::recv(sock, &mut dst[off..off + n])
}
