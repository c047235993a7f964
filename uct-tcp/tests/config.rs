//! `TCP_*` / `NET_DEVICES` set in code (`IfaceParams::config`, `Context::builder().config`):
//! invalid values and unknown names are refused naming the variable, valid ones shape the
//! interface and its connections. `TCP_DIRECT_READS` (`uct-tcp/src/read_tuner.rs`):
//! request/reply exchanges arrive complete and in order whether progress reads the lone
//! connection directly, after epoll, or as measured (auto: timed trials with both ways drawn at
//! random, then a choice, then another trial). Nothing here touches the process environment
//! (`config_env.rs` does).

use std::time::{Duration, Instant};

use rucx_testkit::data::pattern;
use rucx_testkit::tcp::{self, STEP};
use rucx_testkit::{modules, worker, Connect, Pair, Setup, Workers};
use uct::*;

/// A context with tcp linked in.
fn ctx() -> Context {
    modules::builtin(uct_tcp::module())
}

/// tcp on `lo`, linked in.
fn lo() -> Setup {
    tcp::lo(&ctx())
}

/// A pair on [`lo`] in model `connect` (a worker each), with `config` set in code for both
/// interfaces.
fn lo_with(connect: Connect, config: &[(&str, &str)]) -> Pair {
    config
        .iter()
        .fold(lo(), |s, (k, v)| s.config(k, v))
        .layout(connect, Workers::Separate)
        .pair()
}

fn open_lo(c: &Context, config: &[(&str, &str)]) -> Result<Iface> {
    let (md, _) = c.find_resource("tcp", "lo")?;
    let params = config
        .iter()
        .fold(IfaceParams::new("tcp", "lo"), |p, (k, v)| p.config(k, v));
    Iface::open(&md, &worker(), params)
}

/// Invalid values are refused with InvalidParam, and the error names the variable.
#[test]
fn invalid_values_are_refused_naming_the_variable() {
    let c = ctx();
    let mut unnamed = Vec::new();
    for (var, val) in [
        ("TCP_RX_SEG_SIZE", "4k"),
        ("TCP_TX_SEG_SIZE", "lots"),
        ("TCP_PORT_RANGE", "9-3"),
        ("TCP_MAX_IOV", "0"),
        ("TCP_KEEPCNT", "many"),
        ("TCP_MAX_POLL", "0"),
        ("TCP_TX_COALESCE", "2g"),
        ("TCP_DIRECT_READS", "sometimes"),
        ("TCP_CONGESTION", "re no"),
        ("TCP_CONGESTION", "a_name_too_long_for_the_kernel"),
        ("RUCX_TCP_MAX_IOV", "0"),
    ] {
        let e = open_lo(&c, &[(var, val)]).expect_err(&format!("{var}={val} accepted"));
        assert_eq!(e.status(), Status::InvalidParam, "{var}={val}: {e}");
        let name = var.strip_prefix("RUCX_").unwrap_or(var);
        if !e.context().is_some_and(|c| c.contains(name)) {
            unnamed.push(format!("{var}={val}: {e:?}"));
        }
    }
    assert!(
        unnamed.is_empty(),
        "errors that do not name the variable: {unnamed:#?}"
    );
    // The interface opens once the value is valid.
    open_lo(&c, &[("TCP_MAX_IOV", "2")]).unwrap();
}

/// A name no configuration table has fails the open with InvalidParam naming it.
#[test]
fn unknown_names_are_refused() {
    let c = ctx();
    for name in ["TCP_SNDBUFF", "RUCX_TCP_NO_SUCH_VARIABLE", "NOT_A_VARIABLE"] {
        let e = open_lo(&c, &[(name, "1")]).expect_err(&format!("{name} accepted"));
        assert_eq!(e.status(), Status::InvalidParam, "{name}: {e}");
        let bare = name.strip_prefix("RUCX_").unwrap_or(name);
        let ctx = e.context().unwrap_or_else(|| panic!("{name}: no context: {e:?}"));
        assert!(ctx.contains(bare), "{name}: context does not name it: {ctx}");
    }
}

/// Sizes shape the attributes; a later setting of a name replaces an earlier one.
#[test]
fn sizes_shape_the_attributes() {
    let c = ctx();
    let i = open_lo(
        &c,
        &[
            ("TCP_TX_SEG_SIZE", "1k"),
            ("RUCX_TCP_RX_SEG_SIZE", "2k"),
            ("TCP_MAX_IOV", "5"),
            ("TCP_MAX_IOV", "3"),
        ],
    )
    .unwrap();
    assert_eq!(
        (i.attr().am.max_short, i.attr().am.max_zcopy, i.attr().am.max_iov),
        (1024, 2048, 3)
    );
    // Not set: the defaults (the environment of this test binary sets none).
    let d = open_lo(&c, &[]).unwrap();
    assert_eq!(
        (d.attr().am.max_short, d.attr().am.max_zcopy, d.attr().am.max_iov),
        (8192, 65536, 6)
    );
}

/// `NET_DEVICES` set on the context selects the devices its memory domains offer; set on an
/// interface, it decides whether that interface opens.
#[test]
fn device_selection_in_code() {
    let only = |v: &str| {
        Context::builder()
            .builtin(uct_tcp::module())
            .plugins(false)
            .config("NET_DEVICES", v)
            .build()
    };
    assert!(only("^lo").find_resource("tcp", "lo").is_err(), "lo excluded");
    assert!(only("lo").find_resource("tcp", "lo").is_ok());
    let c = ctx();
    assert!(open_lo(&c, &[("NET_DEVICES", "^lo")]).is_err(), "lo excluded");
    open_lo(&c, &[("NET_DEVICES", "lo")]).unwrap();
}

