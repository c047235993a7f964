//! API contracts every transport shares: errors from misuse say why (`Error::context`),
//! interfaces progress from the moment they open (unless `IfaceParams::progress` says
//! otherwise), endpoint keys are never reused, zcopy takes only memory registered on the
//! interface's own memory domain, `Ep::attr` describes the peer, and configuration set in code
//! wins over the environment (unknown names fail `Iface::open`).

use std::cell::Cell;
use std::collections::HashSet;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rucx_testkit::{Pair, Setup, DEADLINE};
use ucs::config::Overrides;
use uct::{AmCbFlags, Completion, IfaceAttr, IfaceFlags, Mem, MemAccess, ProgressFlags, Status};

use crate::misuse_am::valid_send;

const ID: u8 = 5;

/// Checks that `r` is an error other than `NoResource` whose context contains every word of
/// `names`; otherwise adds a line to `problems`.
fn says_why<T: std::fmt::Debug>(problems: &mut Vec<String>, what: &str, r: uct::Result<T>, names: &[&str]) {
    match r {
        Err(e) if e != Status::NoResource => match e.context() {
            Some(c) if names.iter().all(|w| c.contains(w)) => {}
            Some(c) => problems.push(format!(
                "{what}: {:?} with context {c:?}, which does not name {names:?}",
                e.status()
            )),
            None => problems.push(format!("{what}: {e:?} without context")),
        },
        other => problems.push(format!("{what}: {other:?} (must be refused with an error)")),
    }
}

/// Misuse is refused with an error whose context names what was wrong and the limit.
fn misuse_errors_say_why(s: &Setup) {
    let p = s.pair();
    let (ep, n, a) = (p.ep(), p.name(), *p.attr());
    let rec = p.record_am(ID);
    valid_send(&p, &rec, 1);
    let mut problems = Vec::new();
    let bad_id = 40u8;
    // The AM id limit is written 0..31 or as the count, 32.
    let id_limit = |r: uct::Result<()>, what: &str, problems: &mut Vec<String>| {
        let msg = r.as_ref().err().and_then(|e| e.context()).unwrap_or("");
        let limit = if msg.contains("31") { "31" } else { "32" };
        says_why(problems, what, r, &["40", limit]);
    };
    if a.flags.contains(IfaceFlags::AM_SHORT) {
        id_limit(
            p.retry("am_short", || ep.am_short(bad_id, 0, b"x")),
            "am_short with AM id 40",
            &mut problems,
        );
        let max = a.am.max_short;
        let big = vec![7u8; max - 8 + 1];
        says_why(
            &mut problems,
            "am_short of max_short+1",
            p.retry("am_short", || ep.am_short(ID, 0, &big)),
            &[&max.to_string()],
        );
    }
    if a.flags.contains(IfaceFlags::AM_BCOPY) {
        let r = p.retry("am_bcopy", || ep.am_bcopy(bad_id, |_| 1)).map(|_| ());
        id_limit(r, "am_bcopy with AM id 40", &mut problems);
    }
    id_limit(
        p.rx.iface.set_am_handler(bad_id, p.am_flags(), |_| {}),
        "set_am_handler with AM id 40",
        &mut problems,
    );
    // More I/O-vector entries than the API takes: the limit is uct::MAX_IOV.
    let count = uct::MAX_IOV + 1;
    let parts: Vec<&[u8]> = (0..count).map(|_| &b"x"[..]).collect();
    let limit = uct::MAX_IOV.to_string();
    says_why(
        &mut problems,
        "am_short_iov with MAX_IOV+1 parts",
        ep.am_short_iov(ID, &parts),
        &[&limit],
    );
    let m = p.local_mem(64, 1);
    let iov: Vec<_> = (0..count).map(|i| m.iov(i, 1).unwrap()).collect();
    says_why(
        &mut problems,
        "am_zcopy with MAX_IOV+1 entries",
        ep.am_zcopy(ID, &[], &iov, None),
        &[&limit],
    );
    assert!(
        problems.is_empty(),
        "[{n}] misuse without a reason:\n{}",
        problems.join("\n")
    );
    valid_send(&p, &rec, 2);
}

