//! Atomics from several processes at once: 8 processes × 10 000 fetch-adds on one counter
//! over tcp end at exactly 80 000, each process seeing increasing old values; then the same
//! with the ops emulated by compare-and-swap rounds (`RUCX_ATOMIC_EMULATE=y`, 8 × 2 000: rounds
//! of different processes contend and retry, so fewer ops keep the run short).
//!
//! The test runs this binary again as the peers (`child` below, selected by environment); the
//! target's worker address and the counter's key go through files in a temporary directory.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucp::{AtomicOp, AtomicWidth, CloseMode, Context, Features, Issued, Worker};
use uct::AsyncMode;

const PEERS: usize = 8;
const DEADLINE: Duration = Duration::from_secs(300);
/// Fetch-adds each peer keeps in flight: emulated ones that race each other retry, so fewer.
const WINDOW: usize = 64;
const WINDOW_EMULATED: usize = 2;

fn context(emulate: bool) -> Context {
    Context::builder(rucx::context_builder().plugins(false).build())
        .features(Features::AM | Features::AMO64)
        .config("TLS", "tcp")
        .config("NET_DEVICES", "lo")
        .config("ATOMIC_EMULATE", if emulate { "y" } else { "n" })
        .build()
        .expect("tcp context")
}

fn tmp_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!("rucx-atomic-mp-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One run: the counter in this process, `PEERS` child processes adding `ops` each.
fn run(emulate: bool, ops: u64) {
    let dir = tmp_dir();
    let w = Worker::with_async_mode(&context(emulate), AsyncMode::Poll).unwrap();
    let mem = w.mem_alloc(64).unwrap();
    std::fs::write(dir.join("address"), w.address()).unwrap();
    std::fs::write(dir.join("rkey"), mem.rkey_pack().unwrap()).unwrap();
    std::fs::write(dir.join("raddr"), mem.addr().to_string()).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = (0..PEERS)
        .map(|i| {
            Command::new(&exe)
                .args(["--exact", "child", "--nocapture", "--test-threads=1"])
                .env("UCP_ATOMIC_MP_DIR", &dir)
                .env("UCP_ATOMIC_MP_OPS", ops.to_string())
                .env("UCP_ATOMIC_MP_EMULATE", if emulate { "y" } else { "n" })
                .env("UCP_ATOMIC_MP_ID", i.to_string())
                .spawn()
                .expect("spawning a peer")
        })
        .collect();
    let start = Instant::now();
    let mut checked = Instant::now();
    let mut left = PEERS;
    while left > 0 {
        // Nine busy processes share the cores: give the CPU away when there is nothing to do.
        if w.progress() == 0 {
            std::thread::yield_now();
        }
        if checked.elapsed() < Duration::from_millis(10) {
            continue;
        }
        checked = Instant::now();
        left = 0;
        for c in children.iter_mut() {
            match c.try_wait() {
                Ok(Some(st)) => assert!(st.success(), "a peer failed: {st}"),
                _ => left += 1,
            }
        }
        if start.elapsed() > DEADLINE {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("timed out: {left} peers still running");
        }
    }
    for c in children.iter_mut() {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(mem.read_u64(0).unwrap(), PEERS as u64 * ops, "emulate={emulate}");
    assert!(
        mem.to_vec()[8..].iter().all(|&b| b == 0),
        "bytes after the counter written"
    );
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{PEERS} × {ops} fetch-adds (emulate={emulate}): {:?}",
        start.elapsed()
    );
}

#[test]
fn eight_processes_fetch_add() {
    run(false, 10_000);
    run(true, 2_000);
}

/// The peer: connects to the counter's worker and adds 1 `ops` times, `WINDOW` at a time.
#[test]
fn child() {
    let Ok(dir) = std::env::var("UCP_ATOMIC_MP_DIR") else {
        return; // run as a test of its own: nothing to do
    };
    let dir = Path::new(&dir);
    let ops: u64 = std::env::var("UCP_ATOMIC_MP_OPS").unwrap().parse().unwrap();
    let emulate = std::env::var("UCP_ATOMIC_MP_EMULATE").as_deref() == Ok("y");
    let w = Worker::with_async_mode(&context(emulate), AsyncMode::Poll).unwrap();
    let ep = w.connect(&std::fs::read(dir.join("address")).unwrap()).unwrap();
    let rkey = ep.rkey_unpack(&std::fs::read(dir.join("rkey")).unwrap()).unwrap();
    let raddr: u64 = std::fs::read_to_string(dir.join("raddr"))
        .unwrap()
        .parse()
        .unwrap();
    let (in_flight, done) = (Rc::new(Cell::new(0usize)), Rc::new(Cell::new(0u64)));
    let last = Rc::new(Cell::new(None::<u64>));
    let mut issued = 0;
    let start = Instant::now();
    let check = {
        let last = last.clone();
        move |v: u64| {
            // This peer's ops run in order at the target (one tcp connection).
            if !emulate {
                assert!(
                    last.get().is_none_or(|l| v > l),
                    "old value {v} after {:?}",
                    last.get()
                );
            }
            last.set(Some(v));
        }
    };
    while done.get() < ops {
        let window = if emulate { WINDOW_EMULATED } else { WINDOW };
        while issued < ops && in_flight.get() < window {
            issued += 1;
            match ep
                .atomic_fetch(AtomicOp::Add, AtomicWidth::U64, 1, raddr, &rkey)
                .unwrap()
            {
                Issued::Done(v) => {
                    check(v);
                    done.set(done.get() + 1);
                }
                Issued::Pending(r) => {
                    in_flight.set(in_flight.get() + 1);
                    let (f, d, c) = (in_flight.clone(), done.clone(), check.clone());
                    r.on_complete(move |v| {
                        c(v.expect("fetch-add"));
                        f.set(f.get() - 1);
                        d.set(d.get() + 1);
                    });
                }
            }
        }
        if w.progress() == 0 {
            std::thread::yield_now();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "peer timed out after {} ops",
            done.get()
        );
    }
    if let Issued::Pending(r) = ep.close(CloseMode::Flush) {
        r.wait(&w).expect("close");
    }
}
