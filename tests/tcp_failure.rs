//! tcp failure handling: a peer process killed mid-stream, and a connect to a port where nobody
//! listens. Child processes are this test binary run again (ignored `child_*` tests selected by
//! name, configured through the environment), so nothing else has to be built first.
//!
//! Run: `cargo test -p rucx --test tcp_failure` (skips, with a note, until tcp is built in).

mod tcp_common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tcp_common::gen::Checker;
use tcp_common::peer::{self, StampedSender, AM_DATA, AM_STOP};
use tcp_common::{
    finish_child, hex, procfs, progress_for, progress_until, retry, spawn_self, tcp_context, unhex, Lines,
    Node, Watchdog, STEP,
};
use uct::{AmCbFlags, Completion, FlushFlags, IfaceFlags, Mem, MemAccess, Status};

/// Environment variable carrying a child peer's options (see `tcp_common::peer`).
const PEER_ARGS: &str = "RUCX_TCP_PEER_ARGS";
/// Marks the child run of `child_unreachable_port`.
const UNREACHABLE_CHILD: &str = "RUCX_TCP_TEST_UNREACHABLE_CHILD";

/// Child process: a scripted peer (`tcp_common::peer`) configured by `RUCX_TCP_PEER_ARGS`.
#[test]
#[ignore = "runs only as a child process of the tcp_failure tests"]
fn child_peer() {
    let Ok(args) = std::env::var(PEER_ARGS) else {
        return;
    };
    let args: Vec<String> = args.split_whitespace().map(String::from).collect();
    let a = peer::parse(&args).unwrap_or_else(|e| panic!("bad {PEER_ARGS}: {e}"));
    std::process::exit(peer::run(&rucx::context(), &a));
}

fn is_peer_failure(s: Status) -> bool {
    matches!(s, Status::ConnectionReset | Status::EndpointTimeout)
}

#[test]
fn peer_killed_while_frozen_fails_its_endpoint_and_queued_ops() {
    let Some(ctx) = tcp_context() else { return };
    let _wd = Watchdog::new(
        "peer_killed_while_frozen_fails_its_endpoint_and_queued_ops",
        Duration::from_secs(300),
    );
    killed_peer(&ctx, true);
}

#[test]
fn peer_killed_mid_stream_fails_its_endpoint_and_spares_the_others() {
    let Some(ctx) = tcp_context() else { return };
    let _wd = Watchdog::new(
        "peer_killed_mid_stream_fails_its_endpoint_and_spares_the_others",
        Duration::from_secs(300),
    );
    killed_peer(&ctx, false);
}

