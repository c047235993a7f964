//! Coalesced sends under random interleavings: every send flavor (am_short copied and gathered,
//! am_bcopy, am_zcopy, put_short, put_bcopy), random progress on either side, and small socket
//! buffers and phases in which the receiver stalls, so that short writes, staged bursts,
//! appends behind unsent bytes and their compaction all happen.
//! Every AM must arrive once, in order, with its bytes; the target memory must end up as the
//! puts left it. One test function: it sets `RUCX_TCP_SNDBUF`/`RCVBUF` for this process.

mod common;

use std::time::Instant;

use common::*;
use uct::*;
use uct_transport::rng::XorShift;

const ID: u8 = 9;
const MEM: usize = 64 * 1024;

#[test]
fn random_send_mix_keeps_order_and_data() {
    std::env::set_var("RUCX_TCP_SNDBUF", "16k");
    std::env::set_var("RUCX_TCP_RCVBUF", "16k");
    for seed in [1u64, 2] {
        run(seed);
    }
}

fn run(seed: u64) {
    let mut rng = XorShift::new(seed);
    let p = Pair::new(Model::Iface, false);
    let rec = p.record(ID);
    p.retry("connect", || p.ep.am_short(ID, u64::MAX, b"")).unwrap();
    p.wait("connect", || rec.borrow().len() == 1);
    rec.borrow_mut().clear();
    let (mem, rkey) = p.remote(MEM, 0);
    let mut expect_mem = vec![0u8; MEM];
    let src = p.local(16 * 1024, 0);
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let t = Instant::now();
    for i in 0..2000 {
        assert!(t.elapsed() < DEADLINE, "seed {seed}: too slow");
        // Every other block of 250 operations the receiver stalls: the socket fills, and a
        // send that gets NoResource is dropped instead of retried (only the sender progresses).
        let stalled = (i / 250) % 2 == 1;
        if rng.below(4) == 0 {
            p.a.worker.progress();
        }
        if !stalled && rng.below(3) == 0 {
            p.b.worker.progress();
        }
        let attempt = |op: &mut dyn FnMut() -> Result<()>| -> bool {
            if stalled {
                match op() {
                    Ok(()) => true,
                    Err(Status::NoResource) => {
                        p.a.worker.progress();
                        false
                    }
                    Err(e) => panic!("seed {seed}: {e}"),
                }
            } else {
                p.retry("send", &mut *op).unwrap();
                true
            }
        };
        let seq = sent.len() as u64;
        match rng.below(8) {
            // am_short: copied (up to SENDV_THRESH) or gathered from the caller's buffer.
            0..=2 => {
                let data = pattern(rng.below(4000), seed ^ seq);
                if attempt(&mut || p.ep.am_short(ID, seq, &data)) {
                    let mut m = seq.to_le_bytes().to_vec();
                    m.extend_from_slice(&data);
                    sent.push(m);
                }
            }
            3 | 4 => {
                let mut m = seq.to_le_bytes().to_vec();
                m.extend(pattern(rng.below(8000), seed ^ seq));
                let ok = attempt(&mut || {
                    let n = p.ep.am_bcopy(ID, |b| {
                        b[..m.len()].copy_from_slice(&m);
                        m.len()
                    })?;
                    assert_eq!(n, m.len());
                    Ok(())
                });
                if ok {
                    sent.push(m);
                }
            }
            5 => {
                let mut m = seq.to_le_bytes().to_vec();
                m.extend(pattern(rng.below(16 * 1024 - 8), seed ^ seq));
                src.write(0, &m[8..]).unwrap();
                let iov = [src.iov(0, m.len() - 8).unwrap()];
                let c = Completion::counter();
                let mut r = Ok(Status::Ok);
                let ok = attempt(&mut || {
                    r = p.ep.am_zcopy(ID, &m[..8], &iov, Some(&c));
                    r.map(|_| ())
                });
                if ok {
                    // `src` is reused: wait until it is written (the receiver may have to run).
                    assert_eq!(p.finish(r, &c), Status::Ok);
                    sent.push(m);
                }
            }
            k => {
                let len = 1 + rng.below(if k == 6 { 512 } else { 4000 });
                let off = rng.below(MEM - len);
                let data = pattern(len, seed ^ seq ^ 0xabc);
                let raddr = mem.addr() + off as u64;
                let ok = attempt(&mut || {
                    if k == 6 {
                        p.ep.put_short(&data, raddr, &rkey)
                    } else {
                        let n = p.ep.put_bcopy(
                            |b| {
                                b[..len].copy_from_slice(&data);
                                len
                            },
                            raddr,
                            &rkey,
                        )?;
                        assert_eq!(n, len);
                        Ok(())
                    }
                });
                if ok {
                    expect_mem[off..off + len].copy_from_slice(&data);
                }
            }
        }
    }
    p.flush();
    p.wait("all messages", || rec.borrow().len() == sent.len());
    for (i, (got, want)) in rec.borrow().iter().zip(&sent).enumerate() {
        assert_eq!(got.len(), want.len(), "seed {seed}: message {i} length");
        assert!(got == want, "seed {seed}: message {i} differs (order or bytes)");
    }
    let mut got = vec![0u8; MEM];
    mem.read(0, &mut got).unwrap();
    assert!(
        got == expect_mem,
        "seed {seed}: target memory differs from the puts"
    );
    assert!(p.a.errors.borrow().is_empty() && p.b.errors.borrow().is_empty());
}
