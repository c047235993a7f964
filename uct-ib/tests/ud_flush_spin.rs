//! A caller spinning on `flush` (as `ucx_perftest` and most UCX users do: flush, progress,
//! flush again) while the peer is silent: ud_verbs asks for the ACK once per last sent
//! packet, not once per call. Counted on the device's port (rxe's `hw_counters/sent_pkts`),
//! so this is the only test of its binary: nothing else sends while it counts. The timer tick
//! is 1 s here, so no resend or delayed ACK falls into the count.

use std::time::Duration;

use rucx_testkit::wait::{retry, wait_for};
use rucx_testkit::{device, modules, pair, worker, Dev, Entity, Setup};
use ucs::Outcome;
use uct::*;

const DEADLINE: Duration = Duration::from_secs(60);

/// Packets the port has sent so far, where the device counts them (rxe does).
fn sent_packets(dev: &str) -> Option<u64> {
    let (name, port) = dev.split_once(':')?;
    let path = format!("/sys/class/infiniband/{name}/ports/{port}/hw_counters/sent_pkts");
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// [`sent_packets`] once it stops moving: rxe sends from a tasklet, which a spinning
/// process at normal priority lets run only when the scheduler preempts it, so the count of
/// a post can lag. Nothing here progresses meanwhile, so nothing new is sent.
fn settled_count(dev: &str) -> u64 {
    let mut last = sent_packets(dev).unwrap();
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(20));
        let now = sent_packets(dev).unwrap();
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("{dev}: the sent packet count kept moving for 4 s");
}

/// Sends one message on `ab`, then calls `flush` and progresses `a` 200 times each for the
/// endpoint and the interface while `b` does not progress; returns the packets sent meanwhile.
fn spin_while_peer_is_silent(a: &Entity, b: &Entity, ab: &Ep, dev: &str, seq: u64) -> (u64, Completion) {
    retry(&[a, b], DEADLINE, "send", || ab.am_short(0, seq, b"x")).unwrap();
    a.worker.progress(); // the message itself is posted by now
    let before = settled_count(dev);
    let c = Completion::counter();
    for i in 0..200 {
        let comp = if i == 0 { Some(&c) } else { None };
        assert_eq!(ab.flush(FlushFlags::LOCAL, comp), Ok(Outcome::InProgress));
        a.worker.progress();
    }
    for _ in 0..200 {
        assert_eq!(a.iface.flush(FlushFlags::LOCAL, None), Ok(Outcome::InProgress));
        a.worker.progress();
    }
    (settled_count(dev) - before, c)
}

#[test]
fn flush_spin_asks_for_one_ack_per_last_packet() {
    let ctx = modules::builtin(uct_ib::module());
    let Some(res) = device::find(&ctx, "ud_verbs", Dev::First) else {
        println!("skipped: no RDMA device");
        return;
    };
    let dev = res.dev.clone();
    // no timer tick (resends, delayed ACKs) while the test counts: only flush asks
    let u = Setup::new("ud_verbs", res).config("UD_TIMER_TICK", "1s");
    if sent_packets(&dev).is_none() {
        println!("skipped: {dev} has no hw_counters/sent_pkts");
        return;
    }
    let (a, b) = (u.entity(&worker()), u.entity(&worker()));
    let (ab, _ba) = pair::connect_to_ep(&a, &b);
    let rec = b.record_am(0);
    let s = [&a, &b];
    for seq in 1..=2u64 {
        let (sent, c) = spin_while_peer_is_silent(&a, &b, &ab, &dev, seq);
        assert!(
            sent == 1,
            "message {seq}: {sent} packets for 400 flush calls while the peer was silent \
             (one ACK request expected)"
        );
        assert_eq!(c.fired(), 0, "flush completed before the peer received anything");
        wait_for(&s, DEADLINE, "flush", || c.fired() == 1);
        assert_eq!(c.last_status(), Status::Ok);
        assert_eq!(rec.borrow().len() as u64, seq);
        assert_eq!(ab.flush(FlushFlags::LOCAL, None), Ok(Outcome::Done));
    }
}