/// A child streams to us and we to it (and to an in-process peer); the child is SIGKILLed,
/// either while it streams or after it froze (stopped reading) so that our operations to it stay
/// queued. Our endpoint to it must fail through the error handler, queued operations complete
/// with an error, later ones fail, and the other endpoint keeps working.
fn killed_peer(ctx: &uct::Context, freeze: bool) {
    let me = Node::open(ctx);
    let other = Node::open(ctx);
    // Messages from the child (stream 7) and from `other` (stream 9) land in one checker.
    let checker = Rc::new(RefCell::new(Checker::new(None)));
    let c2 = checker.clone();
    me.iface
        .set_am_handler(AM_DATA, AmCbFlags::SYNC, move |m| {
            c2.borrow_mut().check(m.data());
        })
        .unwrap();
    let other_in = Rc::new(RefCell::new(Checker::new(None)));
    let o2 = other_in.clone();
    other
        .iface
        .set_am_handler(AM_DATA, AmCbFlags::SYNC, move |m| {
            o2.borrow_mut().check(m.data());
        })
        .unwrap();

    let args = format!(
        "--connect {}:{} --send inf --stream 7 --max-size 4000 --stall-on-stop --watch-stdin --lifetime 120 --idle-timeout 120",
        hex(&me.dev_addr),
        hex(&me.iface_addr)
    );
    let mut child = spawn_self("child_peer", &[(PEER_ARGS, &args)]);
    let mut lines = Lines::new(child.0.stdout.take().unwrap());
    let addr = lines
        .wait("RUCXPEER addr ", STEP, &[&me.worker])
        .unwrap_or_else(|| panic!("child printed no address; saw {:?}", lines.seen));
    let (d, i) = addr.split_once(':').expect("addr line");
    let (cdev, cifa) = (unhex(d).unwrap(), unhex(i).unwrap());

    // Both directions live: the child streams to us, we stream to the child and to `other`.
    let to_child = me.connect_to(&cdev, &cifa);
    let child_key = to_child.key();
    let mut s_child = StampedSender::new(&me.iface, to_child, AM_DATA, 8, Some(4000)).unwrap();
    let mut s_other = StampedSender::new(&me.iface, me.connect(&other), AM_DATA, 9, Some(4000)).unwrap();
    let other_key = s_other.ep.key();
    let w = [&me.worker, &other.worker];
    progress_until(&w, STEP, "the child's stream and ours to both peers", || {
        for s in [&mut s_child, &mut s_other] {
            if s.seq < 300 {
                s.try_send_next().expect("send before the kill");
            }
        }
        checker.borrow().count(7) >= 300 && s_child.seq >= 300 && other_in.borrow().count(9) >= 300
    });

    let zcomp = Completion::counter();
    let flush_comp = Completion::counter();
    let (outstanding, flush_state) = if freeze {
        freeze_and_fill(&me, &w, &mut s_child, &mut lines, &zcomp, &flush_comp)
    } else {
        // Kill in the middle of the streams: keep both directions busy a little longer first.
        let (c0, s0) = (checker.borrow().count(7), s_child.seq);
        progress_until(&w, STEP, "more of both streams", || {
            let _ = s_child.try_send_next().expect("send before the kill");
            checker.borrow().count(7) >= c0 + 200 && s_child.seq >= s0 + 200
        });
        (0, None)
    };

    child.0.kill().expect("SIGKILL the child");
    let _ = child.0.wait();
    if !freeze {
        // Keep sending into the dead peer: the failure must surface, not hang.
        let start = Instant::now();
        while me.errors_for(child_key).is_empty() && start.elapsed() < STEP {
            match s_child.try_send_next() {
                Ok(_) => {}
                Err(e) => {
                    eprintln!("send after the kill failed: {e:?}");
                    break;
                }
            }
            progress_for(&w, Duration::from_millis(1));
        }
    }
    progress_until(
        &w,
        Duration::from_secs(60),
        "the error handler for the killed peer's endpoint",
        || !me.errors_for(child_key).is_empty() && zcomp.outstanding() == 0 && flush_comp.outstanding() == 0,
    );
    progress_for(&w, Duration::from_millis(200));
    let errs = me.errors_for(child_key);
    assert!(
        is_peer_failure(errs[0]),
        "error handler status {:?}, expected ConnectionReset or EndpointTimeout",
        errs[0]
    );
    assert_eq!(
        errs.len(),
        1,
        "error handler fired more than once for one endpoint: {errs:?}"
    );
    if outstanding > 0 {
        assert_eq!(zcomp.fired(), 1, "outstanding zcopy completion fired once");
        assert_ne!(
            zcomp.last_status(),
            Status::Ok,
            "zcopy ops outstanding at the kill completed with OK"
        );
    } else if freeze {
        eprintln!("note: no zcopy op was outstanding at the kill (transport copied or refused them)");
    }
    if flush_state == Some(Ok(Status::InProgress)) {
        assert_ne!(
            flush_comp.last_status(),
            Status::Ok,
            "a flush outstanding at the kill completed with OK"
        );
    }
    later_ops_fail_and_others_work(&w, &mut s_child, &mut s_other, &other_in, &checker);
    assert!(
        me.errors_for(other_key).is_empty(),
        "the surviving endpoint failed: {:?}",
        me.errors.borrow()
    );
}

/// Freezes the child (it stops reading), then fills the path until operations stay queued;
/// returns the zcopy operations outstanding and what a flush answered.
fn freeze_and_fill(
    me: &Node,
    w: &[&uct::Worker],
    s_child: &mut StampedSender,
    lines: &mut Lines,
    zcomp: &Completion,
    flush_comp: &Completion,
) -> (i32, Option<uct::Result<Status>>) {
    retry(w, "STOP", || s_child.ep.am_short(AM_STOP, 0, &[])).expect("send STOP");
    lines
        .wait("RUCXPEER stopped", STEP, w)
        .unwrap_or_else(|| panic!("child did not stop; saw {:?}", lines.seen));
    let attr = *me.iface.attr();
    let zlen = attr.am.max_zcopy.min(attr.am.max_bcopy).saturating_sub(8).max(1);
    let zmem = Mem::alloc(me.iface.md(), zlen, MemAccess::ALL).unwrap();
    let use_zcopy = attr.flags.contains(IfaceFlags::AM_ZCOPY);
    let start = Instant::now();
    let mut queued = false;
    while start.elapsed() < STEP {
        let r = if use_zcopy {
            s_child
                .ep
                .am_zcopy(
                    AM_DATA + 10,
                    &[0u8; 8],
                    &[zmem.iov(0, zlen).unwrap()],
                    Some(zcomp),
                )
                .map(|_| ())
        } else {
            s_child
                .ep
                .am_bcopy(AM_DATA + 10, |b| b.len().min(zlen + 8))
                .map(|_| ())
        };
        match r {
            Ok(()) => {}
            Err(Status::NoResource) => {
                queued = true;
                break;
            }
            Err(e) => panic!("send to the frozen child failed early: {e:?}"),
        }
        me.worker.progress();
    }
    assert!(
        queued,
        "the path to a frozen peer never filled up (no NoResource in {STEP:?})"
    );
    let flush_state = s_child.ep.flush(FlushFlags::LOCAL, Some(flush_comp));
    let outstanding = zcomp.outstanding();
    eprintln!("before the kill: {outstanding} zcopy ops outstanding, flush -> {flush_state:?}");
    (outstanding, Some(flush_state))
}

