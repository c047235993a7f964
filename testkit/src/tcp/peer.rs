//! A scripted uct peer for multi-process and multi-host tests: opens an interface, prints its
//! address, and optionally sends a stream of stamped messages ([`super::gen`]) to another peer
//! and/or waits for one.
//!
//! Used by the tcp tests (as a child process: the test binary re-runs itself with
//! `RUCX_TCP_PEER_ARGS`) and by `examples/tcp_peer.rs` (for `scripts/netns-test.sh`).
//!
//! Output (stdout, one line per event, prefix `RUCXPEER`): `addr <dev-hex>:<iface-hex>`,
//! `progress sent=N received=M`, `sent N`, `received N`, `stopped`, `error <status>`,
//! `stalled ...`, `corrupt ...`. Exit codes: see the `EXIT_*` constants.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucs::Outcome;
use uct::{
    AmCbFlags, AsyncMode, Completion, Context, Ep, FlushFlags, Iface, IfaceAttr, IfaceFlags, IfaceParams,
    Mem, MemAccess, Status, Worker,
};

use super::gen::{self, Checker, Rng};

/// AM ids of the peer protocol.
pub const AM_DATA: u8 = 1;
pub const AM_STOP: u8 = 2;
pub const AM_END: u8 = 3;
/// The sender's own addresses (`--hello`): the receiver connects back and acknowledges.
pub const AM_HELLO: u8 = 4;
/// Receiver to sender: messages received so far (am_short header).
pub const AM_ACK: u8 = 5;
/// The receiver acknowledges after this many messages.
const ACK_EVERY: u64 = 500;

pub const EXIT_OK: i32 = 0;
pub const EXIT_USAGE: i32 = 2;
/// The error handler reported a peer failure.
pub const EXIT_PEER_ERROR: i32 = 3;
/// Nothing moved for `--idle-timeout` while work remained.
pub const EXIT_STALLED: i32 = 4;
/// `--lifetime` expired.
pub const EXIT_LIFETIME: i32 = 5;
/// A received message was lost, duplicated, reordered or corrupted.
pub const EXIT_CORRUPT: i32 = 6;
/// Opening or connecting failed.
pub const EXIT_SETUP: i32 = 7;
/// A send failed with an error (not NoResource).
pub const EXIT_SEND_ERROR: i32 = 8;

pub const USAGE: &str = "\
Usage: tcp_peer [options]
  --tl <name>           transport (default tcp)
  --dev <name>          device (default lo)
  --connect <dev:iface> hex addresses of the peer interface (as printed by its `addr` line)
  --send <N|inf>        stamped messages to send to the peer (default 0)
  --max-size <bytes>    largest payload (default: what am_bcopy carries)
  --stream <id>         stream id stamped into the messages (default 1)
  --expect-end <K>      exit 0 once K senders sent END and all their messages arrived intact
  --stall-on-stop       stop progressing (freeze) when the peer sends STOP
  --idle-timeout <s>    exit 4 when nothing moves this long while work remains (default 30)
  --lifetime <s>        exit 5 after this long in any case (default 300)
  --watch-stdin         exit when stdin closes (the parent died)
  --addr-file <path>    also write the addr line to this file
  --report-every <N>    print a progress line every N messages (default 0: never)
  --hello               send our address first: the receiver connects back and acknowledges
                        every 500 messages (so both sides own an endpoint on the path)
Exit: 0 done, 2 usage, 3 peer failure reported, 4 stalled, 5 lifetime, 6 corrupt data,
      7 setup failed, 8 send error";

/// What a peer does.
#[derive(Clone, Debug)]
pub struct PeerArgs {
    pub tl: String,
    pub dev: String,
    pub connect: Option<(Vec<u8>, Vec<u8>)>,
    pub send: u64,
    pub max_size: Option<usize>,
    pub stream: u32,
    pub expect_end: u32,
    pub stall_on_stop: bool,
    pub idle_timeout: Duration,
    pub lifetime: Duration,
    pub watch_stdin: bool,
    pub addr_file: Option<PathBuf>,
    pub report_every: u64,
    pub hello: bool,
}

