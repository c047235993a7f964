//! One side of the exchange: worker, interface, endpoint, and the message itself.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use ucs::{Outcome, Status};
use uct::{
    AmCbFlags, Completion, Context, Ep, Iface, IfaceFlags, IfaceParams, Mem, MemAccess, RxDesc, Worker,
};

use crate::args::{Args, Flavour};
use crate::error::{Context as _, Failure, Res};
use crate::oob::Oob;
use crate::pattern;

/// The active-message id of the test message (UCX's example uses 0 too).
const AM_ID: u8 = 0;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

pub struct Peer {
    name: &'static str,
    role: Role,
    args: Args,
    worker: Worker,
    iface: Iface,
    ep: Option<Ep>,
    received: Rc<RefCell<Vec<RxDesc>>>,
    peer_failure: Rc<Cell<Option<Status>>>,
}

fn deadline_passed(start: Instant, a: &Args, what: &str) -> Res<()> {
    if start.elapsed() >= a.timeout {
        return Err(Failure::status(
            format!("timed out after {:.1} s {what}", a.timeout.as_secs_f64()),
            Status::TimedOut,
            "is the peer still running and progressing? raise -T if the machine is slow",
        ));
    }
    Ok(())
}

impl Peer {
    /// Opens the interface `-t`/`-d` names; the server installs its AM handler, the client checks
    /// that the transport can send the message.
    pub fn open(ctx: &Context, args: &Args, role: Role) -> Res<Peer> {
        let name = if role == Role::Server { "server" } else { "client" };
        let (tl, dev) = (args.tl.as_str(), args.dev.as_str());
        let (md, _) = ctx.find_resource(tl, dev).or_fail(
            || format!("cannot use {tl}/{dev}"),
            "list transports and devices with `rucx-info -d`",
        )?;
        let worker = Worker::new().or_fail(|| "cannot create a worker".into(), "")?;
        let peer_failure = Rc::new(Cell::new(None));
        let pf = peer_failure.clone();
        let params = IfaceParams::new(tl, dev).err_handler(move |_, st| pf.set(Some(st)));
        let iface = Iface::open(&md, &worker, params).or_fail(
            || format!("cannot open interface {tl}/{dev}"),
            "check the device with `rucx-info -d`",
        )?;
        let flags = iface.attr().flags;
        if !flags.intersects(IfaceFlags::CONNECT_TO_IFACE | IfaceFlags::CONNECT_TO_EP) {
            return Err(Failure::unsupported(
                format!("{tl} connects neither to an interface nor to an endpoint"),
                "use another transport",
            ));
        }
        let received = Rc::new(RefCell::new(Vec::new()));
        if role == Role::Server {
            let r = received.clone();
            // Keep the data (the transport's descriptor when it lends it, as UCX's example does).
            iface
                .set_am_handler(AM_ID, AmCbFlags::SYNC, move |m| r.borrow_mut().push(m.keep()))
                .or_fail(|| "cannot set the AM handler".into(), "")?;
        }
        let peer = Peer {
            name,
            role,
            args: args.clone(),
            worker,
            iface,
            ep: None,
            received,
            peer_failure,
        };
        if role == Role::Client {
            peer.check_caps()?;
        }
        Ok(peer)
    }

    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Connect-to-ep when the transport cannot connect to an interface.
    fn to_ep(&self) -> bool {
        !self.iface.attr().flags.contains(IfaceFlags::CONNECT_TO_IFACE)
    }

