//! Network devices for the tcp transport: enumeration, name filtering and the performance model.
//!
//! A device is an interface that is up and running and has at least one IPv4 or IPv6 address
//! (`getifaddrs`); alias labels (`eth0:1`) fold into their device. Link facts come from sysfs
//! (`/sys/class/net/<dev>/{mtu,speed}`) and the default route from `/proc/net/{route,ipv6_route}`;
//! any of them may be missing (containers, non-Linux), which the model covers with documented
//! fallbacks.
//!
//! # Performance model (and how it departs from UCX)
//! UCX (`tcp_net.c`) assumes 100 Mb/s when the speed is unknown, which in VMs and containers
//! (virtio and veth rarely report one) rates tcp at ~11 MB/s; it also models loopback as a NIC
//! and charges a flat 50 us overhead. Here:
//! * Unknown speed means [`UNKNOWN_SPEED_MBPS`] (10 Gb/s), the common floor of server NICs.
//! * Loopback has no wire: its bandwidth is the kernel's copy rate for one TCP stream
//!   ([`LOOPBACK_BW`], dedicated since each process pair copies on its own cores) and its
//!   latency is the syscall and softirq path alone ([`LOOPBACK_LATENCY`]).
//! * A NIC's bandwidth is the line rate times the TCP/IP/Ethernet payload efficiency at its MTU
//!   (52 B of IP+TCP header with timestamps, 38 B of Ethernet framing, preamble and gap),
//!   shared by the processes of the node and capped by what one kernel TCP stream moves
//!   ([`STACK_MAX_BW`]). Latency is the host stack plus a NIC and switch hop
//!   ([`NIC_LATENCY`]) plus the serialization of a minimal 72-byte frame.
//! * Overhead is the CPU time of one small `send()` ([`SEND_OVERHEAD`]).
//! * Priority (higher is preferred): loopback 3, the default-route device 2, other physical
//!   devices 1, virtual devices (bridges, veth, tun) 0.

use std::net::IpAddr;
use std::path::Path;

use ucs::{Result, Status};

/// Assumed link speed when sysfs does not report one (Mb/s).
pub const UNKNOWN_SPEED_MBPS: u64 = 10_000;
/// Bandwidth of one TCP stream over loopback (bytes/s): two kernel copies per byte (~40 Gb/s).
pub const LOOPBACK_BW: f64 = 5.0e9;
/// One-way latency over loopback (s): send and recv syscalls plus softirq, no device.
pub const LOOPBACK_LATENCY: f64 = 3.0e-6;
/// Most one kernel TCP stream moves through a NIC (bytes/s), whatever the line rate.
pub const STACK_MAX_BW: f64 = 5.0e9;
/// One-way latency of the host stacks, NIC and one switch (s), before serialization.
pub const NIC_LATENCY: f64 = 6.0e-6;
/// CPU time of one small `send()` (s).
pub const SEND_OVERHEAD: f64 = 2.0e-6;

/// Bits of a minimal Ethernet frame on the wire (64 B frame + 8 B preamble).
const MIN_FRAME_BITS: f64 = 576.0;
/// IPv4 + TCP headers with the timestamp option Linux enables by default.
const TCP_IP_HDR: f64 = 52.0;
/// Ethernet preamble + header + FCS + inter-frame gap.
const ETH_FRAMING: f64 = 38.0;

/// Performance estimates of one device, in UCT's units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerfModel {
    /// Latency (s): `latency_c + latency_m * endpoints`.
    pub latency_c: f64,
    pub latency_m: f64,
    /// Bandwidth (bytes/s) each process gets regardless of others on the node.
    pub bw_dedicated: f64,
    /// Bandwidth (bytes/s) shared by the processes on the node.
    pub bw_shared: f64,
    /// CPU overhead of sending one message (s).
    pub overhead: f64,
    /// Device preference among tcp devices, higher is better.
    pub priority: u8,
}

/// The link facts the model needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub loopback: bool,
    /// `None`: unknown (the model assumes [`UNKNOWN_SPEED_MBPS`]).
    pub speed_mbps: Option<u64>,
    pub mtu: u32,
    /// Software device (bridge, veth, tun...) rather than hardware.
    pub virtual_dev: bool,
    /// Carries the host's default route.
    pub default_route: bool,
}

