//! Devices: what `fi_getinfo` offers, one device per provider, domain and endpoint type, named
//! as users know them. Reliable-datagram (`FI_EP_RDM`) devices carry the provider name as
//! `fi_info` prints it for RDM endpoints (`tcp;ofi_rxm/lo`, `shm`, `verbs;ofi_rxm/rxe0`);
//! connected (`FI_EP_MSG`) devices the core provider's (`verbs/rxe0`, `tcp/lo`). The provider
//! filter matches the same names, so `verbs;ofi_rxm` selects the RDM devices over verbs and
//! `verbs` its connected ones. A provider with native endpoints of both types (`sockets`) gives
//! only its RDM devices (the names would clash).
//!
//! A provider is asked for the richest capability set it grants (messages with RMA and atomics,
//! then with RMA, then messages alone), with the modes and `mr_mode` bits the transport honours.
//! Providers that libfabric registers but that cannot serve are reported with the reason.

use ucs::config::{AllowList, Overrides};
use ucs::{Error, Result, Status};

use crate::config::OFI_CONFIG;
use crate::ffi::{self, bits, Hints, Info, InfoRef};

/// Modes the transport supports: every operation context is a 64-byte slot (FI_CONTEXT2), and
/// it never sends remote CQ data, so consuming a receive for it (FI_RX_CQ_DATA) cannot happen.
pub const MODE: u64 = bits::CONTEXT | bits::CONTEXT2 | bits::RX_CQ_DATA;
/// `mr_mode` bits the transport honours (see md.rs).
pub const MR_MODE: i32 = bits::MR_LOCAL | bits::MR_VIRT_ADDR | bits::MR_ALLOCATED | bits::MR_PROV_KEY;

/// Capability sets tried, richest first.
const TIERS: [u64; 3] = [
    bits::MSG | bits::RMA | bits::ATOMIC,
    bits::MSG | bits::RMA,
    bits::MSG,
];

/// The device name of a provider's domain.
pub fn device_name(prov: &str, domain: &str) -> String {
    if domain.is_empty() || domain == prov {
        prov.to_owned()
    } else {
        format!("{prov}/{domain}")
    }
}

/// The rucx transport resource (`(transport, device)`) that serves the same hardware as ofi
/// device `name`, better: `shm` duplicates `posix/memory`, a provider over kernel sockets
/// (`tcp`, `sockets`, `udp`, alone or under a utility provider) on netdev `dev` duplicates
/// `tcp/dev`. A UCP context leaves such a device out unless `RUCX_TLS` names `ofi`.
pub fn duplicate_of(name: &str) -> Option<(&'static str, String)> {
    let (prov, dom) = name.split_once('/').unwrap_or((name, ""));
    let core = prov.split(';').next().unwrap_or(prov);
    match core {
        "shm" => Some(("posix", "memory".to_owned())),
        "tcp" | "sockets" | "udp" if !dom.is_empty() => Some(("tcp", dom.to_owned())),
        _ => None,
    }
}

/// One usable device.
pub struct Device {
    pub name: String,
    pub info: Info,
}

impl Device {
    /// Whether its endpoints are connected ones (`FI_EP_MSG`).
    pub fn is_msg(&self) -> bool {
        self.info.get().is_msg()
    }
}

/// A provider that cannot serve, and why.
pub struct Unusable {
    pub provider: String,
    pub reason: String,
}

/// The provider filter from `RUCX_OFI_PROVIDER` (set in code wins).
pub fn provider_filter(config: &Overrides) -> Result<AllowList> {
    OFI_CONFIG.with(config).get_allow_list("PROVIDER")
}

fn getinfo(caps: u64, ep_type: u32) -> Result<ffi::InfoList> {
    ffi::getinfo(Some(Hints {
        caps,
        mode: MODE,
        mr_mode: MR_MODE,
        ep_type,
    }))
    .map_err(|e| {
        Error::new(
            Status::IoError,
            format!("fi_getinfo failed: {}", ffi::strerror(e as i64)),
        )
    })
}

/// Every usable device allowed by `filter`, in libfabric's preference order.
pub fn scan(filter: &AllowList) -> Result<Vec<Device>> {
    let mut out: Vec<Device> = Vec::new();
    let mut rdm_provs: Vec<String> = Vec::new();
    for (ep_type, caps) in TIERS
        .iter()
        .map(|&c| (bits::EP_RDM, c))
        .chain(TIERS.iter().map(|&c| (bits::EP_MSG, c)))
    {
        let list = getinfo(caps, ep_type)?;
        for i in list.iter().filter(|i| i.ep_type() == ep_type) {
            let prov = i.prov_name();
            if ep_type == bits::EP_RDM && !rdm_provs.contains(&prov) {
                rdm_provs.push(prov.clone());
            }
            if !filter.allows(&prov) || (ep_type == bits::EP_MSG && !msg_usable(&i, &rdm_provs)) {
                continue;
            }
            let name = device_name(&prov, &i.domain_name());
            if out.iter().any(|d| d.name == name) {
                continue;
            }
            match i.dup() {
                Ok(info) => out.push(Device { name, info }),
                Err(e) => ucs::warn!("ofi: copying the fi_info of {name}: {}", ffi::strerror(e as i64)),
            }
        }
    }
    Ok(out)
}

/// Whether a connected endpoint's `fi_info` makes a device: not for providers that also have
/// native RDM endpoints (their names would clash), nor for verbs' XRC domains (a different
/// connection model).
fn msg_usable(i: &InfoRef<'_>, rdm_provs: &[String]) -> bool {
    !rdm_provs.contains(&i.prov_name()) && !i.domain_name().ends_with("-xrc")
}

