//! tcp on `lo` at the wire level: interfaces whose listening port is known ([`Node`], found
//! through `/proc`, independent of the address format), an independent codec of
//! `docs/wire-tcp.md` with a raw-socket peer ([`wire`]), this process's sockets ([`procfs`]),
//! stamped message streams that a receiver verifies byte by byte ([`gen`]), a scripted peer
//! process ([`peer`], also `examples/tcp_peer.rs`), and a helper thread that drives a raw peer
//! while the test progresses ([`drive`]).

pub mod drive;
pub mod gen;
pub mod peer;
pub mod procfs;
pub mod wire;

use std::time::Duration;

use uct::{Context, Ep, EpKey, Iface, IfaceParams, Status, Worker};

use crate::device::{self, Dev};
use crate::entity::{self, Entity, ErrorLog};
use crate::setup::Setup;

/// Transport and device of every tcp test.
pub const TL: &str = "tcp";
pub const DEV: &str = "lo";

/// Generous bound of one step of a tcp test (no timing is asserted; this only bounds hangs).
pub const STEP: Duration = Duration::from_secs(20);

/// tcp on `lo` in `ctx` (which must have it), waits bounded by [`STEP`].
pub fn lo(ctx: &Context) -> Setup {
    let res = device::find(ctx, TL, Dev::Named(DEV)).expect("a named device is found or fails");
    Setup::new("tcp/lo", res).deadline(STEP)
}

/// A listening socket on 127.0.0.1 (for raw peers), created while no interface opens, so that
/// [`Node::open`] never mistakes it for an interface's.
pub fn bind_listener() -> std::io::Result<std::net::TcpListener> {
    let _alone = entity::opening();
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
}

/// A worker with one tcp/lo interface (progress enabled at open), its error log and its
/// listening port.
pub struct Node {
    pub worker: Worker,
    pub iface: Iface,
    /// The interface's listening TCP port (found through `/proc`).
    pub port: u16,
    pub dev_addr: Vec<u8>,
    pub iface_addr: Vec<u8>,
    pub errors: ErrorLog,
}

impl Node {
    /// Opens tcp/lo of `ctx` on a new worker (poll mode: everything happens in `progress`).
    pub fn open(ctx: &Context) -> Node {
        Self::open_with(ctx, &[])
    }

    /// [`Node::open`] with `config` (`TCP_*` variables) set in code for the interface.
    pub fn open_with(ctx: &Context, config: &[(&str, &str)]) -> Node {
        let (md, _) = ctx.find_resource(TL, DEV).expect("tcp/lo resource");
        let params = config
            .iter()
            .fold(IfaceParams::new(TL, DEV), |p, (k, v)| p.config(k, v));
        // The new listening socket is the one that appears while no other interface opens.
        let (entity, port) = {
            let alone = entity::opening();
            let before = procfs::own_listening();
            let e = Entity::open_while(&alone, &md, &entity::worker(), params).expect("open tcp interface");
            let after = procfs::own_listening();
            let new: Vec<_> = after.iter().filter(|a| !before.contains(a)).collect();
            let port = match new.as_slice() {
                [] => panic!("opening a tcp interface created no listening socket in /proc/net/tcp*"),
                [one] => one.port(),
                many => many.iter().find(|a| a.is_ipv4()).unwrap_or(&many[0]).port(),
            };
            (e, port)
        };
        let Entity {
            worker,
            iface,
            errors,
            ..
        } = entity;
        let dev_addr = iface.device_address().expect("device address");
        let iface_addr = iface.address().expect("iface address");
        Node {
            worker,
            iface,
            port,
            dev_addr,
            iface_addr,
            errors,
        }
    }

    /// An endpoint connected to `other`'s interface.
    pub fn connect(&self, other: &Node) -> Ep {
        self.connect_to(&other.dev_addr, &other.iface_addr)
    }

    /// An endpoint connected to the interface with these addresses.
    pub fn connect_to(&self, dev: &[u8], iface: &[u8]) -> Ep {
        assert!(
            self.iface.is_reachable(dev, iface),
            "peer address not reachable from tcp/lo"
        );
        self.iface
            .ep_create_connected(dev, iface)
            .expect("ep_create_connected")
    }

    /// Statuses reported for `key`.
    pub fn errors_for(&self, key: EpKey) -> Vec<Status> {
        self.errors
            .borrow()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, s)| *s)
            .collect()
    }
}
