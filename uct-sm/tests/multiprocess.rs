//! posix and sysv between processes: 8 senders into one receiver through a small FIFO (full,
//! pending, nothing lost or duplicated), a receiver sleeping on its event fd, `kill -9` of a
//! peer (reported, no segment left), and a process scribbling over a receiver's FIFO while
//! messages flow (no crash, no access outside the segment).
//!
//! The peers are this test binary run again (the ignored `child` test, configured through the
//! environment). Run: `cargo test -p uct-sm --test multiprocess`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rucx_testkit::child::{spawn_self, ChildGuard, Lines};
use rucx_testkit::{device, modules, worker, Dev, Entity, Setup};
use uct::{AmCbFlags, ArmEvents, PendingRequest, PendingResult, Status};

const ID: u8 = 5;
/// Failure guard for every wait (never a timing assertion).
const DEADLINE: Duration = Duration::from_secs(60);

fn setup(tl: &str) -> Setup {
    let ctx = modules::builtin(uct_sm::module());
    let res = device::find(&ctx, tl, Dev::Named("memory")).expect("memory device");
    Setup::new("sm", res)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

/// The payload of message `seq`: its length and bytes follow from `seq`.
fn payload(seq: u64) -> Vec<u8> {
    vec![seq as u8; (seq as usize * 7) % 200]
}

/// Spawns a child in `mode`, pointed at `target`'s interface.
fn spawn(mode: &str, tl: &str, target: &Entity, extra: &[(&str, &str)]) -> (ChildGuard, Lines) {
    let dev = hex(&target.iface.device_address().unwrap());
    let addr = hex(&target.iface.address().unwrap());
    let mut vars = vec![
        ("SM_TEST_MODE", mode),
        ("SM_TEST_TL", tl),
        ("SM_TEST_DEV", dev.as_str()),
        ("SM_TEST_IFACE", addr.as_str()),
    ];
    vars.extend_from_slice(extra);
    let mut c = spawn_self("child", &vars);
    let lines = Lines::new(c.0.stdout.take().unwrap());
    (c, lines)
}

/// Sends `count` messages stamped with `id`, waiting in the pending queue whenever the FIFO
/// is full; returns how many times it queued.
fn send_all(e: &Entity, ep: &uct::Ep, id: u64, count: u64) -> u64 {
    let start = Instant::now();
    let (mut seq, mut queued) = (0, 0);
    while seq < count {
        assert!(start.elapsed() < DEADLINE, "sender {id} stuck at {seq}");
        match ep.am_short(ID, (id << 32) | seq, &payload(seq)) {
            Ok(()) => seq += 1,
            Err(err) if err == Status::NoResource => {
                let ready = Rc::new(Cell::new(false));
                let r = ready.clone();
                match ep.pending_add(PendingRequest::new(move |_| {
                    r.set(true);
                    PendingResult::Done
                })) {
                    Ok(()) => {
                        queued += 1;
                        while !ready.get() {
                            assert!(start.elapsed() < DEADLINE, "pending request never dispatched");
                            e.worker.progress();
                        }
                    }
                    Err((st, _)) if st == Status::Busy => {}
                    Err((st, _)) => panic!("pending_add: {st}"),
                }
            }
            Err(err) => panic!("am_short: {err}"),
        }
    }
    queued
}

/// Sends `count` messages in chunks of 20 with a pause before each chunk (the receiver falls
/// asleep in between).
fn send_with_pauses(e: &Entity, ep: &uct::Ep, count: u64) {
    let start = Instant::now();
    let mut seq = 0;
    while seq < count {
        if seq % 20 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
        match ep.am_short(ID, (1 << 32) | seq, &payload(seq)) {
            Ok(()) => seq += 1,
            Err(err) if err == Status::NoResource => {
                e.worker.progress();
            }
            Err(err) => panic!("am_short: {err}"),
        }
        assert!(start.elapsed() < DEADLINE);
    }
}

/// Talks both ways with the parent until killed.
fn peer(e: &Entity, dev: &[u8], addr: &[u8]) {
    println!(
        "ADDR {} {}",
        hex(&e.iface.device_address().unwrap()),
        hex(&e.iface.address().unwrap())
    );
    e.iface.set_am_handler(ID, AmCbFlags::SYNC, |_| {}).unwrap();
    let ep = e.iface.ep_create_connected(dev, addr).unwrap();
    let mut seq = 0u64;
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if ep.am_short(ID, seq, b"alive").is_ok() {
            seq += 1;
        }
        e.worker.progress();
        if seq.is_multiple_of(64) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Writes random bytes all over the posix segment of the interface at `addr` for half a
/// second (opening it as a file through /proc).
fn vandal(addr: &[u8]) {
    use std::os::unix::fs::FileExt;
    let pid = u32::from_le_bytes(addr[..4].try_into().unwrap());
    let fd = u64::from_le_bytes(addr[4..12].try_into().unwrap());
    let len = u64::from_le_bytes(addr[12..20].try_into().unwrap());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ std::process::id() as u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let start = Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < Duration::from_millis(500) {
        let off = next() % len;
        let n = (next() % 64 + 1).min(len - off) as usize;
        let bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        f.write_at(&bytes, off).unwrap();
        writes += 1;
    }
    println!("DONE {writes}");
}

/// The peer process (see the module documentation).
#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let tl = env("SM_TEST_TL");
    let dev = unhex(&env("SM_TEST_DEV"));
    let addr = unhex(&env("SM_TEST_IFACE"));
    let mode = env("SM_TEST_MODE");
    if mode == "vandal" {
        return vandal(&addr);
    }
    let s = setup(&tl);
    let e = s.entity(&worker());
    match mode.as_str() {
        "sender" => {
            let ep = e.iface.ep_create_connected(&dev, &addr).unwrap();
            send_with_pauses(&e, &ep, env("SM_TEST_COUNT").parse().unwrap());
            println!("SENT 0");
        }
        "pending_sender" => {
            let ep = e.iface.ep_create_connected(&dev, &addr).unwrap();
            let id: u64 = env("SM_TEST_ID").parse().unwrap();
            let queued = send_all(&e, &ep, id, env("SM_TEST_COUNT").parse().unwrap());
            println!("SENT {queued}");
        }
        "peer" => peer(&e, &dev, &addr),
        m => panic!("unknown mode {m}"),
    }
}

/// Records `(sender, seq)` of every message, checking each payload.
type Log = Rc<RefCell<Vec<(u64, u64)>>>;

fn receiver(tl: &str, fifo: &str) -> (Entity, Log) {
    let s = setup(tl).config("MM_FIFO_SIZE", fifo);
    let rx = s.entity(&worker());
    let log: Log = Rc::default();
    let l = log.clone();
    rx.iface
        .set_am_handler(ID, AmCbFlags::SYNC, move |m| {
            let h = m.header();
            let (id, seq) = (h >> 32, h & 0xffff_ffff);
            assert_eq!(&m.data()[8..], &payload(seq)[..], "payload of {id}:{seq}");
            l.borrow_mut().push((id, seq));
        })
        .unwrap();
    (rx, log)
}

fn eight_senders(tl: &str) {
    const SENDERS: u64 = 8;
    const COUNT: u64 = 3000;
    let (rx, log) = receiver(tl, "8");
    let count = COUNT.to_string();
    let ids: Vec<String> = (0..SENDERS).map(|i| i.to_string()).collect();
    let mut kids: Vec<_> = ids
        .iter()
        .map(|id| {
            spawn(
                "pending_sender",
                tl,
                &rx,
                &[("SM_TEST_ID", id.as_str()), ("SM_TEST_COUNT", count.as_str())],
            )
        })
        .collect();
    let start = Instant::now();
    while log.borrow().len() < (SENDERS * COUNT) as usize {
        assert!(
            start.elapsed() < DEADLINE,
            "got {} of {} messages",
            log.borrow().len(),
            SENDERS * COUNT
        );
        // Short naps keep the FIFO of 8 full, so senders queue.
        if rx.worker.progress() == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let mut queued = 0;
    for (_, lines) in kids.iter_mut() {
        let q = lines
            .wait("SENT ", DEADLINE, &rx.worker)
            .expect("sender finished");
        queued += q.parse::<u64>().unwrap();
    }
    for _ in 0..1000 {
        rx.worker.progress();
    }
    let mut next: HashMap<u64, u64> = HashMap::new();
    for &(id, seq) in log.borrow().iter() {
        let n = next.entry(id).or_default();
        assert_eq!(
            seq, *n,
            "sender {id}: message {seq} out of order, lost or duplicated"
        );
        *n += 1;
    }
    assert_eq!(log.borrow().len() as u64, SENDERS * COUNT, "extra messages");
    assert!(queued > 0, "the FIFO never filled: pending was not exercised");
}

#[test]
fn eight_senders_into_one_receiver_posix() {
    eight_senders("posix");
}

#[test]
fn eight_senders_into_one_receiver_sysv() {
    eight_senders("sysv");
}

fn sleeping_receiver(tl: &str) {
    const COUNT: u64 = 600;
    let (rx, log) = receiver(tl, "16");
    let count = COUNT.to_string();
    let (_kid, _lines) = spawn("sender", tl, &rx, &[("SM_TEST_COUNT", count.as_str())]);
    let start = Instant::now();
    let mut sleeps = 0;
    loop {
        assert!(start.elapsed() < DEADLINE);
        while rx.worker.progress() > 0 {}
        if log.borrow().len() == COUNT as usize {
            break;
        }
        match rx.iface.event_arm(ArmEvents::RECV) {
            Err(e) if e == Status::Busy => continue,
            Err(e) => panic!("event_arm: {e}"),
            Ok(()) => {}
        }
        let fd = rx.iface.event_fd().unwrap();
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        let n = poll(&mut fds, PollTimeout::from(20_000u16)).unwrap();
        assert!(
            n > 0,
            "slept 20 s with {} of {COUNT} messages: a wakeup was lost",
            log.borrow().len()
        );
        sleeps += 1;
    }
    let seqs: Vec<u64> = log.borrow().iter().map(|m| m.1).collect();
    assert_eq!(seqs, (0..COUNT).collect::<Vec<_>>());
    assert!(sleeps > 0, "the receiver never slept");
}

#[test]
fn sleeping_receiver_gets_every_message_posix() {
    sleeping_receiver("posix");
}

#[test]
fn sleeping_receiver_gets_every_message_sysv() {
    sleeping_receiver("sysv");
}

/// Segments of process `pid` visible anywhere: posix names in /dev/shm, or the sysv `shmid`.
fn leftovers(pid: u32, shmid: Option<u64>) -> Vec<String> {
    let prefix = format!("rucx-sm-{pid}-");
    let mut out: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    if let Some(id) = shmid {
        let listed = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
        let id = id.to_string();
        if listed
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(id.as_str()))
        {
            out.push(format!("sysv shmid {id}"));
        }
    }
    out
}

fn killed_peer(tl: &str) {
    let s = setup(tl);
    let me = s.entity(&worker());
    let got = Rc::new(Cell::new(0u64));
    let g = got.clone();
    me.iface
        .set_am_handler(ID, AmCbFlags::SYNC, move |_| g.set(g.get() + 1))
        .unwrap();
    let (mut kid, mut lines) = spawn("peer", tl, &me, &[]);
    let a = lines.wait("ADDR ", DEADLINE, &me.worker).expect("child address");
    let mut parts = a.split(' ');
    let (dev, addr) = (unhex(parts.next().unwrap()), unhex(parts.next().unwrap()));
    let ep = me.iface.ep_create_connected(&dev, &addr).unwrap();
    let pid = kid.0.id();
    let shmid = (tl == "sysv").then(|| u64::from_le_bytes(addr[4..12].try_into().unwrap()));
    // Messages flow both ways.
    let start = Instant::now();
    let mut sent = 0;
    while got.get() < 100 || sent < 100 {
        assert!(start.elapsed() < DEADLINE);
        if ep.am_short(ID, sent, b"to the child").is_ok() {
            sent += 1;
        }
        me.worker.progress();
    }
    kid.0.kill().unwrap();
    kid.0.wait().unwrap();
    let start = Instant::now();
    while me.errors.borrow().is_empty() {
        assert!(start.elapsed() < DEADLINE, "killed peer never reported");
        let _ = ep.am_short(ID, 0, b"anyone?");
        me.worker.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(*me.errors.borrow(), vec![(ep.key(), Status::ConnectionReset)]);
    assert!(ep.am_short(ID, 0, b"x").is_err());
    // Our mapping holds the last reference: detaching removes a sysv segment.
    drop(ep);
    let left = leftovers(pid, shmid);
    assert!(left.is_empty(), "segments left after the peer died: {left:?}");
}

#[test]
fn killed_peer_is_reported_and_leaves_no_segment_posix() {
    killed_peer("posix");
}

#[test]
fn killed_peer_is_reported_and_leaves_no_segment_sysv() {
    killed_peer("sysv");
}

/// A process writes random bytes over a receiver's whole posix segment (header, counters,
/// elements) while a sender in this process keeps sending: the receiver survives, and every
/// message its handler sees has a length that fits an element.
#[test]
fn vandal_scribbling_over_the_fifo_cannot_crash_the_receiver() {
    let s = setup("posix").config("MM_FIFO_SIZE", "16");
    let rx = s.entity(&worker());
    let tx = s.entity(&worker());
    let cap = rx.attr().am.max_short;
    let seen = Rc::new(Cell::new(0u64));
    let sn = seen.clone();
    rx.iface
        .set_am_handler(ID, AmCbFlags::SYNC, move |m| {
            assert!(m.data().len() <= cap, "a message longer than an element");
            sn.set(sn.get() + 1);
        })
        .unwrap();
    let ep = tx
        .iface
        .ep_create_connected(&rx.iface.device_address().unwrap(), &rx.iface.address().unwrap())
        .unwrap();
    // Delivered before the vandal starts, so that the handler is known to be reached: while
    // it scribbles, the FIFO may stay too corrupted for any message to get through (then the
    // point is only that the receiver survives what it reads).
    let start = Instant::now();
    let mut seq = 0u64;
    while seen.get() < 16 {
        assert!(
            start.elapsed() < DEADLINE,
            "the FIFO delivered {} of 16 before any vandal",
            seen.get()
        );
        let _ = ep.am_short(ID, seq, &payload(seq));
        seq += 1;
        tx.worker.progress();
        rx.worker.progress();
    }
    let before = seen.get();
    let (_kid, mut lines) = spawn("vandal", "posix", &rx, &[]);
    let mut done = None;
    while done.is_none() {
        assert!(start.elapsed() < DEADLINE);
        for _ in 0..8 {
            let _ = ep.am_short(ID, seq, &payload(seq));
            seq += 1;
        }
        tx.worker.progress();
        rx.worker.progress();
        done = lines.wait("DONE ", Duration::from_millis(1), &rx.worker);
    }
    for _ in 0..10_000 {
        rx.worker.progress();
        tx.worker.progress();
    }
    eprintln!("delivered while scribbled over: {}", seen.get() - before);
    assert!(
        done.unwrap().parse::<u64>().unwrap() > 0,
        "the vandal wrote nothing"
    );
}