/// Sends one am_short (or am_bcopy) with header `seq`; false while the transport has no
/// resources.
fn try_send(p: &Pair, ep: &uct::Ep, seq: u64) -> bool {
    let r = if p.attr().flags.contains(IfaceFlags::AM_SHORT) {
        ep.am_short(ID, seq, b"hi")
    } else {
        ep.am_bcopy(ID, |b| {
            b[..8].copy_from_slice(&seq.to_le_bytes());
            8
        })
        .map(|_| ())
    };
    match r {
        Ok(()) => true,
        Err(e) if e == Status::NoResource => false,
        Err(e) => panic!("[{}] send: {e}", p.name()),
    }
}

/// Interfaces opened with the default parameters progress without `progress_enable` (an AM
/// goes there and back); one opened with `progress(ProgressFlags::EMPTY)` receives nothing
/// until its progress is enabled.
fn progress_enabled_at_open(s: &Setup) {
    let p = s.pair();
    let n = p.name();
    if !p
        .attr()
        .flags
        .intersects(IfaceFlags::AM_SHORT | IfaceFlags::AM_BCOPY)
    {
        p.skip("progress at open: neither am_short nor am_bcopy");
        return;
    }
    // There: the receiver answers on an endpoint of its own (connect-to-iface) or on its
    // endpoint back (connect-to-ep).
    let rec = p.record_am(ID);
    p.wait_for("am to the receiver", || try_send(&p, p.ep(), 1));
    p.wait_msgs(&rec, 1, "am to the receiver");
    let own;
    let back = match p.back() {
        Some(b) => &**b,
        None if p.rx.attr().flags.contains(IfaceFlags::CONNECT_TO_IFACE) => {
            let dev = p.tx.iface.device_address().unwrap();
            let addr = p.tx.iface.address().unwrap();
            own = p.rx.iface.ep_create_connected(&dev, &addr).unwrap();
            &own
        }
        None => unreachable!("[{n}] no way back"),
    };
    let got = Rc::new(Cell::new(0));
    let g = got.clone();
    let flags = if p.tx.attr().flags.contains(IfaceFlags::CB_SYNC) {
        AmCbFlags::SYNC
    } else {
        AmCbFlags::ASYNC
    };
    p.tx.iface
        .set_am_handler(ID, flags, move |_| g.set(g.get() + 1))
        .unwrap();
    // And back.
    let start = Instant::now();
    while !try_send(&p, back, 2) {
        assert!(start.elapsed() < DEADLINE, "[{n}] reply: NoResource");
        p.progress();
    }
    p.wait_for("the reply", || got.get() == 1);

    // A receiver opened without progress.
    let q = s.pair_with(|x| x, |x| x.progress(ProgressFlags::EMPTY));
    let rec = q.record_am(ID);
    let mut sent = try_send(&q, q.ep(), 7);
    if sent && !rec.borrow().is_empty() {
        q.skip("progress(EMPTY): the transport delivers inside the send, progress does not apply");
        return;
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        if !sent {
            sent = try_send(&q, q.ep(), 7);
        }
        q.progress();
    }
    assert!(
        rec.borrow().is_empty(),
        "[{n}] a receiver opened with progress(EMPTY) received a message"
    );
    q.rx.iface
        .progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    q.wait_for("the send once the receiver progresses", || {
        sent || {
            sent = try_send(&q, q.ep(), 7);
            sent
        }
    });
    q.wait_msgs(&rec, 1, "after progress_enable");
}

/// Keys of dropped endpoints are never given to new ones.
fn ep_keys_never_reused(s: &Setup) {
    let p = s.pair();
    let n = p.name();
    let mut seen = HashSet::new();
    assert!(seen.insert(p.ep().key()));
    if let Some(b) = p.back() {
        assert!(seen.insert(b.key()), "[{n}] the endpoints of a pair share a key");
    }
    for round in 0..20 {
        let (ep, back) = p.connect();
        assert!(
            seen.insert(ep.key()),
            "[{n}] round {round}: key {:?} reused",
            ep.key()
        );
        if let Some(b) = &back {
            assert!(
                seen.insert(b.key()),
                "[{n}] round {round}: key {:?} reused",
                b.key()
            );
        }
        drop((ep, back));
    }
    // Also across interfaces: a new pair's keys are new.
    let q = s.pair();
    assert!(seen.insert(q.ep().key()), "[{n}] another interface reused a key");
}

