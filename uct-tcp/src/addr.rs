//! Address formats of the tcp transport (all little-endian; see docs/wire-tcp.md §4).
//!
//! * Device address: `family u8` (4 or 6), `flags u8` (bit 0: loopback), the IP address (4 or
//!   16 bytes, network order), and for loopback devices a `u64` "loopback domain" (a hash of the
//!   kernel boot id and the network namespace), so `127.0.0.1` of another namespace or host never
//!   reads as reachable. Lengths: 6 / 18 bytes, 14 / 26 for loopback.
//! * Interface address: the listening port, `u16`.
//! * Endpoint address: the listening port `u16`, then the endpoint key `u64`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use ucs::{Result, Status};

#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;

const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;
const FLAG_LOOPBACK: u8 = 1;

/// Length of an interface address.
pub const IFACE_ADDR_LEN: usize = 2;
/// Length of an endpoint address.
pub const EP_ADDR_LEN: usize = 10;

/// A decoded device address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevAddr {
    pub ip: IpAddr,
    pub loopback: bool,
    /// Loopback only: who else shares this loopback (0 if unknown).
    pub domain: u64,
}

impl DevAddr {
    /// Encoded length.
    pub fn len(&self) -> usize {
        let ip = if self.ip.is_ipv4() { 4 } else { 16 };
        2 + ip + if self.loopback { 8 } else { 0 }
    }

    pub fn encode(&self, out: &mut [u8]) -> Result<()> {
        let out = out.get_mut(..self.len()).ok_or(Status::BufferTooSmall)?;
        out[1] = if self.loopback { FLAG_LOOPBACK } else { 0 };
        let end = match self.ip {
            IpAddr::V4(a) => {
                out[0] = FAMILY_V4;
                out[2..6].copy_from_slice(&a.octets());
                6
            }
            IpAddr::V6(a) => {
                out[0] = FAMILY_V6;
                out[2..18].copy_from_slice(&a.octets());
                18
            }
        };
        if self.loopback {
            out[end..end + 8].copy_from_slice(&self.domain.to_le_bytes());
        }
        Ok(())
    }

    /// Decodes a device address of exactly the right length; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<DevAddr> {
        let (&family, rest) = b.split_first()?;
        let (&flags, rest) = rest.split_first()?;
        if flags & !FLAG_LOOPBACK != 0 {
            return None;
        }
        let loopback = flags & FLAG_LOOPBACK != 0;
        let (ip, rest) = match family {
            FAMILY_V4 => {
                let a: [u8; 4] = rest.get(..4)?.try_into().ok()?;
                (IpAddr::V4(Ipv4Addr::from(a)), &rest[4..])
            }
            FAMILY_V6 => {
                let a: [u8; 16] = rest.get(..16)?.try_into().ok()?;
                (IpAddr::V6(Ipv6Addr::from(a)), &rest[16..])
            }
            _ => return None,
        };
        let domain = match (loopback, rest.len()) {
            (true, 8) => u64::from_le_bytes(rest.try_into().ok()?),
            (false, 0) => 0,
            _ => return None,
        };
        if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() != loopback {
            return None;
        }
        Some(DevAddr { ip, loopback, domain })
    }

    /// Whether a device with address `self` can reach a peer device `peer`: same family,
    /// loopback only to loopback (in the same domain).
    pub fn reaches(&self, peer: &DevAddr) -> bool {
        self.ip.is_ipv4() == peer.ip.is_ipv4()
            && self.loopback == peer.loopback
            && (!self.loopback || self.domain == peer.domain)
    }

    /// Sort key of the device's address (see [`order_key`]).
    pub fn order_key(&self) -> (u8, [u8; 16]) {
        order_key(self.ip)
    }

    /// The socket address to connect to `port` of this device (IPv6 link-local addresses get
    /// `scope_id`, the local interface index).
    pub fn socket_addr(&self, port: u16, scope_id: u32) -> SocketAddr {
        match self.ip {
            IpAddr::V4(a) => SocketAddr::new(IpAddr::V4(a), port),
            IpAddr::V6(a) => {
                let link_local = a.segments()[0] & 0xffc0 == 0xfe80;
                SocketAddr::V6(SocketAddrV6::new(
                    a,
                    port,
                    0,
                    if link_local { scope_id } else { 0 },
                ))
            }
        }
    }
}