/// A connect-to-ep endpoint whose peer never connects gives up after `TCP_CONN_TIMEOUT`.
#[test]
fn connect_timeout() {
    let s = lo().config("TCP_CONN_TIMEOUT", "300ms");
    let a = s.entity(&worker());
    let b = s.entity(&worker());
    let ea = a.iface.ep_create().unwrap();
    let eb = b.iface.ep_create().unwrap();
    // Connect only the side that waits (the greater one): its peer never connects.
    let (da, db) = (
        a.iface.device_address().unwrap(),
        b.iface.device_address().unwrap(),
    );
    let (aa, ba) = (ea.address().unwrap(), eb.address().unwrap());
    let a_port = u16::from_le_bytes(aa[..2].try_into().unwrap());
    let b_port = u16::from_le_bytes(ba[..2].try_into().unwrap());
    let start = Instant::now();
    let (waiter, side_w, key) = if a_port > b_port {
        ea.connect_to_ep(&db, &ba).unwrap();
        (&ea, &a, ea.key())
    } else {
        eb.connect_to_ep(&da, &aa).unwrap();
        (&eb, &b, eb.key())
    };
    while side_w.errors.borrow().is_empty() {
        side_w.worker.progress();
        assert!(start.elapsed() < STEP, "no timeout report");
    }
    // Well before the default (10 s): the value set in code is the one used.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the timeout took {:?}",
        start.elapsed()
    );
    assert_eq!(side_w.errors.borrow()[0], (key, Status::Unreachable));
    assert_eq!(waiter.am_short(1, 0, b"x"), Err(Status::Unreachable.into()));
}

/// A closed port fails after `TCP_MAX_CONN_RETRIES` attempts.
#[test]
fn connect_retries() {
    let s = lo().config("TCP_MAX_CONN_RETRIES", "2").entity(&worker());
    let (dev, addr) = {
        let gone = lo().entity(&worker());
        (
            gone.iface.device_address().unwrap(),
            gone.iface.address().unwrap(),
        )
    };
    let ep = s.iface.ep_create_connected(&dev, &addr).unwrap();
    let start = Instant::now();
    while s.errors.borrow().is_empty() {
        s.worker.progress();
        assert!(start.elapsed() < STEP);
    }
    assert_eq!(s.errors.borrow()[0], (ep.key(), Status::Unreachable));
}

/// `TCP_TX_COALESCE=0`: a burst goes out send by send, without the sender's progress.
#[test]
fn no_coalescing() {
    let p = lo_with(Connect::ToIface, &[("TCP_TX_COALESCE", "0")]);
    let rec = p.record_am(1);
    p.retry("warm-up", || p.ep().am_short(1, 0, b"w")).unwrap();
    p.wait_for("warm-up", || rec.borrow().len() == 1);
    p.tx.worker.progress();
    for s in 1..=3u64 {
        p.ep().am_short(1, s, b"burst").unwrap();
    }
    let start = Instant::now();
    while rec.borrow().len() < 4 {
        p.rx.worker.progress();
        assert!(start.elapsed() < STEP, "a burst waited for the sender's progress");
    }
}

// TCP_DIRECT_READS.

const REQ: u8 = 7;
const REP: u8 = 8;

/// More exchanges than one trial and the waits between two (128 + 4096), so auto runs a
/// trial, keeps a way, and starts the next trial.
const EXCHANGES: u64 = 4400;

/// Request `i`: sizes from 0 to 8000 bytes, short and bcopy.
fn send(p: &Pair, ep: &Ep, id: u8, i: u64) {
    let len = [0usize, 8, 100, 2000, 8000][(i % 5) as usize];
    let data = pattern(len, i ^ u64::from(id));
    if len <= 2000 {
        p.retry("am_short", || ep.am_short(id, i, &data)).unwrap();
    } else {
        p.retry("am_bcopy", || {
            ep.am_bcopy(id, |b| {
                b[..8].copy_from_slice(&i.to_le_bytes());
                b[8..8 + len].copy_from_slice(&data);
                8 + len
            })
        })
        .unwrap();
    }
}

fn check(m: &[u8], id: u8, i: u64) {
    let len = [0usize, 8, 100, 2000, 8000][(i % 5) as usize];
    assert_eq!(m[..8], i.to_le_bytes(), "message {i} out of order");
    assert_eq!(
        &m[8..],
        &pattern(len, i ^ u64::from(id))[..],
        "message {i} corrupt"
    );
}

fn ping_pong(setting: &str) {
    // Two interfaces, one connection each: the case direct reads are for.
    let p = lo_with(Connect::ToEp, &[("TCP_DIRECT_READS", setting)]);
    let back = p.back().unwrap();
    let reqs = p.record_am(REQ);
    let reps = p.tx.record_am(REP);
    for i in 0..EXCHANGES {
        send(&p, p.ep(), REQ, i);
        p.wait_for("request", || reqs.borrow().len() == 1);
        check(&reqs.borrow_mut().pop().unwrap(), REQ, i);
        send(&p, back, REP, i);
        p.wait_for("reply", || reps.borrow().len() == 1);
        check(&reps.borrow_mut().pop().unwrap(), REP, i);
    }
    p.no_errors();
}

#[test]
fn exchanges_arrive_with_every_setting() {
    for setting in ["y", "n", "auto"] {
        ping_pong(setting);
    }
}
