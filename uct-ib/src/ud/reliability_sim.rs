//! A simulation of two endpoints' reliability state over a lossy, duplicating, reordering
//! network (seeded, deterministic): every message must be delivered exactly once, in order,
//! in both directions, across PSN wraparound; a dead peer must time out.

use super::inject::Rng;
use super::reliability::*;
use super::wire::{Header, Kind};

const MS: Nanos = 1_000_000;

fn cfg() -> RelConfig {
    RelConfig {
        max_window: 64,
        initial_rto: 10 * MS,
        max_rto: 200 * MS,
        backoff: 2.0,
        peer_timeout: 2000 * MS,
    }
}

/// One side of a simulated connection: its reliability state, its sent packets' payloads
/// (message numbers, by buffer handle) and what it delivered.
struct Peer {
    rel: Reliability<u32>,
    skbs: Vec<u32>,
    free: Vec<u32>,
    delivered: Vec<u32>,
    next_msg: u32,
    to_send: u32,
    timed_out: bool,
    resent: u64,
}

struct Packet {
    at: Nanos,
    to: usize,
    hdr: [u8; 12],
    msg: u32,
}

struct Net {
    rng: Rng,
    loss: f64,
    dup: f64,
    reorder: f64,
    dead_after: Option<Nanos>,
    inflight: Vec<Packet>,
    sent: u64,
}

impl Net {
    fn send(&mut self, now: Nanos, to: usize, hdr: Header, msg: u32) {
        self.sent += 1;
        if self.dead_after.is_some_and(|d| now >= d) || self.rng.next_f64() < self.loss {
            return;
        }
        let copies = if self.rng.next_f64() < self.dup { 2 } else { 1 };
        for _ in 0..copies {
            let mut lat = 20_000;
            if self.rng.next_f64() < self.reorder {
                lat += self.rng.below(200_000); // overtaken by later packets
            }
            self.inflight.push(Packet {
                at: now + lat,
                to,
                hdr: hdr.to_bytes(),
                msg,
            });
        }
    }
}

impl Peer {
    fn new(cfg: RelConfig, to_send: u32) -> Peer {
        Peer {
            rel: Reliability::new(cfg),
            skbs: vec![0; 4096],
            free: (0..4096).rev().collect(),
            delivered: vec![],
            next_msg: 0,
            to_send,
            timed_out: false,
            resent: 0,
        }
    }

    fn pump(&mut self, me: usize, now: Nanos, net: &mut Net) {
        while let Some(r) = self.rel.next_resend() {
            self.resent += 1;
            let h = Header {
                kind: Kind::Am,
                am_id: 0,
                flags: r.stamp.flags,
                dest_ep: 0,
                psn: r.stamp.psn,
                ack_psn: r.stamp.ack_psn,
            };
            net.send(now, 1 - me, h, self.skbs[r.skb as usize]);
        }
        while self.next_msg < self.to_send && self.rel.can_send() {
            let skb = self.free.pop().expect("skbs");
            self.skbs[skb as usize] = self.next_msg;
            let s = self.rel.send(skb);
            let h = Header {
                kind: Kind::Am,
                am_id: 0,
                flags: s.flags,
                dest_ep: 0,
                psn: s.psn,
                ack_psn: s.ack_psn,
            };
            net.send(now, 1 - me, h, self.next_msg);
            self.next_msg += 1;
        }
        if self.rel.needs_ack_now() {
            self.send_ack(me, now, net);
        }
    }

    fn send_ack(&mut self, me: usize, now: Nanos, net: &mut Net) {
        let ack = self.rel.take_ack();
        let h = Header {
            kind: Kind::Ack,
            am_id: 0,
            flags: ack.flags,
            dest_ep: 0,
            psn: 0,
            ack_psn: ack.psn,
        };
        net.send(now, 1 - me, h, u32::MAX);
    }

    fn receive(&mut self, p: &Packet) {
        let h = Header::decode(&p.hdr).expect("valid header");
        let free = &mut self.free;
        self.rel.on_ack(h.ack_psn, h.gap(), |_, skb| free.push(skb));
        if h.kind == Kind::Am && self.rel.on_receive(h.psn, h.ack_req()) == RxVerdict::Deliver {
            self.delivered.push(p.msg);
        }
    }
}

struct Outcome {
    peers: [Peer; 2],
    elapsed: Nanos,
    packets: u64,
}