impl PerfModel {
    /// The model for a link; see the module docs for the reasoning.
    pub fn for_link(l: &LinkInfo) -> PerfModel {
        if l.loopback {
            return PerfModel {
                latency_c: LOOPBACK_LATENCY,
                latency_m: 0.0,
                bw_dedicated: LOOPBACK_BW,
                bw_shared: 0.0,
                overhead: SEND_OVERHEAD,
                priority: 3,
            };
        }
        let speed_bps = l.speed_mbps.unwrap_or(UNKNOWN_SPEED_MBPS).max(1) as f64 * 1e6;
        // Below 576 B (the IPv4 minimum) the MTU is bogus; count it as 576.
        let mtu = f64::from(l.mtu.max(576));
        let efficiency = (mtu - TCP_IP_HDR) / (mtu + ETH_FRAMING);
        PerfModel {
            latency_c: NIC_LATENCY + MIN_FRAME_BITS / speed_bps,
            latency_m: 0.0,
            bw_dedicated: 0.0,
            bw_shared: (speed_bps / 8.0 * efficiency).min(STACK_MAX_BW),
            overhead: SEND_OVERHEAD,
            priority: if l.default_route {
                2
            } else if l.virtual_dev {
                0
            } else {
                1
            },
        }
    }

    /// Caps both bandwidths at `max_bw` bytes/s (a configured limit such as UCX's TCP_MAX_BW).
    pub fn with_max_bw(mut self, max_bw: f64) -> PerfModel {
        self.bw_dedicated = self.bw_dedicated.min(max_bw);
        self.bw_shared = self.bw_shared.min(max_bw);
        self
    }
}

/// A usable network device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetDevice {
    /// Interface name (`lo`, `eth0`); alias labels are folded in.
    pub name: String,
    /// Kernel interface index (0 if it could not be read); the scope id of link-local IPv6.
    pub ifindex: u32,
    /// Its addresses, IPv4 first, each family in the kernel's order.
    pub addrs: Vec<IpAddr>,
    pub mtu: u32,
    pub loopback: bool,
    /// Software device (`/sys/devices/virtual/...`): bridge, veth, tun, dummy...
    pub virtual_dev: bool,
    /// A bridge master (UCX skips these by default; the transport decides).
    pub bridge: bool,
    /// Link speed from sysfs (Mb/s), `None` if unknown.
    pub speed_mbps: Option<u64>,
    /// Carries an IPv4 or IPv6 default route.
    pub default_route: bool,
}

impl NetDevice {
    pub fn link(&self) -> LinkInfo {
        LinkInfo {
            loopback: self.loopback,
            speed_mbps: self.speed_mbps,
            mtu: self.mtu,
            virtual_dev: self.virtual_dev,
            default_route: self.default_route,
        }
    }

    pub fn perf(&self) -> PerfModel {
        PerfModel::for_link(&self.link())
    }
}

/// Enumerates the usable devices, sorted by interface index.
pub fn enumerate() -> Result<Vec<NetDevice>> {
    use nix::net::if_::InterfaceFlags;
    let ifaddrs = nix::ifaddrs::getifaddrs().map_err(|e| {
        ucs::error!("tcp: getifaddrs() failed: {e}; no tcp devices (check /proc and /sys are mounted)");
        Status::IoError
    })?;
    let default_routes = default_route_devices();
    let mut devs: Vec<NetDevice> = Vec::new();
    for ifa in ifaddrs {
        let wanted = InterfaceFlags::IFF_UP | InterfaceFlags::IFF_RUNNING;
        if !ifa.flags.contains(wanted) {
            continue;
        }
        let Some(addr) = ifa.address.as_ref().and_then(|a| {
            a.as_sockaddr_in()
                .map(|s| IpAddr::V4(s.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))
        }) else {
            continue;
        };
        let name = base_name(&ifa.interface_name);
        let idx = match devs.iter().position(|d| d.name == name) {
            Some(i) => i,
            None => {
                let loopback = ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK);
                devs.push(probe(name, loopback, default_routes.iter().any(|d| d == name)));
                devs.len() - 1
            }
        };
        devs[idx].addrs.push(addr);
    }
    for d in &mut devs {
        d.addrs.sort_by_key(|a| a.is_ipv6()); // stable: keeps the kernel's order per family
    }
    devs.sort_by_key(|d| d.ifindex);
    Ok(devs)
}

/// `eth0:1` -> `eth0`.
fn base_name(label: &str) -> &str {
    label.split(':').next().unwrap_or(label)
}

