//! Devices and ports, shared by every ib transport: the open device of a memory domain, port
//! resources (`rxe0:1`), the device address (LID + GID) and the performance model derived from
//! the port (speed, width, MTU).
//!
//! Device address, 20 bytes, little-endian, versioned (see docs/ib.md):
//! `[u8 version = 1][u8 flags: bit 0 Ethernet link (RoCE), bit 1 GID valid][u16 LID]
//! [16 bytes GID, network order]`.

use std::sync::Arc;

use ucs::{Error, Result, Status};
use uct_transport::types::{Bandwidth, DeviceType, LinearFunc, TlResource};

use crate::config::IbConfig;
use uct_ib_verbs::{
    AhAttr, Context, DeviceAttr, Gid, GidEntry, GlobalRoute, Mtu, PortAttr, ProtectionDomain,
};

/// An open device with its protection domain (one per memory domain; ifaces share it).
pub struct IbDevice {
    pub ctx: Arc<Context>,
    pub pd: Arc<ProtectionDomain>,
    pub attr: DeviceAttr,
}

impl IbDevice {
    /// Opens the device called `name` (e.g. `rxe0`) and allocates its protection domain.
    pub fn open(name: &str) -> Result<Arc<IbDevice>> {
        let ctx = Context::open(Some(name))?;
        let attr = ctx.query_device()?;
        let pd = ProtectionDomain::new(&ctx)?;
        Ok(Arc::new(IbDevice { ctx, pd, attr }))
    }

    /// The device name, e.g. `rxe0`.
    pub fn name(&self) -> &str {
        self.ctx.name()
    }

    /// Ports (1-based) whose state is ACTIVE.
    pub fn active_ports(&self) -> Vec<u8> {
        (1..=self.attr.phys_port_cnt)
            .filter(|&p| self.ctx.query_port(p).is_ok_and(|a| a.is_active()))
            .collect()
    }

    /// One resource `<dev>:<port>` of transport `tl` per active port.
    pub fn tl_resources(&self, tl: &str) -> Vec<TlResource> {
        self.active_ports()
            .into_iter()
            .map(|p| TlResource::new(tl, &format!("{}:{p}", self.name()), DeviceType::Net))
            .collect()
    }
}

/// Splits a resource name `rxe0:1` into device and port.
pub fn parse_dev_name(dev: &str) -> Option<(&str, u8)> {
    let (name, port) = dev.rsplit_once(':')?;
    let port: u8 = port.parse().ok()?;
    (!name.is_empty() && port >= 1).then_some((name, port))
}

/// A port opened for an interface: its attributes and the GID used to reach it.
#[derive(Clone, Debug)]
pub struct PortInfo {
    pub num: u8,
    pub attr: PortAttr,
    pub gid: GidEntry,
}

impl PortInfo {
    /// Queries `port` of `dev`; it must be ACTIVE. `gid_index` `None` picks the GID the way UCX
    /// does (`Context::select_gid`).
    pub fn open(dev: &IbDevice, port: u8, gid_index: Option<u8>) -> Result<PortInfo> {
        if port == 0 || port > dev.attr.phys_port_cnt {
            return Err(Error::new(
                Status::NoDevice,
                format!(
                    "{}: no port {port} (the device has {}); use a resource name like {}:1",
                    dev.name(),
                    dev.attr.phys_port_cnt,
                    dev.name()
                ),
            ));
        }
        let attr = dev.ctx.query_port(port)?;
        if !attr.is_active() {
            let msg = format!(
                "{}:{port} is not active ({:?}); check `ibv_devinfo`",
                dev.name(),
                attr.state
            );
            ucs::error!("{msg}");
            return Err(Error::new(Status::NoDevice, msg));
        }
        let gid = match gid_index {
            None => dev.ctx.select_gid(port)?,
            Some(index) => {
                let gid = dev.ctx.query_gid(port, index)?;
                if gid.is_zero() && attr.is_roce() {
                    let msg = format!(
                        "{}:{port}: GID index {index} is empty; pick another RUCX_IB_GID_INDEX or auto",
                        dev.name()
                    );
                    ucs::error!("{msg}");
                    return Err(Error::new(Status::InvalidParam, msg));
                }
                GidEntry {
                    index,
                    gid,
                    gid_type: dev.ctx.gid_type(port, index),
                }
            }
        };
        Ok(PortInfo { num: port, attr, gid })
    }

    /// True on Ethernet ports: every path needs a GRH.
    pub fn is_roce(&self) -> bool {
        self.attr.is_roce()
    }

    /// The active MTU, or the configured one when smaller (`RUCX_IB_PATH_MTU`).
    pub fn path_mtu(&self, configured: Option<Mtu>) -> Mtu {
        let active = self.attr.active_mtu.unwrap_or(Mtu::Mtu1024);
        configured.map_or(active, |c| c.min(active))
    }

    /// This port's device address.
    pub fn device_address(&self) -> DeviceAddr {
        DeviceAddr {
            eth: self.is_roce(),
            lid: self.attr.lid,
            gid: Some(self.gid.gid),
        }
    }

