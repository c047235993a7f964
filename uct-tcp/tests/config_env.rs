//! `RUCX_TCP_*` / `RUCX_NET_DEVICES` from the environment. One test function: it changes the
//! process environment, which the other tests (other binaries) must not see.

mod common;

use std::time::Instant;

use common::*;
use uct::*;

fn open_lo(c: &Context) -> Result<Iface> {
    let (md, _) = c.find_resource("tcp", "lo")?;
    Iface::open(&md, &worker(), IfaceParams::new("tcp", "lo"))
}

#[test]
fn configuration_from_the_environment() {
    let c = ctx();
    // Invalid values are refused with InvalidParam (and a log line naming the variable).
    for (var, val) in [
        ("RUCX_TCP_RX_SEG_SIZE", "4k"),
        ("RUCX_TCP_TX_SEG_SIZE", "lots"),
        ("RUCX_TCP_PORT_RANGE", "9-3"),
        ("RUCX_TCP_MAX_IOV", "0"),
        ("RUCX_TCP_KEEPCNT", "many"),
        ("RUCX_TCP_MAX_POLL", "0"),
        ("RUCX_TCP_TX_COALESCE", "2g"),
        ("RUCX_TCP_DIRECT_READS", "sometimes"),
        ("RUCX_TCP_CONGESTION", "re no"),
        ("RUCX_TCP_CONGESTION", "a_name_too_long_for_the_kernel"),
    ] {
        std::env::set_var(var, val);
        assert_eq!(open_lo(&c).err(), Some(Status::InvalidParam), "{var}={val}");
        std::env::remove_var(var);
    }
    // Sizes shape the attributes.
    std::env::set_var("RUCX_TCP_TX_SEG_SIZE", "1k");
    std::env::set_var("RUCX_TCP_RX_SEG_SIZE", "2k");
    std::env::set_var("RUCX_TCP_MAX_IOV", "3");
    let i = open_lo(&c).unwrap();
    assert_eq!(
        (i.attr().am.max_short, i.attr().am.max_zcopy, i.attr().am.max_iov),
        (1024, 2048, 3)
    );
    drop(i);
    for v in ["RUCX_TCP_TX_SEG_SIZE", "RUCX_TCP_RX_SEG_SIZE", "RUCX_TCP_MAX_IOV"] {
        std::env::remove_var(v);
    }
    // Device selection.
    std::env::set_var("RUCX_NET_DEVICES", "^lo");
    assert!(c.find_resource("tcp", "lo").is_err(), "lo excluded");
    std::env::set_var("RUCX_NET_DEVICES", "lo");
    assert!(c.find_resource("tcp", "lo").is_ok());
    std::env::remove_var("RUCX_NET_DEVICES");
    // A connect-to-ep endpoint whose peer never connects gives up after CONN_TIMEOUT.
    std::env::set_var("RUCX_TCP_CONN_TIMEOUT", "300ms");
    let a = side(&c, &worker());
    let b = side(&c, &worker());
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
    let (waiter, side_w, key) = if a_port > b_port {
        ea.connect_to_ep(&db, &ba).unwrap();
        (&ea, &a, ea.key())
    } else {
        eb.connect_to_ep(&da, &aa).unwrap();
        (&eb, &b, eb.key())
    };
    let start = Instant::now();
    while side_w.errors.borrow().is_empty() {
        side_w.worker.progress();
        assert!(start.elapsed() < DEADLINE, "no timeout report");
    }
    assert_eq!(side_w.errors.borrow()[0], (key, Status::Unreachable));
    assert_eq!(waiter.am_short(1, 0, b"x"), Err(Status::Unreachable));
    std::env::remove_var("RUCX_TCP_CONN_TIMEOUT");
    // Retries: a closed port fails after MAX_CONN_RETRIES attempts.
    std::env::set_var("RUCX_TCP_MAX_CONN_RETRIES", "2");
    let s = side(&c, &worker());
    let (dev, addr) = {
        let gone = side(&c, &worker());
        (
            gone.iface.device_address().unwrap(),
            gone.iface.address().unwrap(),
        )
    };
    let ep = s.iface.ep_create_connected(&dev, &addr).unwrap();
    let start = Instant::now();
    while s.errors.borrow().is_empty() {
        s.worker.progress();
        assert!(start.elapsed() < DEADLINE);
    }
    assert_eq!(s.errors.borrow()[0], (ep.key(), Status::Unreachable));
    std::env::remove_var("RUCX_TCP_MAX_CONN_RETRIES");
    // TX_COALESCE=0: a burst goes out send by send, without the sender's progress.
    std::env::set_var("RUCX_TCP_TX_COALESCE", "0");
    let p = Pair::new(Model::Iface, false);
    let rec = p.record(1);
    p.retry("warm-up", || p.ep.am_short(1, 0, b"w")).unwrap();
    p.wait("warm-up", || rec.borrow().len() == 1);
    p.a.worker.progress();
    for s in 1..=3u64 {
        p.ep.am_short(1, s, b"burst").unwrap();
    }
    let start = Instant::now();
    while rec.borrow().len() < 4 {
        p.b.worker.progress();
        assert!(
            start.elapsed() < DEADLINE,
            "a burst waited for the sender's progress"
        );
    }
    std::env::remove_var("RUCX_TCP_TX_COALESCE");
}