/// After the failure: operations on the failed endpoint fail (not NoResource forever, never
/// OK); what the child sent before dying arrived intact; the other endpoint still delivers.
fn later_ops_fail_and_others_work(
    w: &[&uct::Worker],
    s_child: &mut StampedSender,
    s_other: &mut StampedSender,
    other_in: &Rc<RefCell<Checker>>,
    checker: &Rc<RefCell<Checker>>,
) {
    // Later operations fail (not NoResource forever, never OK).
    let start = Instant::now();
    let later = loop {
        match s_child.ep.am_short(AM_DATA, 0, b"after") {
            Ok(()) => panic!("am_short on the failed endpoint succeeded"),
            Err(Status::NoResource) if start.elapsed() < Duration::from_secs(5) => {
                progress_for(w, Duration::from_millis(10));
            }
            Err(e) => break e,
        }
    };
    assert_ne!(
        later,
        Status::NoResource,
        "am_short on the failed endpoint kept answering NoResource"
    );
    let bc = s_child.ep.am_bcopy(AM_DATA, |b| {
        b[0] = 1;
        1
    });
    assert!(
        matches!(bc, Err(e) if e != Status::NoResource),
        "am_bcopy on the failed endpoint: {bc:?}"
    );
    // Whatever the child sent before dying arrived intact.
    assert_eq!(
        checker.borrow().bad,
        0,
        "child's stream: {:?}",
        checker.borrow().problems
    );
    // The other endpoint is unaffected.
    let before = s_other.seq;
    progress_until(w, STEP, "traffic to the surviving peer", || {
        if s_other.seq < before + 500 {
            s_other.try_send_next().expect("send to the surviving peer");
        }
        other_in.borrow().count(9) >= before + 500
    });
    assert_eq!(other_in.borrow().bad, 0, "{:?}", other_in.borrow().problems);
}

/// Child process of `connect_to_a_closed_port_fails_cleanly` (run with a small retry count).
#[test]
#[ignore = "runs only as a child process of connect_to_a_closed_port_fails_cleanly"]
fn child_unreachable_port() {
    if std::env::var_os(UNREACHABLE_CHILD).is_none() {
        return;
    }
    let ctx = tcp_context().expect("tcp available in the child");
    let me = Node::open(&ctx);
    // An interface address whose port nobody listens on any more.
    let (dev, ifa, port) = {
        let gone = Node::open(&ctx);
        (gone.dev_addr.clone(), gone.iface_addr.clone(), gone.port)
    };
    assert!(
        !procfs::own_listening().iter().any(|a| a.port() == port),
        "port {port} still listening after the iface closed"
    );
    let ok = |s: Status| matches!(s, Status::Unreachable | Status::Rejected);
    let ep = match me.iface.ep_create_connected(&dev, &ifa) {
        Err(s) => {
            assert!(
                ok(s),
                "ep_create_connected to a closed port failed with {s:?}, expected Unreachable or Rejected"
            );
            println!("RESULT ep_create_connected -> {s:?}");
            return;
        }
        Ok(ep) => ep,
    };
    let key = ep.key();
    let start = Instant::now();
    let mut op_err = None;
    let mut sent_ok = 0;
    while start.elapsed() < Duration::from_secs(60) {
        if !me.errors_for(key).is_empty() {
            break;
        }
        match ep.am_short(1, 0, b"hello") {
            Ok(()) => sent_ok += 1,
            Err(Status::NoResource) => {}
            Err(e) => {
                op_err = Some(e);
                break;
            }
        }
        me.worker.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    // Let the error handler report too if the op failed first.
    progress_for(&[&me.worker], Duration::from_millis(300));
    let handler = me.errors_for(key);
    println!("RESULT op error {op_err:?}, handler {handler:?}, {sent_ok} sends accepted before");
    assert!(
        op_err.is_some() || !handler.is_empty(),
        "no error within 60 s (no handler call, ops kept answering NoResource/OK)"
    );
    if let Some(e) = op_err {
        assert!(
            ok(e),
            "ops on the endpoint failed with {e:?}, expected Unreachable or Rejected"
        );
    }
    if let Some(&h) = handler.first() {
        assert!(
            ok(h),
            "error handler reported {h:?}, expected Unreachable or Rejected"
        );
        assert_eq!(
            handler.len(),
            1,
            "error handler fired more than once: {handler:?}"
        );
    }
    // The endpoint stays failed.
    match ep.am_short(1, 0, b"again") {
        Err(e) if e != Status::NoResource => {}
        r => panic!("am_short after the failure: {r:?}"),
    }
}

#[test]
fn connect_to_a_closed_port_fails_cleanly() {
    if tcp_context().is_none() {
        return;
    }
    let child = spawn_self(
        "child_unreachable_port",
        &[(UNREACHABLE_CHILD, "1"), ("RUCX_TCP_MAX_CONN_RETRIES", "2")],
    );
    let (code, out, err) = finish_child(child, Duration::from_secs(120));
    assert!(
        out.contains("RESULT"),
        "child did not reach the check (exit {code})\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        out.contains("1 passed"),
        "child failed (exit {code})\nstdout:\n{out}\nstderr:\n{err}"
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let result = out.lines().find_map(|l| l.find("RESULT").map(|i| &l[i..]));
    eprintln!("child: {}", result.unwrap_or("(no RESULT line)"));
}