/// zcopy from memory registered on another memory domain (of the same component) is refused
/// with InvalidParam, saying so; nothing is sent and the completion is left alone.
fn zcopy_from_another_md_refused(s: &Setup) {
    let p = s.pair();
    let (ep, n, f) = (p.ep(), p.name(), p.attr().flags);
    if !f.intersects(IfaceFlags::AM_ZCOPY | IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY) {
        p.skip("zcopy from another memory domain: no zcopy");
        return;
    }
    let other = s.md_open();
    assert!(
        !other.same(&p.tx.md),
        "[{n}] md_open returned the same memory domain"
    );
    let foreign = Mem::alloc(&other, 64, MemAccess::ALL).unwrap();
    let receivers = Mem::alloc(&p.rx.md, 64, MemAccess::ALL).unwrap();
    let own = p.local_mem(64, 2);
    let r = p.remote_mem(64, 0);
    let rec = p.record_am(ID);
    valid_send(&p, &rec, 1);
    let layouts = [
        ("another md", vec![foreign.iov(0, 8).unwrap()]),
        ("the receiver's md", vec![receivers.iov(0, 8).unwrap()]),
        (
            "own and another md",
            vec![own.iov(0, 8).unwrap(), foreign.iov(8, 8).unwrap()],
        ),
    ];
    let mut problems = Vec::new();
    for (what, iov) in &layouts {
        let c = Completion::counter();
        let mut check = |op: &str, res: uct::Result<ucs::Outcome>| {
            let what = format!("{op} from {what}");
            match &res {
                Err(e) if *e == Status::InvalidParam && e.context().is_some() => {}
                _ => problems.push(format!("{what}: {res:?} (must be InvalidParam with context)")),
            }
            if c.fired() != 0 || c.outstanding() != 0 {
                problems.push(format!("{what}: the completion was used"));
            }
        };
        if f.contains(IfaceFlags::AM_ZCOPY) {
            check("am_zcopy", ep.am_zcopy(ID, b"h", iov, Some(&c)));
        }
        if f.contains(IfaceFlags::PUT_ZCOPY) {
            check("put_zcopy", ep.put_zcopy(iov, r.addr(0), &r.rkey, Some(&c)));
        }
        if f.contains(IfaceFlags::GET_ZCOPY) {
            check("get_zcopy", ep.get_zcopy(iov, r.addr(0), &r.rkey, Some(&c)));
        }
    }
    assert!(problems.is_empty(), "[{n}]\n{}", problems.join("\n"));
    assert_eq!(
        foreign.to_vec(),
        vec![0; 64],
        "[{n}] a refused get wrote foreign memory"
    );
    // Nothing arrived, and the endpoint still works.
    valid_send(&p, &rec, 2);
    p.quiesce();
    assert_eq!(
        r.mem.to_vec(),
        vec![0; 64],
        "[{n}] a refused put wrote remote memory"
    );
}

/// A configuration variable of a transport whose value shows in the interface attributes.
struct Knob {
    var: &'static str,
    /// Two valid values and what the attribute reads for each; an invalid value.
    a: (&'static str, usize),
    b: (&'static str, usize),
    invalid: &'static str,
    read: fn(&IfaceAttr) -> usize,
}

fn knob(tl: &str) -> Option<Knob> {
    match tl {
        "tcp" => Some(Knob {
            var: "TCP_MAX_IOV",
            a: ("2", 2),
            b: ("3", 3),
            invalid: "0",
            read: |a| a.am.max_iov,
        }),
        "self" => Some(Knob {
            var: "SELF_SEG_SIZE",
            a: ("4k", 4096),
            b: ("12k", 12288),
            invalid: "8",
            read: |a| a.am.max_bcopy,
        }),
        // Sizes whose element (16-byte header + payload) is whole cache lines: no rounding.
        "posix" | "sysv" => Some(Knob {
            var: "MM_SEG_SIZE",
            a: ("4080", 4080),
            b: ("12272", 12272),
            invalid: "8",
            read: |a| a.am.max_bcopy,
        }),
        "cma" => Some(Knob {
            var: "CMA_MAX_IOV",
            a: ("2", 2),
            b: ("3", 3),
            invalid: "0",
            read: |a| a.put.max_iov,
        }),
        _ => None,
    }
}

/// The largest AM a transport's interface accepts, set in code, and what its peers'
/// endpoints report for it (`EpAttr::peer_am_max`).
fn seg_knob(tl: &str) -> Option<(&'static str, [(&'static str, usize); 2])> {
    match tl {
        "tcp" => Some(("TCP_RX_SEG_SIZE", [("100k", 102_400), ("80k", 81_920)])),
        "self" => Some(("SELF_SEG_SIZE", [("12k", 12_288), ("6k", 6_144)])),
        "posix" | "sysv" => Some(("MM_SEG_SIZE", [("4080", 4080), ("2032", 2032)])),
        _ => None,
    }
}

