//! cma between processes: a peer putting into a region as fast as it can while the owner
//! deregisters it. Deregistration waits for the copy in flight; from then on every put is
//! refused with `InvalidAddr` and the bytes the owner got back never change.
//!
//! The peer is this test binary run again (the ignored `child` test, configured through the
//! environment). Run: `cargo test -p uct-sm --test cma_release`.

use std::time::{Duration, Instant};

use rucx_testkit::child::{spawn_self, Lines};
use rucx_testkit::tcp::peer::hex;
use rucx_testkit::{device, modules, worker, Dev, Setup};
use uct::{Mem, MemAccess, Status};

const LEN: usize = 256 << 10;
/// Failure guard for every wait (never a timing assertion).
const DEADLINE: Duration = Duration::from_secs(60);
/// Puts the child still tries after its first refusal.
const AFTER: u32 = 2000;

fn setup() -> Setup {
    let ctx = modules::builtin(uct_sm::module());
    let res = device::find(&ctx, "cma", Dev::Named("memory")).expect("cma device");
    Setup::new("cma", res)
}

fn unhex(s: &str) -> Vec<u8> {
    rucx_testkit::tcp::peer::unhex(s).expect("hex")
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

#[test]
fn puts_racing_a_deregistration_never_land_after_it() {
    let s = setup();
    let me = s.entity(&worker());
    let mem = Mem::register(&me.md, vec![0u8; LEN], MemAccess::ALL).unwrap();
    let addr = mem.addr();
    let rkey = hex(&mem.pack_rkey().unwrap());
    let (dev, iface) = (
        hex(&me.iface.device_address().unwrap()),
        hex(&me.iface.address().unwrap()),
    );
    let mut kid = spawn_self(
        "child",
        &[
            ("CMA_TEST_DEV", &dev),
            ("CMA_TEST_IFACE", &iface),
            ("CMA_TEST_RKEY", &rkey),
            ("CMA_TEST_ADDR", &addr.to_string()),
        ],
    );
    let mut lines = Lines::new(kid.0.stdout.take().unwrap());
    lines
        .wait("PUTTING", DEADLINE, &me.worker)
        .expect("the child's first put");
    // Every byte the child writes is nonzero: landed puts show.
    let back = mem.into_vec().unwrap_or_else(|_| panic!("into_vec"));
    let snapshot = back.clone();
    assert!(
        snapshot.iter().any(|&b| b != 0),
        "no put landed before the release"
    );
    let done = lines
        .wait("DONE ", DEADLINE, &me.worker)
        .expect("the child's report");
    assert_eq!(back, snapshot, "a put landed after the deregistration returned");
    let refused: u32 = done
        .split_whitespace()
        .find_map(|w| w.strip_prefix("refused="))
        .and_then(|v| v.parse().ok())
        .expect("refused=N");
    assert!(refused > AFTER, "{done}");
    assert!(kid.0.wait().unwrap().success());
}

/// The peer: puts `(i % 255) + 1` over the whole region until refused, then `AFTER` more,
/// each of which must be refused.
#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let s = setup();
    let e = s.entity(&worker());
    let ep = e
        .iface
        .ep_create_connected(&unhex(&env("CMA_TEST_DEV")), &unhex(&env("CMA_TEST_IFACE")))
        .unwrap();
    let rkey =
        e.md.component()
            .rkey_unpack(&unhex(&env("CMA_TEST_RKEY")))
            .unwrap();
    let raddr: u64 = env("CMA_TEST_ADDR").parse().unwrap();
    let src = Mem::alloc(&e.md, LEN, MemAccess::ALL).unwrap();
    let start = Instant::now();
    let (mut ok, mut refused) = (0u64, 0u32);
    while refused <= AFTER {
        assert!(start.elapsed() < DEADLINE, "never refused ({ok} puts)");
        src.fill((ok % 255) as u8 + 1);
        match ep.put_zcopy(&[src.whole()], raddr, &rkey, None) {
            Ok(_) => {
                assert_eq!(refused, 0, "a put succeeded after a refusal");
                if ok == 0 {
                    println!("PUTTING");
                }
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e, Status::InvalidAddr, "{e}");
                refused += 1;
            }
        }
    }
    println!("DONE ok={ok} refused={refused}");
}