fn probe(name: &str, loopback: bool, default_route: bool) -> NetDevice {
    let sys = Path::new("/sys/class/net").join(name);
    let read = |f: &str| std::fs::read_to_string(sys.join(f)).ok();
    let mtu = read("mtu")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(if loopback { 65536 } else { 1500 });
    let virtual_dev = std::fs::canonicalize(&sys)
        .map(|p| p.to_string_lossy().contains("/devices/virtual/"))
        .unwrap_or(false);
    NetDevice {
        name: name.to_owned(),
        ifindex: nix::net::if_::if_nametoindex(name).unwrap_or(0),
        addrs: Vec::new(),
        mtu,
        loopback,
        virtual_dev,
        bridge: sys.join("bridge").exists(),
        speed_mbps: read("speed").and_then(|s| parse_speed(&s)),
        default_route,
    }
}

/// Parses `/sys/class/net/<dev>/speed` (Mb/s). Drivers report an unknown speed as `-1`, as
/// `4294967295` (u32 -1), or fail the read (EINVAL); all of those are `None`.
pub fn parse_speed(s: &str) -> Option<u64> {
    match s.trim().parse::<i64>() {
        Ok(v) if v > 0 && v != i64::from(u32::MAX) => Some(v as u64),
        _ => None,
    }
}

/// The devices carrying a default route, from the text of `/proc/net/route` and
/// `/proc/net/ipv6_route`.
pub fn parse_default_routes(route_v4: &str, route_v6: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // "Iface Destination Gateway Flags RefCnt Use Metric Mask ..." (hex, destination 0 = default)
    for line in route_v4.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 8 && f[1] == "00000000" && f[7] == "00000000" && !out.iter().any(|o| o == f[0]) {
            out.push(f[0].to_owned());
        }
    }
    // "dest prefixlen src srcprefixlen nexthop metric refcnt use flags dev"; the kernel lists
    // unreachable defaults on `lo`, which are not routes out of the host.
    for line in route_v6.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 10
            && f[0].bytes().all(|b| b == b'0')
            && f[1] == "00"
            && f[9] != "lo"
            && !out.iter().any(|o| o == f[9])
        {
            out.push(f[9].to_owned());
        }
    }
    out
}

fn default_route_devices() -> Vec<String> {
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    parse_default_routes(&v4, &v6)
}

/// Whether `name` passes a device list such as `RUCX_NET_DEVICES`: entries are exact names,
/// globs (`eth*`), or `all`. With `deny` the list names the devices to leave out.
pub fn name_selected(name: &str, list: &[String], deny: bool) -> bool {
    let hit = list.iter().any(|p| pattern_matches(p, name));
    hit != deny
}

/// The same matching as UCP's device filter (`ucs::config::device_matches`).
fn pattern_matches(pattern: &str, name: &str) -> bool {
    ucs::config::device_matches(pattern, name)
}