/// `Ep::attr`: an endpoint not yet connected knows no limit; once connected it says so and
/// reports the largest AM its peer accepts (tcp: the peer's RX segment size, self: the
/// target's segment size).
fn ep_attr_reports_peer(s: &Setup) {
    let knob = seg_knob(s.tl());
    let p = match knob {
        Some((var, [rx, tx])) => s.pair_with(|p| p.config(var, tx.0), |p| p.config(var, rx.0)),
        None => s.pair(),
    };
    let n = p.name();
    let a = p.ep().attr().unwrap_or_else(|e| panic!("[{n}] ep attr: {e}"));
    if !a.connected {
        assert_eq!(a.peer_am_max, 0, "[{n}] not connected, yet a peer limit: {a:?}");
    }
    let rec = p.record_am(ID);
    valid_send(&p, &rec, 1);
    let a = p.ep().attr().unwrap();
    assert!(
        a.connected,
        "[{n}] a message went through, yet not connected: {a:?}"
    );
    match knob {
        Some((var, [rx, _])) => {
            assert_eq!(
                a.peer_am_max, rx.1,
                "[{n}] peer_am_max with the receiver's {var}={}",
                rx.0
            )
        }
        None => p.skip("peer_am_max: no known setting to compare with"),
    }
    if let Some(back) = p.back() {
        p.wait_for("the endpoint back to connect", || {
            back.attr().is_ok_and(|a| a.connected)
        });
        let a = back.attr().unwrap();
        if let Some((var, [_, tx])) = knob {
            assert_eq!(
                a.peer_am_max, tx.1,
                "[{n}] endpoint back: peer_am_max with the sender's {var}={}",
                tx.0
            );
        }
    }
}

/// Unknown names and invalid values set in code fail `Iface::open` with InvalidParam naming
/// the variable; valid ones shape the interface, the interface's own settings winning over
/// its memory domain's (the context's).
fn config_in_code(s: &Setup) {
    let n = s.name();
    let w = s.worker();
    let md = s.md_open();
    let unknown = format!("{}_NO_SUCH_VARIABLE", s.tl().to_uppercase());
    for name in [
        unknown.clone(),
        format!("RUCX_{unknown}"),
        "NO_SUCH_VARIABLE".into(),
    ] {
        let e = s
            .open_iface(&md, &w, |p| p.config(&name, "1"))
            .err()
            .unwrap_or_else(|| panic!("[{n}] {name} set in code: opened"));
        assert_eq!(e, Status::InvalidParam, "[{n}] {name}: {e}");
        let bare = name.strip_prefix("RUCX_").unwrap_or(&name);
        assert!(
            e.context().is_some_and(|c| c.contains(bare)),
            "[{n}] {name}: the error does not name it: {e:?}"
        );
    }
    let Some(k) = knob(s.tl()) else {
        s.skip("config in code: no known setting to check values with");
        return;
    };
    let e = s
        .open_iface(&md, &w, |p| p.config(k.var, k.invalid))
        .err()
        .unwrap_or_else(|| panic!("[{n}] {}={} set in code: opened", k.var, k.invalid));
    assert_eq!(e, Status::InvalidParam, "[{n}] {}={}: {e}", k.var, k.invalid);
    assert!(
        e.context().is_some_and(|c| c.contains(k.var)),
        "[{n}] {}={}: the error does not name it: {e:?}",
        k.var,
        k.invalid
    );
    let i = s.open_iface(&md, &w, |p| p.config(k.var, k.a.0)).unwrap();
    assert_eq!((k.read)(i.attr()), k.a.1, "[{n}] {}={} set in code", k.var, k.a.0);
    let name = format!("RUCX_{}", k.var);
    let i = s.open_iface(&md, &w, |p| p.config(&name, k.b.0)).unwrap();
    assert_eq!((k.read)(i.attr()), k.b.1, "[{n}] {name}={} set in code", k.b.0);
    // Set on the memory domain (as a context does for the domains it opens): the interface's
    // own setting wins.
    let on_md: Overrides = [(k.var, k.a.0)].into_iter().collect();
    let md2 = md.component().md_open_with(md.name(), &on_md).unwrap();
    let i = s.open_iface(&md2, &w, |p| p).unwrap();
    assert_eq!(
        (k.read)(i.attr()),
        k.a.1,
        "[{n}] {}={} set on the memory domain",
        k.var,
        k.a.0
    );
    let i = s.open_iface(&md2, &w, |p| p.config(k.var, k.b.0)).unwrap();
    assert_eq!(
        (k.read)(i.attr()),
        k.b.1,
        "[{n}] {}={} on the interface over {} on the memory domain",
        k.var,
        k.b.0,
        k.a.0
    );
}