/// Sort key of an address for the rules that pick one side of a pair (the smaller connects):
/// family, then the address bytes. Both sides compute the same order from the same addresses.
pub fn order_key(ip: IpAddr) -> (u8, [u8; 16]) {
    match ip {
        IpAddr::V4(a) => {
            let mut k = [0u8; 16];
            k[..4].copy_from_slice(&a.octets());
            (FAMILY_V4, k)
        }
        IpAddr::V6(a) => (FAMILY_V6, a.octets()),
    }
}

pub fn encode_iface_addr(port: u16, out: &mut [u8]) -> Result<()> {
    let out = out.get_mut(..IFACE_ADDR_LEN).ok_or(Status::BufferTooSmall)?;
    out.copy_from_slice(&port.to_le_bytes());
    Ok(())
}

pub fn decode_iface_addr(b: &[u8]) -> Option<u16> {
    let p = u16::from_le_bytes(b.try_into().ok()?);
    (p != 0).then_some(p)
}

pub fn encode_ep_addr(port: u16, key: u64, out: &mut [u8]) -> Result<()> {
    let out = out.get_mut(..EP_ADDR_LEN).ok_or(Status::BufferTooSmall)?;
    out[..2].copy_from_slice(&port.to_le_bytes());
    out[2..].copy_from_slice(&key.to_le_bytes());
    Ok(())
}

pub fn decode_ep_addr(b: &[u8]) -> Option<(u16, u64)> {
    if b.len() != EP_ADDR_LEN {
        return None;
    }
    let port = decode_iface_addr(&b[..2])?;
    let key = u64::from_le_bytes(b[2..].try_into().ok()?);
    (key != 0).then_some((port, key))
}

/// The loopback domain of the calling thread: FNV-1a over the kernel boot id and the inode of
/// the thread's network namespace. Containers on one host share the boot id but not the
/// namespace; different hosts differ in boot id.
pub fn loopback_domain() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let ns = std::fs::metadata("/proc/thread-self/ns/net")
        .or_else(|_| std::fs::metadata("/proc/self/ns/net"))
        .map(|m| m.ino())
        .unwrap_or(0);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in boot.trim().bytes().chain(ns.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_addresses_roundtrip_and_reach() {
        let lo = DevAddr {
            ip: "127.0.0.1".parse().unwrap(),
            loopback: true,
            domain: 7,
        };
        let eth = DevAddr {
            ip: "10.1.2.3".parse().unwrap(),
            loopback: false,
            domain: 0,
        };
        let v6 = DevAddr {
            ip: "fe80::1".parse().unwrap(),
            loopback: false,
            domain: 0,
        };
        for a in [lo, eth, v6] {
            let mut b = vec![0u8; a.len()];
            a.encode(&mut b).unwrap();
            assert_eq!(DevAddr::decode(&b), Some(a));
            assert_eq!(DevAddr::decode(&b[..b.len() - 1]), None);
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(DevAddr::decode(&longer), None);
        }
        assert_eq!((lo.len(), eth.len(), v6.len()), (14, 6, 18));
        assert!(lo.reaches(&lo) && eth.reaches(&eth));
        assert!(!lo.reaches(&eth) && !eth.reaches(&lo) && !eth.reaches(&v6));
        assert!(!lo.reaches(&DevAddr { domain: 8, ..lo }));
        // A "loopback" flag on a routable address (or the reverse) is malformed.
        let mut b = vec![0u8; eth.len()];
        eth.encode(&mut b).unwrap();
        b[1] = 1;
        assert_eq!(DevAddr::decode(&b), None);
        assert_eq!(eth.socket_addr(5, 3), "10.1.2.3:5".parse::<SocketAddr>().unwrap());
        assert!(matches!(v6.socket_addr(5, 3), SocketAddr::V6(s) if s.scope_id() == 3));
    }

    #[test]
    fn iface_and_ep_addresses() {
        let mut b = [0u8; EP_ADDR_LEN];
        encode_ep_addr(4000, 0x1122_3344_5566_7788, &mut b).unwrap();
        assert_eq!(decode_ep_addr(&b), Some((4000, 0x1122_3344_5566_7788)));
        assert_eq!(decode_iface_addr(&b[..2]), Some(4000));
        assert_eq!(decode_iface_addr(&[0, 0]), None);
        assert_eq!(decode_ep_addr(&b[..9]), None);
        assert_ne!(loopback_domain(), 0);
    }
}
