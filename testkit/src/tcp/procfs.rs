//! This process's TCP sockets as Linux shows them (`/proc/self/fd` and `/proc/net/tcp{,6}`):
//! lets tests find an interface's listening port and count connections without knowing the
//! transport's address format.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// TCP states of `/proc/net/tcp` (`include/net/tcp_states.h`).
pub const ESTABLISHED: u8 = 0x01;
pub const LISTEN: u8 = 0x0A;

/// One row of `/proc/net/tcp{,6}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpRow {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: u8,
    pub inode: u64,
}

fn parse_addr(s: &str, v6: bool) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    // The kernel prints each 32-bit word of the address as a host-order hex number.
    let ip: IpAddr = if v6 {
        let mut b = [0u8; 16];
        for (i, chunk) in b.chunks_mut(4).enumerate() {
            let w = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        Ipv6Addr::from(b).into()
    } else {
        Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes()).into()
    };
    Some(SocketAddr::new(ip, port))
}

/// Every TCP socket of this network namespace.
pub fn tcp_table() -> Vec<TcpRow> {
    let mut rows = Vec::new();
    for (path, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                continue;
            }
            let (Some(local), Some(remote)) = (parse_addr(f[1], v6), parse_addr(f[2], v6)) else {
                continue;
            };
            let (Ok(state), Ok(inode)) = (u8::from_str_radix(f[3], 16), f[9].parse()) else {
                continue;
            };
            rows.push(TcpRow {
                local,
                remote,
                state,
                inode,
            });
        }
    }
    rows
}

/// Inodes of the sockets this process has open.
pub fn own_socket_inodes() -> HashSet<u64> {
    let mut out = HashSet::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    for e in dir.flatten() {
        if let Ok(target) = std::fs::read_link(e.path()) {
            let t = target.to_string_lossy();
            if let Some(n) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                if let Ok(n) = n.parse() {
                    out.insert(n);
                }
            }
        }
    }
    out
}

/// This process's TCP sockets.
pub fn own_tcp() -> Vec<TcpRow> {
    let mine = own_socket_inodes();
    tcp_table()
        .into_iter()
        .filter(|r| r.inode != 0 && mine.contains(&r.inode))
        .collect()
}

/// Local addresses of this process's listening sockets.
pub fn own_listening() -> Vec<SocketAddr> {
    own_tcp()
        .into_iter()
        .filter(|r| r.state == LISTEN)
        .map(|r| r.local)
        .collect()
}

/// This process's established sockets with one end on one of `ports` (both ends of an
/// in-process connection appear, one row each).
pub fn own_established_touching(ports: &[u16]) -> Vec<TcpRow> {
    own_tcp()
        .into_iter()
        .filter(|r| r.state == ESTABLISHED)
        .filter(|r| ports.contains(&r.local.port()) || ports.contains(&r.remote.port()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_address_notation() {
        let a = parse_addr("0100007F:1F90", false).unwrap();
        assert_eq!(a, "127.0.0.1:8080".parse().unwrap());
        let a = parse_addr("00000000000000000000000001000000:0016", true).unwrap();
        assert_eq!(a, "[::1]:22".parse().unwrap());
    }
}
