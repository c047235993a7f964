//! ud_verbs over a bad network: the `RUCX_UD_TEST_*` hook drops, duplicates and reorders
//! received packets (1%, 5% and 10% loss, each with 5% duplication and 5% reordering); every
//! message must still arrive exactly once and in order, both ways, and flushes complete.
//! Skipped ("skipped: no RDMA device") without a device; run in the Soft-RoCE VM:
//!   testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1
//! One test, so that the variables it sets never race with another test's interfaces.
//! `UD_LOSS_SEED=<n>` changes the seed of the injected faults.

mod ud_common;

use std::time::Instant;

use ud_common::*;

#[test]
fn exactly_once_in_order_under_loss_duplication_and_reordering() {
    let Some((ctx, dev)) = context() else { return };
    // UD_LOSS_SEED varies the injected faults (same seed, same decisions)
    let base: u64 = std::env::var("UD_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1234);
    for (i, loss) in ["1", "5", "10"].into_iter().enumerate() {
        let seed = (base + i as u64).to_string();
        let env = Env::set(&[
            ("RUCX_UD_TEST_LOSS", loss),
            ("RUCX_UD_TEST_DUP", "5"),
            ("RUCX_UD_TEST_REORDER", "5"),
            ("RUCX_UD_TEST_SEED", &seed),
            // keep the run short on a slow VM: resend sooner
            ("RUCX_UD_TIMER_TICK", "2ms"),
        ]);
        let (a, b) = (side(&ctx, &dev), side(&ctx, &dev));
        drop(env);
        let s = [&a, &b];
        let max = a.iface.attr().am.max_bcopy;
        let (at_b, at_a) = (record(&b, 1), record(&a, 2));
        // connection requests and replies cross the bad network too
        let ab = connect_iface(&a, &b);
        let ba = connect_iface(&b, &a);
        let n = 3000;
        let t = Instant::now();
        for chunk in 0..10 {
            let (from, to) = (chunk * n / 10, (chunk + 1) * n / 10);
            send_numbered_range(&s, &ab, 1, from, to, max);
            send_numbered_range(&s, &ba, 2, from / 3, to / 3, max);
        }
        wait(&s, "every message", || {
            at_b.borrow().len() as u64 == n && at_a.borrow().len() as u64 == n / 3
        });
        flush(&s, &ab);
        flush(&s, &ba);
        println!(
            "loss {loss}%: {n} + {} messages exactly once, in order, in {:?}",
            n / 3,
            t.elapsed()
        );
        check_numbered(&at_b, n, max);
        check_numbered(&at_a, n / 3, max);
        assert!(a.errors.borrow().is_empty() && b.errors.borrow().is_empty());
    }
}

/// [`send_numbered`] for messages `from..to` (same numbering and lengths).
fn send_numbered_range(s: &[&Side], ep: &uct::Ep, id: u8, from: u64, to: u64, max_bcopy: usize) {
    for i in from..to {
        let long = (i % 7) as usize * (max_bcopy / 8);
        if i % 2 == 0 {
            let payload = vec![(i % 251) as u8; long.saturating_sub(8)];
            retry(s, "am_short", || ep.am_short(id, i, &payload)).unwrap();
        } else {
            retry(s, "am_bcopy", || {
                ep.am_bcopy(id, |b| {
                    let len = long.clamp(8, b.len());
                    b[..8].copy_from_slice(&i.to_le_bytes());
                    b[8..len].fill((i % 251) as u8);
                    len
                })
            })
            .unwrap();
        }
    }
}
