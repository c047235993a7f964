//! The RPC wire format on top of UCP active messages, and the procedures the server offers.
//!
//! A request is AM `REQUEST` with header `[request id: u64 LE][procedure: u8]` and the
//! arguments as data, sent with `AmFlags::REPLY`; the reply is AM `REPLY` on the request's
//! reply endpoint with header `[request id: u64 LE][status: u8]` and the result as data.
//! Arguments and results from the rendezvous threshold up travel by rendezvous.

pub const REQUEST: u16 = 20;
pub const REPLY: u16 = 21;

/// Returns the arguments unchanged.
pub const ECHO: u8 = 1;
/// Returns the arguments reversed, each byte plus one.
pub const TRANSFORM: u8 = 2;
/// Ends the server after its reply.
pub const SHUTDOWN: u8 = 3;

pub const OK: u8 = 0;
pub const UNKNOWN_PROCEDURE: u8 = 1;

pub fn request_header(id: u64, procedure: u8) -> [u8; 9] {
    let mut h = [0u8; 9];
    h[..8].copy_from_slice(&id.to_le_bytes());
    h[8] = procedure;
    h
}

/// `(id, byte)` of a request or reply header; `None` when it is not 9 bytes.
pub fn parse_header(h: &[u8]) -> Option<(u64, u8)> {
    let h: &[u8; 9] = h.try_into().ok()?;
    Some((u64::from_le_bytes(h[..8].try_into().ok()?), h[8]))
}

/// Runs `procedure` on `args`: the result, or `None` for an unknown procedure.
pub fn call(procedure: u8, mut args: Vec<u8>) -> Option<Vec<u8>> {
    match procedure {
        ECHO | SHUTDOWN => Some(args),
        TRANSFORM => {
            args.reverse();
            args.iter_mut().for_each(|b| *b = b.wrapping_add(1));
            Some(args)
        }
        _ => None,
    }
}