/// The device called `name`.
pub fn find(name: &str, config: &Overrides) -> Result<Device> {
    let filter = provider_filter(config)?;
    let mut devs = scan(&filter)?;
    match devs.iter().position(|d| d.name == name) {
        Some(i) => Ok(devs.swap_remove(i)),
        None => Err(Error::new(
            Status::NoDevice,
            format!(
                "ofi: no device {name:?}; devices here: {:?} (RUCX_OFI_PROVIDER filters them: verbs;ofi_rxm names RDM devices, a bare core provider such as verbs or tcp its connected ones; fi_info lists what libfabric offers)",
                devs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>()
            ),
        )),
    }
}

/// Providers libfabric registers that give no usable device, with the reason.
pub fn unusable(filter: &AllowList) -> Vec<Unusable> {
    let devs = scan(&ucs::config::AllowList {
        deny: true,
        items: vec![],
    })
    .unwrap_or_default();
    let usable: Vec<String> = devs.iter().map(|d| d.info.get().prov_name()).collect();
    let Ok(all) = ffi::getinfo(None) else {
        return Vec::new();
    };
    let mut out: Vec<Unusable> = Vec::new();
    for i in all.iter() {
        let prov = i.prov_name();
        if out.iter().any(|u| u.provider == prov) {
            continue;
        }
        let reason = if usable.contains(&prov) {
            if filter.allows(&prov) {
                continue;
            }
            if devs
                .iter()
                .any(|d| d.is_msg() && d.info.get().prov_name() == prov)
            {
                format!("its connected (FI_EP_MSG) devices ({prov}/<domain>) are left out by RUCX_OFI_PROVIDER (list {prov} there to use them)")
            } else {
                "left out by RUCX_OFI_PROVIDER (list it there to use it)".to_owned()
            }
        } else {
            let types: Vec<&str> = all
                .iter()
                .filter(|j| j.prov_name() == prov)
                .map(|j| match j.ep_type() {
                    t if t == bits::EP_MSG => "MSG",
                    t if t == bits::EP_DGRAM => "DGRAM",
                    _ => "RDM",
                })
                .fold(Vec::new(), |mut v, t| {
                    if !v.contains(&t) {
                        v.push(t);
                    }
                    v
                });
            if types.contains(&"RDM") {
                format!(
                    "its RDM endpoints need modes or mr_mode bits rucx does not support (mode {:#x}, mr_mode {:#x})",
                    i.mode(),
                    i.mr_mode()
                )
            } else {
                format!(
                    "no reliable-datagram endpoint (offers {}); its RDM form is a utility provider over it (ofi_rxm over MSG, ofi_rxd over DGRAM)",
                    types.join(", ")
                )
            }
        };
        out.push(Unusable {
            provider: prov,
            reason,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_are_provider_and_domain() {
        assert_eq!(device_name("tcp;ofi_rxm", "lo"), "tcp;ofi_rxm/lo");
        assert_eq!(device_name("shm", "shm"), "shm");
        assert_eq!(device_name("verbs;ofi_rxm", "rxe0"), "verbs;ofi_rxm/rxe0");
        assert_eq!(device_name("efa", ""), "efa");
        assert_eq!(device_name("verbs", "rxe0"), "verbs/rxe0");
    }

    /// A bare core provider name selects its connected devices, a layered name the RDM ones;
    /// the default leaves tcp's connected devices out.
    #[test]
    fn filter_names_pick_the_endpoint_type() {
        let only = |items: &[&str]| AllowList {
            deny: false,
            items: items.iter().map(|s| s.to_string()).collect(),
        };
        let Ok(msg) = scan(&only(&["tcp"])) else {
            return; // no libfabric
        };
        if msg.is_empty() {
            return; // no tcp provider
        }
        assert!(msg.iter().all(|d| d.is_msg() && d.name.starts_with("tcp/")));
        assert!(msg.iter().any(|d| d.name == "tcp/lo"), "no tcp/lo");
        let rdm = scan(&only(&["tcp;ofi_rxm"])).unwrap();
        assert!(rdm
            .iter()
            .all(|d| !d.is_msg() && d.name.starts_with("tcp;ofi_rxm/")));
        let default = scan(&provider_filter(&Overrides::default()).unwrap()).unwrap();
        if std::env::var_os("RUCX_OFI_PROVIDER").is_none() {
            assert!(!default.iter().any(|d| d.name.starts_with("tcp/")));
        }
    }

    #[test]
    fn kernel_socket_and_shm_devices_duplicate_native_ones() {
        let dup = |n| duplicate_of(n).map(|(t, d)| format!("{t}/{d}"));
        assert_eq!(dup("tcp;ofi_rxm/lo").as_deref(), Some("tcp/lo"));
        assert_eq!(dup("tcp/eth0").as_deref(), Some("tcp/eth0"));
        assert_eq!(dup("udp;ofi_rxd/lo").as_deref(), Some("tcp/lo"));
        assert_eq!(dup("shm").as_deref(), Some("posix/memory"));
        assert_eq!(dup("verbs;ofi_rxm/rxe0"), None);
        assert_eq!(dup("efa"), None);
        assert_eq!(dup("tcp"), None);
    }

    #[test]
    fn provider_filter_allows_and_denies() {
        let allow = AllowList {
            deny: false,
            items: vec!["tcp;ofi_rxm".into(), "shm".into()],
        };
        assert!(allow.allows("shm") && !allow.allows("sockets"));
        let deny = AllowList {
            deny: true,
            items: vec!["net*".into()],
        };
        assert!(!deny.allows("net;ofi_rxm") && deny.allows("tcp;ofi_rxm"));
    }
}
