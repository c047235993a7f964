//! ud_verbs doorbell batching on a real RDMA device (run in the Soft-RoCE VM:
//! `testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1`). Sets `RUCX_UD_*` timers for
//! the whole process, so it has a file (a test binary) of its own.

mod ud_common;

use std::time::{Duration, Instant};

use ud_common::*;

/// Bursts of am_bcopy (after the first of each, posted in chains: `RUCX_IB_TX_DB_BATCH`) go
/// out with progress alone: resends are 60 s away, so a packet that progress did not post
/// would not arrive within the 10 s each burst is given.
#[test]
fn bcopy_bursts_go_out_with_progress_not_resends() {
    let _env = Env::set(&[
        ("RUCX_UD_TIMER_TICK", "60s"),
        ("RUCX_UD_MAX_RESEND_TIMEOUT", "60s"),
        ("RUCX_UD_TIMEOUT", "120s"),
    ]);
    let Some((ctx, dev)) = context() else { return };
    let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
    let (ab, _ba) = connect_ep(&a, &b);
    let at_b = record(&b, 6);
    let len = a.iface.attr().am.max_bcopy;
    let s = [&a, &b];
    let mut seq = 0u64;
    for burst in [1u64, 2, 3, 5, 7, 9, 16, 17] {
        for _ in 0..burst {
            retry(&s, "am_bcopy", || {
                ab.am_bcopy(6, |buf| {
                    buf[..8].copy_from_slice(&seq.to_le_bytes());
                    buf[8..len].fill(seq as u8);
                    len
                })
            })
            .unwrap();
            seq += 1;
        }
        let t = Instant::now();
        while (at_b.borrow().len() as u64) < seq {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "burst of {burst}: {} of {seq} messages arrived",
                at_b.borrow().len()
            );
            a.worker.progress();
            b.worker.progress();
        }
    }
    for (i, m) in at_b.borrow().iter().enumerate() {
        assert_eq!(m.len(), len, "message {i}");
        assert_eq!(
            u64::from_le_bytes(m[..8].try_into().unwrap()),
            i as u64,
            "message {i} in order"
        );
        assert!(m[8..].iter().all(|&x| x == i as u8), "message {i} intact");
    }
}