    fn check_caps(&self) -> Res<()> {
        let (a, attr) = (&self.args, self.iface.attr());
        let (flag, min, max) = match a.flavour {
            Flavour::Short => (IfaceFlags::AM_SHORT, 8, attr.am.max_short),
            Flavour::Bcopy => (IfaceFlags::AM_BCOPY, 1, attr.am.max_bcopy),
            Flavour::Zcopy => (IfaceFlags::AM_ZCOPY, attr.am.min_zcopy.max(1), attr.am.max_zcopy),
        };
        let fl = a.flavour.name();
        if !attr.flags.contains(flag) {
            return Err(Failure::unsupported(
                format!("{}/{} has no {fl}", a.tl, a.dev),
                "pick another flavour: -i, -b or -z",
            ));
        }
        if a.size < min || a.size > max {
            let hint = if a.flavour == Flavour::Short && a.size < 8 {
                "am_short carries the first 8 bytes as its header: use -s 8 or more, or -b".to_string()
            } else {
                format!(
                    "use -s between {min} and {max} for {fl} on {}, or another flavour",
                    a.tl
                )
            };
            return Err(Failure::status(
                format!("a {}-byte message does not fit {fl}", a.size),
                Status::ExceedsLimit,
                hint,
            ));
        }
        Ok(())
    }

    /// Sends our device, interface and endpoint addresses (creating the endpoint first for
    /// connect-to-ep transports).
    pub fn send_addresses(&mut self, oob: &mut Oob) -> Res<()> {
        if self.to_ep() {
            self.ep = Some(
                self.iface
                    .ep_create()
                    .or_fail(|| "cannot create an endpoint".into(), "")?,
            );
        }
        let dev = self
            .iface
            .device_address()
            .or_fail(|| "cannot get the device address".into(), "")?;
        let ifa = self
            .iface
            .address()
            .or_fail(|| "cannot get the interface address".into(), "")?;
        let ep = match &self.ep {
            Some(ep) => ep
                .address()
                .or_fail(|| "cannot get the endpoint address".into(), "")?,
            None => Vec::new(),
        };
        oob.send_frame(&dev, "device address")?;
        oob.send_frame(&ifa, "interface address")?;
        oob.send_frame(&ep, "endpoint address")
    }

    /// Receives the peer's addresses and connects to it.
    pub fn connect(&mut self, oob: &mut Oob, progress: &mut dyn FnMut() -> u32) -> Res<()> {
        let dev = oob.recv_frame("device address", progress)?;
        let ifa = oob.recv_frame("interface address", progress)?;
        let peer_ep = oob.recv_frame("endpoint address", progress)?;
        if !self.iface.is_reachable(&dev, &ifa) {
            let hint = if self.args.tl == "self" {
                "self reaches only interfaces on the same thread: use -l, or a network transport (-t tcp)"
                    .to_string()
            } else {
                format!(
                    "both sides must use the same transport ({}) on devices that reach each other",
                    self.args.tl
                )
            };
            return Err(Failure::status(
                format!("the peer is unreachable over {}/{}", self.args.tl, self.args.dev),
                Status::Unreachable,
                hint,
            ));
        }
        if let Some(ep) = &self.ep {
            if peer_ep.is_empty() {
                return Err(Failure::new(
                    "the peer sent no endpoint address",
                    "run both sides with the same -t",
                ));
            }
            ep.connect_to_ep(&dev, &peer_ep)
                .or_fail(|| "cannot connect to the peer's endpoint".into(), "")?;
        } else if self.role == Role::Client {
            let ep = self.iface.ep_create_connected(&dev, &ifa);
            self.ep = Some(ep.or_fail(
                || "cannot create an endpoint to the server".into(),
                "is the server still running?",
            )?);
        }
        Ok(())
    }

    fn check_peer(&self) -> Res<()> {
        match self.peer_failure.get() {
            Some(st) => Err(Failure::status(
                "the transport reported a peer failure",
                st,
                "see the peer's error output",
            )),
            None => Ok(()),
        }
    }

