//! Features not asked for at context creation are refused: each operation of a missing
//! feature fails with `Unsupported` naming it (`ucp::Features`), before it touches the
//! endpoint; with the feature the same call is accepted. Tag-only and stream pairs working
//! without `Features::AM` are the tag and stream tests.

use ucp::{AmFlags, Features, Status};

use crate::harness::Setup;
use crate::ucp_test;

ucp_test!(am_only, tag_only, everything);

/// `r` is the `Unsupported` error of a missing `feature`.
fn refused<T>(name: &str, what: &str, feature: &str, r: ucp::Result<T>) {
    let Err(e) = r else {
        panic!("[{name}] {what}: accepted without Features::{feature}")
    };
    assert_eq!(e, Status::Unsupported, "[{name}] {what}: {e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("Features::{feature}")),
        "[{name}] {what}: {e}"
    );
}

/// AM only (the default): tag, stream and RMA are refused; memory mapping is accepted (mapped
/// memory is a receive destination too: `am_recv_data_mapped`).
fn am_only(s: &Setup) {
    let Some(p) = s.pair_with(Features::AM) else {
        return;
    };
    let n = p.name;
    refused(n, "tag_send", "TAG", p.ep.tag_send(1, b"x"));
    refused(n, "tag_send_owned", "TAG", p.ep.tag_send_owned(1, vec![1; 64]));
    refused(n, "tag_send_sync", "TAG", p.ep.tag_send_sync(1, b"x"));
    refused(n, "tag_recv", "TAG", p.b.tag_recv(1, u64::MAX, vec![0; 8]));
    refused(n, "tag_probe", "TAG", p.b.tag_probe(1, u64::MAX, false));
    refused(n, "stream_send", "STREAM", p.ep.stream_send(b"x"));
    refused(n, "stream_recv", "STREAM", p.ep.stream_recv(vec![0; 8], false));
    // Mapping is accepted where a transport maps memory (not on ud_verbs alone).
    match p.b.mem_alloc(64) {
        Ok(mem) => refused(
            n,
            "put",
            "RMA",
            p.ep.rkey_unpack(&mem.rkey_pack().unwrap())
                .and_then(|k| p.ep.put(b"x", mem.addr(), &k)),
        ),
        Err(e) => assert_eq!(e, Status::Unsupported, "[{n}] mem_alloc: {e}"),
    }
    refused(n, "wait", "WAKEUP", p.a.wait());
    // What was refused left nothing behind: an active message still goes through.
    let inbox = p.inbox(7);
    p.send(7, b"h", b"data", AmFlags::default());
    p.wait_for("the active message", || !inbox.borrow().is_empty());
    assert_eq!(inbox.borrow()[0].1, b"data", "[{n}]");
}

/// Tag only: active-message sends are refused; tag messages go.
fn tag_only(s: &Setup) {
    let Some(p) = s.pair_with(Features::TAG) else {
        return;
    };
    let n = p.name;
    refused(n, "am_send", "AM", p.ep.am_send(7, &[], b"x", AmFlags::default()));
    refused(
        n,
        "am_send_owned",
        "AM",
        p.ep.am_send_owned(7, &[], vec![1; 64], AmFlags::default()),
    );
    refused(n, "stream_send", "STREAM", p.ep.stream_send(b"x"));
    refused(n, "set_am_handler", "AM", p.b.set_am_handler(7, |_| {}));
    refused(n, "am_stream", "AM", p.b.am_stream(7).map(|_| ()));
    let mut recv = match p.b.tag_recv(5, u64::MAX, vec![0; 8]).unwrap() {
        ucp::Issued::Pending(r) => r,
        ucp::Issued::Done(m) => panic!("[{n}] a receive done before the send: {m:?}"),
    };
    let _ = p.ep.tag_send(5, b"tagged").unwrap();
    p.wait_for("the tag message", || recv.is_done());
    assert_eq!(recv.take().unwrap().unwrap().data, b"tagged", "[{n}]");
}

/// Every feature (WAKEUP aside: the wakeup tests have it): none of the calls is refused for
/// its feature.
fn everything(s: &Setup) {
    let all =
        Features::AM | Features::TAG | Features::STREAM | Features::RMA | Features::AMO32 | Features::AMO64;
    let Some(p) = s.pair_with(all) else { return };
    let n = p.name;
    let accepted = |what: &str, r: ucp::Result<()>| {
        if let Err(e) = r {
            assert!(!e.to_string().contains("Features::"), "[{n}] {what}: {e}");
        }
    };
    accepted(
        "am_send",
        p.ep.am_send(7, &[], b"x", AmFlags::default()).map(drop),
    );
    accepted("tag_send", p.ep.tag_send(1, b"x").map(drop));
    accepted("stream_send", p.ep.stream_send(b"x").map(drop));
    accepted("mem_alloc", p.b.mem_alloc(64).map(drop));
    accepted("set_am_handler", p.b.set_am_handler(7, |_| {}));
    accepted("tag_probe", p.b.tag_probe(1, u64::MAX, false).map(drop));
    for _ in 0..20 {
        p.progress();
    }
}