/// Names the target [`config_env_probe`] runs on.
const PROBE_TARGET: &str = "CONFORMANCE_CONFIG_PROBE_TARGET";

/// Configuration set in code wins over the environment: run in a child process of this test
/// binary ([`config_env_probe`]) with `RUCX_<var>` set there, so no other test sees it.
fn config_in_code_wins_over_env(s: &Setup) {
    let n = s.name();
    let Some(k) = knob(s.tl()) else {
        s.skip("config over env: no known setting to check with");
        return;
    };
    let exe = std::env::current_exe().expect("path of the test executable");
    let out = Command::new(exe)
        .args([
            "api::config_env_probe",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PROBE_TARGET, n)
        .env(format!("RUCX_{}", k.var), k.a.0)
        .output()
        .expect("start a child copy of the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "[{n}] the probe failed:\n{text}");
    assert!(
        text.contains(&format!("PROBE OK {n}")),
        "[{n}] the probe did not run:\n{text}"
    );
}

#[test]
#[ignore = "run by api::config_in_code_wins_over_env in a child process with RUCX_* set"]
fn config_env_probe() {
    let Ok(name) = std::env::var(PROBE_TARGET) else {
        println!("nothing to probe: config_in_code_wins_over_env runs this with {PROBE_TARGET} set");
        return;
    };
    crate::targets::run(&name, probe);
}

fn probe(s: &Setup) {
    let name = s.name();
    {
        let k = knob(s.tl()).expect("a knob for the target");
        let (w, md) = (s.worker(), s.md_open());
        let i = s.open_iface(&md, &w, |p| p).unwrap();
        assert_eq!(
            (k.read)(i.attr()),
            k.a.1,
            "[{name}] RUCX_{}={} not read",
            k.var,
            k.a.0
        );
        let i = s.open_iface(&md, &w, |p| p.config(k.var, k.b.0)).unwrap();
        assert_eq!(
            (k.read)(i.attr()),
            k.b.1,
            "[{name}] {}={} set in code over RUCX_{}={}",
            k.var,
            k.b.0,
            k.var,
            k.a.0
        );
        let on_md: Overrides = [(k.var, k.b.0)].into_iter().collect();
        let md2 = md.component().md_open_with(md.name(), &on_md).unwrap();
        let i = s.open_iface(&md2, &w, |p| p).unwrap();
        assert_eq!(
            (k.read)(i.attr()),
            k.b.1,
            "[{name}] {}={} set on the memory domain over RUCX_{}={}",
            k.var,
            k.b.0,
            k.var,
            k.a.0
        );
        println!("PROBE OK {name}");
    }
}

conformance_test!(
    misuse_errors_say_why,
    progress_enabled_at_open,
    ep_keys_never_reused,
    zcopy_from_another_md_refused,
    ep_attr_reports_peer,
    config_in_code,
    config_in_code_wins_over_env
);