/// Inverse of [`hex`].
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Hex form of an address (as the `addr` line prints it and `--connect` takes it).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses the options (without the program name).
pub fn parse(args: &[String]) -> Result<PeerArgs, String> {
    let mut a = PeerArgs {
        tl: "tcp".into(),
        dev: "lo".into(),
        connect: None,
        send: 0,
        max_size: None,
        stream: 1,
        expect_end: 0,
        stall_on_stop: false,
        idle_timeout: Duration::from_secs(30),
        lifetime: Duration::from_secs(300),
        watch_stdin: false,
        addr_file: None,
        report_every: 0,
        hello: false,
    };
    let mut it = args.iter();
    while let Some(opt) = it.next() {
        let mut val = || it.next().cloned().ok_or_else(|| format!("{opt} needs a value"));
        let secs = |v: String| -> Result<Duration, String> {
            v.parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0)
                .map(Duration::from_secs_f64)
                .ok_or(format!("{opt} {v}: expected seconds"))
        };
        let num = |v: String| -> Result<u64, String> {
            v.parse().map_err(|_| format!("{opt} {v}: expected a number"))
        };
        match opt.as_str() {
            "--tl" => a.tl = val()?,
            "--dev" => a.dev = val()?,
            "--connect" => {
                let v = val()?;
                let (d, i) = v
                    .split_once(':')
                    .ok_or("--connect expects <dev-hex>:<iface-hex>")?;
                a.connect = Some((
                    unhex(d).ok_or("bad device address hex")?,
                    unhex(i).ok_or("bad iface address hex")?,
                ));
            }
            "--send" => {
                let v = val()?;
                a.send = if v == "inf" { u64::MAX } else { num(v)? };
            }
            "--max-size" => a.max_size = Some(num(val()?)? as usize),
            "--stream" => a.stream = num(val()?)? as u32,
            "--expect-end" => a.expect_end = num(val()?)? as u32,
            "--stall-on-stop" => a.stall_on_stop = true,
            "--idle-timeout" => a.idle_timeout = secs(val()?)?,
            "--lifetime" => a.lifetime = secs(val()?)?,
            "--watch-stdin" => a.watch_stdin = true,
            "--addr-file" => a.addr_file = Some(PathBuf::from(val()?)),
            "--report-every" => a.report_every = num(val()?)?,
            "--hello" => a.hello = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if a.send > 0 && a.connect.is_none() {
        return Err("--send needs --connect".into());
    }
    Ok(a)
}

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "RUCXPEER {line}");
    let _ = o.flush();
}

/// A peer's (device, interface) addresses.
type PeerAddr = (Vec<u8>, Vec<u8>);

/// How a message goes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Short,
    Bcopy,
    Zcopy,
}

/// Sends stamped messages (see `gen`) of random sizes with a random mix of am_short, am_bcopy
/// and am_zcopy, in order, on one endpoint.
pub struct StampedSender {
    pub ep: Ep,
    am_id: u8,
    stream: u32,
    /// Sequence number of the next message.
    pub seq: u32,
    cap: usize,
    attr: IfaceAttr,
    zmem: Option<Mem>,
    pub zcomp: Completion,
    /// Flavour chosen for the current `seq` (kept across NoResource retries).
    cur: Option<Flavour>,
    scratch: Vec<u8>,
    pub sent_by: [u64; 3],
}

impl StampedSender {
    /// The largest payload every flavour mix can carry on an interface with `attr` (the 8-byte
    /// stamp included in the message), limited to `want`.
    pub fn payload_cap(attr: &IfaceAttr, want: Option<usize>) -> usize {
        let mut cap = 0;
        if attr.flags.contains(IfaceFlags::AM_BCOPY) {
            cap = attr.am.max_bcopy.saturating_sub(8);
        } else if attr.flags.contains(IfaceFlags::AM_SHORT) {
            cap = attr.am.max_short.saturating_sub(8);
        }
        want.map_or(cap, |w| w.min(cap))
    }