    /// Whether a peer with device address `remote` can be reached from this port: same link
    /// layer, and on RoCE the same address family (IPv4-mapped GIDs talk to IPv4-mapped GIDs).
    pub fn can_reach(&self, remote: &DeviceAddr) -> bool {
        if remote.eth != self.is_roce() {
            return false;
        }
        match (self.is_roce(), remote.gid) {
            (true, Some(g)) => g.is_ipv4_mapped() == self.gid.gid.is_ipv4_mapped(),
            (true, None) => false,
            (false, _) => remote.lid != 0 || remote.gid.is_some(),
        }
    }

    /// The path to `remote` (RTR of a connected QP, or a UD address handle).
    pub fn ah_attr(&self, remote: &DeviceAddr, cfg: &IbConfig) -> AhAttr {
        let global = match remote.gid {
            Some(g) if self.is_roce() || g.subnet_prefix() != self.gid.gid.subnet_prefix() => Some(g),
            _ => None,
        };
        AhAttr {
            dlid: if self.is_roce() { 0 } else { remote.lid },
            sl: cfg.sl,
            src_path_bits: 0,
            static_rate: 0,
            port_num: self.num,
            grh: global.map(|dgid| GlobalRoute {
                dgid,
                flow_label: 0,
                sgid_index: self.gid.index,
                hop_limit: cfg.hop_limit,
                traffic_class: cfg.traffic_class,
            }),
        }
    }

    /// Latency (`c`, plus `m` seconds per endpoint) and bandwidth of this port; `lat_per_ep` is
    /// the transport's `m` (rc: 1 ns per QP).
    pub fn perf(&self, lat_per_ep: f64) -> (LinearFunc, Bandwidth) {
        let m = link_model(self.attr.active_speed);
        let lanes = self.attr.width_lanes().unwrap_or(1) as f64;
        let mtu = self.attr.active_mtu.unwrap_or(Mtu::Mtu1024).bytes() as f64;
        // per-packet headers: RoCE v2 Eth+IP+UDP+BTH+ICRC+FCS, IB LRH+BTH+ICRC+VCRC
        let hdr = if self.is_roce() {
            14.0 + 20.0 + 8.0 + 12.0 + 4.0 + 4.0
        } else {
            8.0 + 12.0 + 4.0 + 2.0
        };
        let bw = lanes * m.signal_rate * m.encoding / 8.0 * mtu / (mtu + hdr);
        let roce_extra = if self.is_roce() { 200e-9 } else { 0.0 };
        (
            LinearFunc {
                c: m.latency + roce_extra,
                m: lat_per_ep,
            },
            Bandwidth {
                dedicated: bw,
                shared: 0.0,
            },
        )
    }
}

/// Per-lane link parameters by IB speed code (`active_speed`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct LinkModel {
    /// Base one-way latency, seconds.
    latency: f64,
    /// Signalling rate per lane, bits/s.
    signal_rate: f64,
    /// Data bits per signalled bit.
    encoding: f64,
}

fn link_model(speed: u8) -> LinkModel {
    let (latency, signal_rate, encoding) = match speed {
        1 => (5000e-9, 2.5e9, 8.0 / 10.0),       // SDR
        2 => (2500e-9, 5.0e9, 8.0 / 10.0),       // DDR
        4 => (1300e-9, 10.0e9, 8.0 / 10.0),      // QDR
        8 => (700e-9, 10.3125e9, 64.0 / 66.0),   // FDR10 (also what rxe reports)
        16 => (700e-9, 14.0625e9, 64.0 / 66.0),  // FDR
        32 => (600e-9, 25.78125e9, 64.0 / 66.0), // EDR
        64 => (600e-9, 53.125e9, 64.0 / 66.0),   // HDR
        128 => (600e-9, 106.25e9, 64.0 / 66.0),  // NDR
        _ => (700e-9, 10.0e9, 64.0 / 66.0),      // unknown: a conservative 10G-class link
    };
    LinkModel {
        latency,
        signal_rate,
        encoding,
    }
}

/// Length of a packed device address.
pub const DEV_ADDR_LEN: usize = 20;
const DEV_ADDR_VERSION: u8 = 1;
const FLAG_ETH: u8 = 1;
const FLAG_GID: u8 = 2;

/// A peer port's address: link layer, LID and (optional) GID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAddr {
    pub eth: bool,
    pub lid: u16,
    pub gid: Option<Gid>,
}

impl DeviceAddr {
    /// Writes the address into `buf[..DEV_ADDR_LEN]`.
    pub fn pack(&self, buf: &mut [u8]) -> Result<()> {
        let out = buf.get_mut(..DEV_ADDR_LEN).ok_or(Status::BufferTooSmall)?;
        let mut flags = 0;
        if self.eth {
            flags |= FLAG_ETH;
        }
        if self.gid.is_some() {
            flags |= FLAG_GID;
        }
        out[0] = DEV_ADDR_VERSION;
        out[1] = flags;
        out[2..4].copy_from_slice(&self.lid.to_le_bytes());
        out[4..20].copy_from_slice(&self.gid.unwrap_or(Gid::ZERO).0);
        Ok(())
    }