/// Runs two peers over a simulated network until both delivered everything (or a peer
/// timed out), with the timer ticking every millisecond.
fn simulate(net: &mut Net, cfg: RelConfig, msgs: [u32; 2], limit: Nanos) -> Outcome {
    let mut peers = [Peer::new(cfg, msgs[0]), Peer::new(cfg, msgs[1])];
    let mut now: Nanos = 0;
    let step = 10_000;
    let mut next_tick = MS;
    loop {
        for (i, p) in peers.iter_mut().enumerate() {
            p.pump(i, now, net);
        }
        now += step;
        let (due, rest): (Vec<Packet>, Vec<Packet>) = net.inflight.drain(..).partition(|p| p.at <= now);
        net.inflight = rest;
        for p in &due {
            peers[p.to].receive(p);
        }
        if now >= next_tick {
            next_tick += MS;
            for (i, p) in peers.iter_mut().enumerate() {
                let o = p.rel.on_timer(now);
                if o.timeout {
                    p.timed_out = true;
                }
                if o.send_ack {
                    p.send_ack(i, now, net);
                }
            }
        }
        let done = peers[0].delivered.len() as u32 == msgs[1]
            && peers[1].delivered.len() as u32 == msgs[0]
            && peers.iter().all(|p| p.rel.outstanding() == 0);
        if done || peers.iter().any(|p| p.timed_out) || now > limit {
            return Outcome {
                peers,
                elapsed: now,
                packets: net.sent,
            };
        }
    }
}

fn lossy(seed: u64, loss: f64, dup: f64, reorder: f64) -> Net {
    Net {
        rng: Rng::new(seed),
        loss,
        dup,
        reorder,
        dead_after: None,
        inflight: vec![],
        sent: 0,
    }
}

fn check_exactly_once_in_order(o: &Outcome, msgs: [u32; 2], what: &str) {
    for (i, p) in o.peers.iter().enumerate() {
        assert!(!p.timed_out, "{what}: peer {i} timed out");
        let want: Vec<u32> = (0..msgs[1 - i]).collect();
        assert!(
            p.delivered == want,
            "{what}: peer {i} delivered {} of {} (or out of order)",
            p.delivered.len(),
            want.len()
        );
        assert_eq!(p.free.len(), 4096, "{what}: peer {i} leaked send buffers");
        assert!((MIN_WINDOW..=cfg().max_window).contains(&p.rel.cwnd()));
    }
}

#[test]
fn sim_lossless_one_way() {
    let o = simulate(&mut lossy(1, 0.0, 0.0, 0.0), cfg(), [5000, 0], 60_000 * MS);
    check_exactly_once_in_order(&o, [5000, 0], "lossless");
    assert_eq!(o.peers[0].rel.cwnd(), 64, "the window opens fully without loss");
}

#[test]
fn sim_lossless_stream_with_replies_resends_nothing() {
    // a stream one way and a few messages back (like perftest's flow-control replies): the
    // stream's packets all repeat the last ack of the replies, which are not duplicate ACKs
    let msgs = [5000, 100];
    let o = simulate(&mut lossy(2, 0.0, 0.0, 0.0), cfg(), msgs, 60_000 * MS);
    check_exactly_once_in_order(&o, msgs, "stream with replies");
    let resent: Vec<u64> = o.peers.iter().map(|p| p.resent).collect();
    assert_eq!(resent, [0, 0], "resends without loss");
}

#[test]
fn sim_lossy_duplicating_reordering_both_ways() {
    for (i, loss) in [0.01, 0.05, 0.10].into_iter().enumerate() {
        let msgs = [3000, 2000];
        let mut net = lossy(100 + i as u64, loss, 0.05, 0.05);
        let o = simulate(&mut net, cfg(), msgs, 600_000 * MS);
        check_exactly_once_in_order(&o, msgs, &format!("loss {loss}"));
        println!(
            "loss {loss}: {} packets for {} messages, {} ms simulated",
            o.packets,
            5000,
            o.elapsed / MS
        );
    }
}

#[test]
fn sim_psn_wraparound() {
    let msgs = [70_000, 0];
    let o = simulate(&mut lossy(9, 0.01, 0.01, 0.01), cfg(), msgs, 3_600_000 * MS);
    check_exactly_once_in_order(&o, msgs, "wraparound");
}

#[test]
fn sim_seeds_are_deterministic() {
    let run = || {
        let o = simulate(&mut lossy(5, 0.05, 0.05, 0.05), cfg(), [500, 500], 600_000 * MS);
        (o.elapsed, o.packets)
    };
    assert_eq!(run(), run());
}

#[test]
fn sim_dead_peer_times_out() {
    let mut net = lossy(3, 0.0, 0.0, 0.0);
    net.dead_after = Some(50 * MS);
    let o = simulate(&mut net, cfg(), [1_000_000, 0], 60_000 * MS);
    assert!(o.peers[0].timed_out, "sender never declared the peer dead");
    let t = o.elapsed;
    assert!((2000 * MS..2200 * MS).contains(&t), "timed out at {} ms", t / MS);
    let mut left = 0;
    let mut p = o.peers;
    p[0].rel.drain(|_, _| left += 1);
    assert!(left > 0 && p[0].rel.outstanding() == 0);
}