    pub fn new(
        iface: &Iface,
        ep: Ep,
        am_id: u8,
        stream: u32,
        want: Option<usize>,
    ) -> uct::Result<StampedSender> {
        let attr = *iface.attr();
        let cap = Self::payload_cap(&attr, want);
        let zmem = if attr.flags.contains(IfaceFlags::AM_ZCOPY) && attr.am.max_hdr >= 8 {
            Some(Mem::alloc(iface.md(), cap.max(1), MemAccess::ALL)?)
        } else {
            None
        };
        Ok(StampedSender {
            ep,
            am_id,
            stream,
            seq: 0,
            cap,
            attr,
            zmem,
            zcomp: Completion::counter(),
            cur: None,
            scratch: Vec::with_capacity(cap + 8),
            sent_by: [0; 3],
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    fn choose(&self, len: usize) -> Flavour {
        let a = &self.attr;
        let mut c = Vec::with_capacity(3);
        if a.flags.contains(IfaceFlags::AM_SHORT) && 8 + len <= a.am.max_short {
            c.push(Flavour::Short);
        }
        if a.flags.contains(IfaceFlags::AM_BCOPY) && 8 + len <= a.am.max_bcopy {
            c.push(Flavour::Bcopy);
        }
        if self.zmem.is_some() && len >= a.am.min_zcopy.max(1) && 8 + len <= a.am.max_zcopy && len <= self.cap
        {
            c.push(Flavour::Zcopy);
        }
        assert!(!c.is_empty(), "no AM flavour can carry a payload of {len} bytes");
        c[(Rng::new(gen::stamp(self.stream, self.seq)).next_u64() % c.len() as u64) as usize]
    }

    /// Tries to send the next message: `Ok(true)` sent, `Ok(false)` no resources now (progress
    /// and call again), `Err` a hard error.
    pub fn try_send_next(&mut self) -> uct::Result<bool> {
        let len = gen::payload_len(self.stream, self.seq, self.cap);
        let fl = match self.cur {
            Some(f) => f,
            None => {
                let f = self.choose(len);
                self.cur = Some(f);
                f
            }
        };
        let stamp = gen::stamp(self.stream, self.seq);
        let r = match fl {
            Flavour::Short => {
                self.scratch.resize(len, 0);
                gen::fill_payload(self.stream, self.seq, &mut self.scratch);
                self.ep.am_short(self.am_id, stamp, &self.scratch).map(|_| ())
            }
            Flavour::Bcopy => {
                let (stream, seq) = (self.stream, self.seq);
                self.ep
                    .am_bcopy(self.am_id, |buf| {
                        buf[..8].copy_from_slice(&stamp.to_le_bytes());
                        gen::fill_payload(stream, seq, &mut buf[8..8 + len]);
                        8 + len
                    })
                    .and_then(|n| {
                        if n == 8 + len {
                            Ok(())
                        } else {
                            Err(Status::MessageTruncated.into())
                        }
                    })
            }
            Flavour::Zcopy => {
                // The buffer belongs to the transport until the previous zcopy completed.
                if self.zcomp.outstanding() > 0 {
                    return Ok(false);
                }
                let mem = self.zmem.as_ref().expect("zcopy buffer");
                self.scratch.resize(len, 0);
                gen::fill_payload(self.stream, self.seq, &mut self.scratch);
                mem.write(0, &self.scratch)?;
                let iov = mem.iov(0, len)?;
                self.ep
                    .am_zcopy(self.am_id, &stamp.to_le_bytes(), &[iov], Some(&self.zcomp))
                    .map(|_| ())
            }
        };
        match r {
            Ok(()) => {
                self.sent_by[fl as usize] += 1;
                self.seq = self.seq.wrapping_add(1);
                self.cur = None;
                Ok(true)
            }
            Err(e) if e == Status::NoResource => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Runs a peer; returns the exit code.
pub fn run(ctx: &Context, a: &PeerArgs) -> i32 {
    let start = Instant::now();
    if a.watch_stdin {
        std::thread::spawn(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            std::process::exit(EXIT_OK);
        });
    }
    let md = match ctx.find_resource(&a.tl, &a.dev) {
        Ok((md, _)) => md,
        Err(e) => {
            say(&format!("setup-failed find_resource({}, {}): {e}", a.tl, a.dev));
            return EXIT_SETUP;
        }
    };
    let worker = Worker::with_async_mode(AsyncMode::Poll).expect("worker");
    let errors: Rc<RefCell<Vec<Status>>> = Rc::default();
    let log = errors.clone();
    let iface = match Iface::open(
        &md,
        &worker,
        IfaceParams::new(&a.tl, &a.dev).err_handler(move |_, s| log.borrow_mut().push(s)),
    ) {
        Ok(i) => i,
        Err(e) => {
            say(&format!("setup-failed iface_open: {e}"));
            return EXIT_SETUP;
        }
    };
    let (Ok(dev), Ok(ifa)) = (iface.device_address(), iface.address()) else {
        say("setup-failed: cannot read the interface addresses");
        return EXIT_SETUP;
    };
    let addr_line = format!("addr {}:{}", hex(&dev), hex(&ifa));
    if let Some(p) = &a.addr_file {
        let tmp = p.with_extension("tmp");
        if std::fs::write(&tmp, format!("{}:{}\n", hex(&dev), hex(&ifa)))
            .and_then(|_| std::fs::rename(&tmp, p))
            .is_err()
        {
            say(&format!("setup-failed: cannot write {}", p.display()));
            return EXIT_SETUP;
        }
    }
    say(&addr_line);

    // Receive side.
    let checker = Rc::new(RefCell::new(Checker::new(None)));
    let ends: Rc<RefCell<Vec<(u32, u64)>>> = Rc::default();
    let stop = Rc::new(Cell::new(false));
    let hello_from: Rc<RefCell<Option<PeerAddr>>> = Rc::default();
    let activity = Rc::new(Cell::new(Instant::now()));
    {
        let (c, act) = (checker.clone(), activity.clone());
        iface
            .set_am_handler(AM_DATA, AmCbFlags::SYNC, move |m| {
                c.borrow_mut().check(m.data());
                act.set(Instant::now());
            })
            .expect("AM handler");
        let s = stop.clone();
        iface
            .set_am_handler(AM_STOP, AmCbFlags::SYNC, move |_| s.set(true))
            .expect("AM handler");
        let e = ends.clone();
        iface
            .set_am_handler(AM_END, AmCbFlags::SYNC, move |m| {
                let d = m.data();
                if d.len() >= 20 {
                    let stream = u32::from_le_bytes(d[8..12].try_into().unwrap());
                    let count = u64::from_le_bytes(d[12..20].try_into().unwrap());
                    e.borrow_mut().push((stream, count));
                }
            })
            .expect("AM handler");
        let h = hello_from.clone();
        iface
            .set_am_handler(AM_HELLO, AmCbFlags::SYNC, move |m| {
                let d = m.data();
                let n = d
                    .get(..2)
                    .map_or(usize::MAX, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
                if let (Some(dev), Some(ifa)) = (d.get(2..2 + n), d.get(2 + n..)) {
                    *h.borrow_mut() = Some((dev.to_vec(), ifa.to_vec()));
                }
            })
            .expect("AM handler");
        let act = activity.clone();
        iface
            .set_am_handler(AM_ACK, AmCbFlags::SYNC, move |_| act.set(Instant::now()))
            .expect("AM handler");
    }
    let mut back_ep: Option<Ep> = None;
    let mut acked = 0u64;

    // Send side.
    let mut sender = match &a.connect {
        None => None,
        Some((d, i)) => {
            let ep = match iface.ep_create_connected(d, i) {
                Ok(ep) => ep,
                Err(e) => {
                    say(&format!("setup-failed ep_create_connected: {e}"));
                    return EXIT_SETUP;
                }
            };
            match StampedSender::new(&iface, ep, AM_DATA, a.stream, a.max_size) {
                Ok(s) => Some(s),
                Err(e) => {
                    say(&format!("setup-failed: {e}"));
                    return EXIT_SETUP;
                }
            }
        }
    };
    let mut sent: u64 = 0;
    let mut end_sent = false;
    let flush_comp = Completion::counter();
    let mut flushed = sender.is_none();
    let mut last_report = 0u64;
    let mut hello_sent = !a.hello || sender.is_none();
    let mut hello = (dev.len() as u16).to_le_bytes().to_vec();
    hello.extend_from_slice(&dev);
    hello.extend_from_slice(&ifa);
    loop {
        if start.elapsed() > a.lifetime {
            say(&format!("lifetime {:?} over", a.lifetime));
            return EXIT_LIFETIME;
        }
        if stop.get() && a.stall_on_stop {
            say("stopped");
            loop {
                std::thread::sleep(Duration::from_millis(50));
                if start.elapsed() > a.lifetime {
                    return EXIT_LIFETIME;
                }
            }
        }
        if let Some(s) = errors.borrow().first() {
            say(&format!("error {s:?}"));
            return EXIT_PEER_ERROR;
        }
        {
            let c = checker.borrow();
            if c.bad > 0 {
                say(&format!("corrupt {}", c.problems.join("; ")));
                return EXIT_CORRUPT;
            }
        }
        let mut moved = worker.progress() > 0;
        // Connect back to a sender that introduced itself, and acknowledge what arrived.
        if back_ep.is_none() {
            if let Some((d, i)) = hello_from.borrow_mut().take() {
                match iface.ep_create_connected(&d, &i) {
                    Ok(ep) => back_ep = Some(ep),
                    Err(e) => {
                        say(&format!("setup-failed connecting back to the sender: {e}"));
                        return EXIT_SETUP;
                    }
                }
            }
        }
        if let Some(ep) = &back_ep {
            let received = checker.borrow().total;
            if received >= acked + ACK_EVERY {
                match ep.am_short(AM_ACK, received, &[]) {
                    Ok(()) => acked = received,
                    Err(e) if e == Status::NoResource => {}
                    Err(e) => {
                        say(&format!("send-error {e:?} acknowledging"));
                        return EXIT_SEND_ERROR;
                    }
                }
            }
        }
        if let Some(s) = sender.as_mut() {
            if !hello_sent {
                match s.ep.am_bcopy(AM_HELLO, |b| {
                    b[..hello.len()].copy_from_slice(&hello);
                    hello.len()
                }) {
                    Ok(_) => hello_sent = true,
                    Err(e) if e == Status::NoResource => {}
                    Err(e) => {
                        say(&format!("send-error {e:?} sending HELLO"));
                        return EXIT_SEND_ERROR;
                    }
                }
            } else if sent < a.send {
                for _ in 0..16 {
                    match s.try_send_next() {
                        Ok(true) => {
                            sent += 1;
                            moved = true;
                            if sent == a.send {
                                break;
                            }
                        }
                        Ok(false) => break,
                        Err(e) => {
                            say(&format!("send-error {e:?} after {sent} messages"));
                            return EXIT_SEND_ERROR;
                        }
                    }
                }
            } else if !end_sent {
                let mut m = [0u8; 20];
                m[8..12].copy_from_slice(&a.stream.to_le_bytes());
                m[12..20].copy_from_slice(&sent.to_le_bytes());
                match s.ep.am_bcopy(AM_END, |b| {
                    b[..20].copy_from_slice(&m);
                    20
                }) {
                    Ok(_) => {
                        end_sent = true;
                        moved = true;
                    }
                    Err(e) if e == Status::NoResource => {}
                    Err(e) => {
                        say(&format!("send-error {e:?} sending END"));
                        return EXIT_SEND_ERROR;
                    }
                }
            } else if !flushed && flush_comp.outstanding() == 0 {
                match s.ep.flush(FlushFlags::LOCAL, Some(&flush_comp)) {
                    Ok(Outcome::Done) => flushed = true,
                    Ok(Outcome::InProgress) => {}
                    Err(e) if e == Status::NoResource => {}
                    Err(e) => {
                        say(&format!("send-error {e:?} flushing"));
                        return EXIT_SEND_ERROR;
                    }
                }
                if flushed || flush_comp.fired() > 0 {
                    flushed = true;
                    moved = true;
                    say(&format!("sent {sent}"));
                }
            }
        }
        if moved {
            activity.set(Instant::now());
        }
        let received = checker.borrow().total;
        if a.report_every > 0 && (sent + received) / a.report_every > last_report {
            last_report = (sent + received) / a.report_every;
            say(&format!("progress sent={sent} received={received}"));
        }
        let recv_done = a.expect_end == 0 || {
            let ends = ends.borrow();
            let c = checker.borrow();
            ends.len() as u32 >= a.expect_end && ends.iter().all(|(st, n)| c.count(*st) as u64 == *n)
        };
        // Without anything to send or expect, serve until killed or the lifetime ends.
        let serve_only = a.connect.is_none() && a.expect_end == 0;
        if flushed && recv_done && !serve_only {
            if a.expect_end > 0 {
                say(&format!("received {received}"));
            }
            // Let the last bytes leave before the sockets close.
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(200) {
                worker.progress();
            }
            return EXIT_OK;
        }
        let work_left = !flushed || !recv_done;
        if work_left && activity.get().elapsed() > a.idle_timeout {
            say(&format!(
                "stalled: nothing moved for {:?} (sent {sent}, received {received})",
                a.idle_timeout
            ));
            return EXIT_STALLED;
        }
        if !moved {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