    /// Parses a packed address; `InvalidAddr` for a wrong length or version.
    pub fn unpack(buf: &[u8]) -> Result<DeviceAddr> {
        if buf.len() < DEV_ADDR_LEN || buf[0] != DEV_ADDR_VERSION {
            ucs::debug!(
                len = buf.len(),
                "not an ib device address (version {DEV_ADDR_VERSION})"
            );
            return Err(Status::InvalidAddr.into());
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&buf[4..20]);
        Ok(DeviceAddr {
            eth: buf[1] & FLAG_ETH != 0,
            lid: u16::from_le_bytes([buf[2], buf[3]]),
            gid: (buf[1] & FLAG_GID != 0).then_some(Gid(gid)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uct_ib_verbs::{GidType, LinkLayer, PortState};

    fn port(roce: bool, gid: &str) -> PortInfo {
        PortInfo {
            num: 1,
            attr: PortAttr {
                state: PortState::Active,
                max_mtu: Some(Mtu::Mtu4096),
                active_mtu: Some(Mtu::Mtu1024),
                gid_tbl_len: 16,
                port_cap_flags: 0,
                max_msg_sz: 1 << 31,
                pkey_tbl_len: 1,
                lid: if roce { 0 } else { 7 },
                sm_lid: 0,
                lmc: 0,
                max_vl_num: 1,
                active_width: 1,
                active_speed: 8,
                phys_state: 5,
                link_layer: if roce {
                    LinkLayer::Ethernet
                } else {
                    LinkLayer::InfiniBand
                },
            },
            gid: GidEntry {
                index: 1,
                gid: Gid::from(gid.parse::<std::net::Ipv6Addr>().unwrap()),
                gid_type: Some(GidType::RoceV2),
            },
        }
    }

    #[test]
    fn dev_names_parse() {
        assert_eq!(parse_dev_name("rxe0:1"), Some(("rxe0", 1)));
        assert_eq!(parse_dev_name("mlx5_0:2"), Some(("mlx5_0", 2)));
        assert_eq!(parse_dev_name("rxe0"), None);
        assert_eq!(parse_dev_name("rxe0:0"), None);
        assert_eq!(parse_dev_name(":1"), None);
        assert_eq!(parse_dev_name("rxe0:x"), None);
    }

    #[test]
    fn device_address_round_trips_and_rejects_garbage() {
        let p = port(true, "::ffff:192.0.2.1");
        let a = p.device_address();
        let mut buf = [0u8; DEV_ADDR_LEN];
        a.pack(&mut buf).unwrap();
        assert_eq!(buf[0], 1);
        assert_eq!(DeviceAddr::unpack(&buf).unwrap(), a);
        assert_eq!(a.pack(&mut [0u8; 4]), Err(Status::BufferTooSmall.into()));
        assert_eq!(DeviceAddr::unpack(&buf[..10]), Err(Status::InvalidAddr.into()));
        buf[0] = 9;
        assert_eq!(DeviceAddr::unpack(&buf), Err(Status::InvalidAddr.into()));
    }

    #[test]
    fn reachability_and_paths() {
        let cfg = IbConfig::read().unwrap();
        let v4 = port(true, "::ffff:192.0.2.1");
        let v6 = port(true, "fe80::1");
        let ib = port(false, "fe80::2");
        assert!(v4.can_reach(&port(true, "::ffff:192.0.2.9").device_address()));
        assert!(!v4.can_reach(&v6.device_address()), "address families must match");
        assert!(!v4.can_reach(&ib.device_address()), "link layers must match");
        assert!(ib.can_reach(&ib.device_address()));
        let ah = v4.ah_attr(&v4.device_address(), &cfg);
        let g = ah.grh.expect("RoCE paths carry a GRH");
        assert_eq!((g.sgid_index, g.hop_limit, ah.dlid), (1, 255, 0));
        let ah = ib.ah_attr(&ib.device_address(), &cfg);
        assert_eq!((ah.grh, ah.dlid), (None, 7), "same IB subnet: LID routing");
    }

    #[test]
    fn perf_follows_speed_width_and_mtu() {
        let p = port(true, "::ffff:192.0.2.1");
        let (lat, bw) = p.perf(1e-9);
        assert!((lat.c - 900e-9).abs() < 1e-12 && lat.m == 1e-9);
        // 1 lane * 10.3125 Gb/s * 64/66 / 8, times 1024/(1024+62)
        assert!((bw.dedicated - 1.25e9 * 1.03125 * 64.0 / 66.0 * 1024.0 / 1086.0).abs() < 1e3);
        let mut wide = p.clone();
        wide.attr.active_width = 2; // 4x
        wide.attr.active_speed = 32; // EDR
        let (lat2, bw2) = wide.perf(1e-9);
        assert!(lat2.c < lat.c && bw2.dedicated > 9.0 * bw.dedicated);
        assert_eq!(p.path_mtu(None), Mtu::Mtu1024);
        assert_eq!(p.path_mtu(Some(Mtu::Mtu4096)), Mtu::Mtu1024);
        assert_eq!(p.path_mtu(Some(Mtu::Mtu512)), Mtu::Mtu512);
    }
}