/// Keeps the devices selected by `list` (see [`name_selected`]); an empty allow list means
/// `all`. Logs a warning for each allow-list entry that matches no device, so a typo does not
/// silently leave the transport without devices.
pub fn filter_devices(devs: Vec<NetDevice>, list: &[String], deny: bool) -> Vec<NetDevice> {
    if !deny && list.is_empty() {
        return devs;
    }
    if !deny {
        for p in list
            .iter()
            .filter(|p| !devs.iter().any(|d| pattern_matches(p, &d.name)))
        {
            let have: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
            ucs::warn!(
                "tcp: device list entry '{p}' matches no network device (have: {}); fix RUCX_NET_DEVICES",
                have.join(", ")
            );
        }
    }
    devs.into_iter()
        .filter(|d| name_selected(&d.name, list, deny))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(speed: Option<u64>, mtu: u32) -> LinkInfo {
        LinkInfo {
            loopback: false,
            speed_mbps: speed,
            mtu,
            virtual_dev: false,
            default_route: false,
        }
    }

    #[test]
    fn loopback_and_25gbe_differ() {
        let lo = PerfModel::for_link(&LinkInfo {
            loopback: true,
            ..nic(None, 65536)
        });
        let e25 = PerfModel::for_link(&nic(Some(25_000), 1500));
        assert!(lo.latency_c < e25.latency_c);
        assert!(lo.priority > e25.priority);
        assert_eq!((lo.bw_dedicated, lo.bw_shared), (LOOPBACK_BW, 0.0));
        assert_eq!(e25.bw_dedicated, 0.0);
        // 25 Gb/s * (1500-52)/(1500+38) = 2.943 GB/s.
        assert!((e25.bw_shared - 2.943e9).abs() < 0.01e9, "{}", e25.bw_shared);
        assert!((e25.latency_c - (6.0e-6 + 576.0 / 25e9)).abs() < 1e-12);
        // Jumbo frames are more efficient; 100 GbE is capped by the stack.
        assert!(PerfModel::for_link(&nic(Some(25_000), 9000)).bw_shared > e25.bw_shared);
        assert_eq!(
            PerfModel::for_link(&nic(Some(100_000), 9000)).bw_shared,
            STACK_MAX_BW
        );
    }

    #[test]
    fn unknown_speed_is_10g_not_100m() {
        let unknown = PerfModel::for_link(&nic(None, 1500));
        assert_eq!(unknown, PerfModel::for_link(&nic(Some(10_000), 1500)));
        assert!(unknown.bw_shared > 1.0e9);
        let slow = PerfModel::for_link(&nic(Some(1_000), 1500));
        assert!(slow.latency_c > unknown.latency_c && slow.bw_shared < unknown.bw_shared / 5.0);
        // A bogus tiny MTU does not yield a negative bandwidth.
        assert!(PerfModel::for_link(&nic(None, 10)).bw_shared > 0.0);
        assert_eq!(unknown.with_max_bw(1e9).bw_shared, 1e9);
    }

    #[test]
    fn priorities() {
        let p = |virtual_dev, default_route| {
            PerfModel::for_link(&LinkInfo {
                virtual_dev,
                default_route,
                ..nic(None, 1500)
            })
            .priority
        };
        assert_eq!(
            (p(false, true), p(true, true), p(false, false), p(true, false)),
            (2, 2, 1, 0)
        );
    }

    #[test]
    fn speed_parsing() {
        assert_eq!(parse_speed("25000\n"), Some(25_000));
        assert_eq!(parse_speed("-1\n"), None);
        assert_eq!(parse_speed("4294967295"), None);
        assert_eq!(parse_speed("0"), None);
        assert_eq!(parse_speed("fast"), None);
    }

    #[test]
    fn default_route_parsing() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  ib0\t0000000A\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n";
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth1\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo\n";
        assert_eq!(
            parse_default_routes(v4, v6),
            vec!["eth0".to_owned(), "eth1".to_owned()]
        );
        assert!(parse_default_routes("", "").is_empty());
    }

    #[test]
    fn name_filter() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(name_selected("eth0", &l(&["all"]), false));
        assert!(!name_selected("eth0", &l(&["all"]), true));
        assert!(name_selected("eth0", &l(&["lo", "eth0"]), false));
        assert!(!name_selected("eth1", &l(&["lo", "eth0"]), false));
        assert!(name_selected("eth1", &l(&["lo", "eth0"]), true));
        assert!(name_selected("enp3s0f1", &l(&["enp*"]), false));
        assert!(!name_selected("eth0", &l(&["enp*"]), false));
        let dev = |n: &str| NetDevice {
            name: n.into(),
            ifindex: 1,
            addrs: vec![],
            mtu: 1500,
            loopback: false,
            virtual_dev: false,
            bridge: false,
            speed_mbps: None,
            default_route: false,
        };
        let devs = vec![dev("lo"), dev("eth0"), dev("eth1")];
        let names = |v: Vec<NetDevice>| v.into_iter().map(|d| d.name).collect::<Vec<_>>();
        assert_eq!(names(filter_devices(devs.clone(), &[], false)).len(), 3);
        assert_eq!(
            names(filter_devices(devs.clone(), &l(&["eth*"]), false)),
            ["eth0", "eth1"]
        );
        assert_eq!(
            names(filter_devices(devs.clone(), &l(&["lo", "typo0"]), false)),
            ["lo"]
        );
        assert_eq!(names(filter_devices(devs, &l(&["lo"]), true)), ["eth0", "eth1"]);
        assert_eq!(base_name("eth0:1"), "eth0");
    }

    #[test]
    fn enumerate_finds_lo() {
        let devs = enumerate().expect("getifaddrs works on Linux");
        let lo = devs.iter().find(|d| d.loopback).expect("a loopback device is up");
        assert_eq!(lo.name, "lo");
        assert!(lo.ifindex > 0 && lo.mtu > 0);
        assert!(lo.addrs.iter().all(|a| a.is_loopback()), "{:?}", lo.addrs);
        assert!(!lo.addrs.is_empty());
        assert_eq!(lo.perf().priority, 3);
        // Every listed device has an address; sorted by ifindex.
        assert!(devs.iter().all(|d| !d.addrs.is_empty()));
        assert!(devs.windows(2).all(|w| w[0].ifindex <= w[1].ifindex));
    }
}
