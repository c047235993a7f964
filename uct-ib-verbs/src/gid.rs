//! GIDs (the 128-bit port addresses; on RoCE an IPv6 or IPv4-mapped address) and GID types.

use std::fmt;
use std::net::Ipv6Addr;

/// A port GID in network byte order, as `ibv_query_gid` returns it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an unpopulated table entry).
    pub const ZERO: Gid = Gid([0; 16]);

    /// True for an unpopulated GID table entry.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The upper 64 bits (the subnet prefix on InfiniBand), host order.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    /// The lower 64 bits (the interface id on InfiniBand), host order.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"))
    }

    /// True for `::ffff:a.b.c.d`: a RoCE GID derived from an IPv4 address.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// The GID as an IPv6 address (RoCE GIDs are IP addresses).
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ipv6(), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}

/// What kind of GID a table entry is (from sysfs `gid_attrs/types/<index>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand, or RoCE v1 (plain Ethernet frames, not routable).
    IbRoceV1,
    /// RoCE v2 (UDP/IP encapsulated; the only kind rxe in Linux 6.1 generates).
    RoceV2,
}

impl GidType {
    /// Parses the sysfs text ("IB/RoCE v1", "RoCE v2").
    pub fn from_sysfs(text: &str) -> Option<GidType> {
        match text.trim() {
            "RoCE v2" => Some(GidType::RoceV2),
            "IB/RoCE v1" | "RoCE v1" | "IB" => Some(GidType::IbRoceV1),
            _ => None,
        }
    }
}

/// One GID table entry, as [`Context::select_gid`](crate::Context::select_gid) picks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the port's GID table (`sgid_index` in address handles).
    pub index: u8,
    /// The GID itself.
    pub gid: Gid,
    /// Its type; `None` when sysfs does not say (InfiniBand ports, old kernels).
    pub gid_type: Option<GidType>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gid_is_recognised_and_printed_as_ipv6() {
        let g = Gid::from("::ffff:192.0.2.1".parse::<Ipv6Addr>().unwrap());
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.to_string(), "::ffff:192.0.2.1");
        assert_eq!(g.subnet_prefix(), 0);
        assert_eq!(g.interface_id(), 0x0000_ffff_c000_0201);
        let ll = Gid::from("fe80::43:bdff:fe03:ab8b".parse::<Ipv6Addr>().unwrap());
        assert!(!ll.is_ipv4_mapped());
        assert_eq!(ll.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert!(Gid::ZERO.is_zero() && !ll.is_zero());
    }

    #[test]
    fn gid_types_parse_from_sysfs_text() {
        assert_eq!(GidType::from_sysfs("RoCE v2\n"), Some(GidType::RoceV2));
        assert_eq!(GidType::from_sysfs("IB/RoCE v1\n"), Some(GidType::IbRoceV1));
        assert_eq!(GidType::from_sysfs("bogus"), None);
    }
}