    /// Client: sends the message with the chosen flavour, retrying while the transport is busy.
    pub fn send_message(&self, progress: &mut dyn FnMut() -> u32) -> Res<()> {
        let ep = self.ep.as_ref().expect("connected before sending");
        let (a, fl) = (&self.args, self.args.flavour.name());
        let msg = pattern::message(a.size);
        let start = Instant::now();
        let zcopy = if a.flavour == Flavour::Zcopy {
            let mem = Mem::alloc(self.iface.md(), a.size, MemAccess::ALL)
                .or_fail(|| format!("cannot register {} bytes", a.size), "use a smaller -s")?;
            mem.write(0, &msg)
                .or_fail(|| "cannot fill the registered buffer".into(), "")?;
            Some((mem, Completion::counter()))
        } else {
            None
        };
        loop {
            let r = match a.flavour {
                Flavour::Short => {
                    let header = u64::from_le_bytes(msg[..8].try_into().expect("size >= 8 checked"));
                    ep.am_short(AM_ID, header, &msg[8..]).map(|()| Outcome::Done)
                }
                Flavour::Bcopy => ep
                    .am_bcopy(AM_ID, |buf: &mut [u8]| {
                        let n = msg.len().min(buf.len());
                        buf[..n].copy_from_slice(&msg[..n]);
                        n
                    })
                    .and_then(|n| {
                        if n == msg.len() {
                            Ok(Outcome::Done)
                        } else {
                            Err(Status::MessageTruncated.into())
                        }
                    }),
                Flavour::Zcopy => {
                    let (mem, comp) = zcopy.as_ref().expect("allocated above");
                    let iov = mem.iov(0, a.size).or_fail(|| "bad iov".into(), "")?;
                    ep.am_zcopy(AM_ID, &[], &[iov], Some(comp))
                }
            };
            match r {
                Ok(_) => break,
                Err(e) if e == Status::NoResource => {
                    progress();
                    self.check_peer()?;
                    deadline_passed(start, a, &format!("waiting for resources to send with {fl}"))?;
                }
                Err(e) => return Err(Failure::status(format!("{fl} failed"), e, "")),
            }
        }
        if let Some((_, comp)) = &zcopy {
            while comp.outstanding() > 0 {
                progress();
                self.check_peer()?;
                deadline_passed(start, a, "waiting for the am_zcopy completion")?;
            }
            if comp.fired() > 0 && comp.last_status() != Status::Ok {
                return Err(Failure::status(
                    "am_zcopy completed with an error",
                    comp.last_status(),
                    "",
                ));
            }
        }
        println!(
            "[{}] sent {} bytes with {fl}: {}",
            self.name,
            a.size,
            pattern::preview(&msg)
        );
        Ok(())
    }

    /// Server: waits for the message and checks it byte for byte.
    pub fn receive(&self, progress: &mut dyn FnMut() -> u32) -> Res<()> {
        let start = Instant::now();
        while self.received.borrow().is_empty() {
            progress();
            self.check_peer()?;
            deadline_passed(start, &self.args, "waiting for the message")?;
        }
        // Release the descriptors here, while the interface is certainly open.
        let msgs: Vec<RxDesc> = self.received.borrow_mut().drain(..).collect();
        if msgs.len() != 1 {
            return Err(Failure::new(
                format!("{} messages arrived, expected 1", msgs.len()),
                "a transport bug: duplicate delivery",
            ));
        }
        let data: &[u8] = &msgs[0];
        let verdict = pattern::check(data);
        println!(
            "[{}] received {} bytes on am id {AM_ID}: {} ({})",
            self.name,
            data.len(),
            pattern::preview(data),
            verdict.as_ref().map_or("DAMAGED", |()| "intact")
        );
        verdict.map_err(|e| Failure::new(format!("the message arrived damaged: {e}"), "a transport bug"))
    }

    /// What this side does. The server learns the flavour and size only from the message
    /// itself (the client chose them), so its line names neither.
    pub fn describe(&self) -> String {
        let model = if self.to_ep() { "to ep" } else { "to iface" };
        let a = &self.args;
        match self.role {
            Role::Client => format!(
                "[{}] {}/{}, {} of {} bytes, connect {model}",
                self.name,
                a.tl,
                a.dev,
                a.flavour.name(),
                a.size
            ),
            Role::Server => format!(
                "[{}] {}/{}, receiving one message on am id {AM_ID}, connect {model}",
                self.name, a.tl, a.dev
            ),
        }
    }
}
