//! Soak: a UCP server (tcp on lo) serving honest clients while hostile peers send it every
//! class of attack at once: first fragments claiming huge messages, unexpected tag floods,
//! rendezvous announcements that never send data, unread stream floods, wireup REQUEST floods
//! under forged names. The attackers are real UCP workers (known peers, so their frames get
//! past the known-peer checks) plus a raw uct endpoint speaking in their names; each is
//! replaced by a fresh one once the server failed it. The honest clients exchange verified
//! ping-pong messages (eager and rendezvous) the whole time; the run ends with every message
//! answered intact, no honest endpoint failed, and the process's resident memory grown by
//! less than the budgets allow. Run by `scripts/soak.sh` (release; `SOAK_SECS`, default
//! 20); ignored in a plain `cargo test`.

use std::time::{Duration, Instant};

use ucp::{Context, Ep, Features, Issued, Request, TagRecvd, Worker, WorkerAddress};
use uct::AsyncMode;

const CLIENTS: usize = 3;
const LIMITS: &[(&str, &str)] = &[
    ("TLS", "tcp"),
    ("NET_DEVICES", "lo"),
    ("REASM_PEER_LIMIT", "1m"),
    ("REASM_WORKER_LIMIT", "4m"),
    ("REASM_TIMEOUT", "300ms"),
    ("TAG_UNEXP_PEER_LIMIT", "1m"),
    ("TAG_UNEXP_WORKER_LIMIT", "4m"),
    ("STREAM_PEER_LIMIT", "1m"),
    ("STREAM_WORKER_LIMIT", "4m"),
    ("RNDV_TIMEOUT", "300ms"),
    ("PASSIVE_WORKER_LIMIT", "256"),
];

/// What the server may hold for peers under [`LIMITS`], with room for the honest traffic,
/// the allocator's slack and the attackers' own workers in this process.
const RSS_GROWTH_MAX: usize = 192 << 20;

fn rss() -> usize {
    ucs::sys::resident_bytes().unwrap_or(0)
}

fn le(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed) as u8)
        .collect()
}

fn context() -> Context {
    LIMITS
        .iter()
        .fold(
            Context::builder(rucx::context_builder().plugins(false).build()),
            |b, (k, v)| b.config(k, v),
        )
        .features(Features::AM | Features::TAG | Features::STREAM)
        .build()
        .expect("a tcp context on lo")
}

/// An attacker: a UCP worker the server knows, and a raw uct endpoint to the server's
/// interface on which it speaks in that worker's name.
struct Attacker {
    raw: uct::Ep,
    _iface: uct::Iface,
    _ep: Ep,
    worker: Worker,
    n: u64,
}

fn attacker(ctx: &Context, server: &Worker) -> Attacker {
    let worker = Worker::with_async_mode(ctx, AsyncMode::Poll).unwrap();
    let ep = worker.connect(server.address()).unwrap();
    let victim = WorkerAddress::unpack(server.address()).unwrap();
    let e = victim.entries.iter().find(|e| e.tl.tl_name == "tcp").unwrap();
    let uct = rucx::context_builder().plugins(false).build();
    let (md, _) = uct.find_resource("tcp", &e.tl.dev_name).unwrap();
    let iface = uct::Iface::open(&md, worker.uct(), uct::IfaceParams::new("tcp", &e.tl.dev_name)).unwrap();
    let raw = iface.ep_create_connected(&e.dev_addr, &e.iface_addr).unwrap();
    Attacker {
        raw,
        _iface: iface,
        _ep: ep,
        worker,
        n: 0,
    }
}

impl Attacker {
    /// One frame of the next attack class (none when the lane is full).
    fn attack(&mut self) {
        self.n += 1;
        let (me, n) = (self.worker.id(), self.n);
        let addr = WorkerAddress::unpack(self.worker.address()).unwrap();
        let (id, bytes): (u8, Vec<u8>) = match n % 6 {
            // an AM first fragment claiming 1 GiB
            0 => (
                3,
                [&le(2)[..], &le(me), &le(n), &le(1 << 30), &[7; 1000]].concat(),
            ),
            // a tag first fragment claiming 1 GiB
            1 => (
                11,
                [
                    &le(99)[..],
                    &le(me),
                    &le(n),
                    &le(1 << 30),
                    &le(0),
                    &le(0),
                    &[7; 1000],
                ]
                .concat(),
            ),
            // an unexpected eager tag message nobody receives
            2 => (9, [&le(0xdead)[..], &[1; 1000]].concat()),
            // a rendezvous announcement that will never send data
            3 => (
                14,
                [
                    &le(0xbeef)[..],
                    &le(me),
                    &le(1),
                    &le(n),
                    &le(1 << 20),
                    &le(0x1000),
                    &[0, 0, 255, 0, 0, 0, 0, 0],
                ]
                .concat(),
            ),
            // stream bytes nobody reads
            4 => (15, [&le(me)[..], &le(1), &[2; 1000]].concat()),
            // a wireup REQUEST under a forged name
            _ => {
                let mut a = addr.clone();
                a.uuid = 0x5eed_0000_0000 | n;
                let p = a.pack();
                let head = [&[1u8, 1, 0, 0][..], &(p.len() as u32).to_le_bytes()].concat();
                (1, [&head[..], &le(a.uuid), &le(n), &le(0), &le(0), &p].concat())
            }
        };
        let _ = self.raw.am_bcopy(id, |b| {
            let k = bytes.len().min(b.len());
            b[..k].copy_from_slice(&bytes[..k]);
            k
        });
    }
}

/// An honest client: its endpoint to the server, the message in flight and the receive of
/// its answer.
struct Client {
    worker: Worker,
    ep: Ep,
    seq: u64,
    answer: Option<Request<TagRecvd>>,
    sent: Vec<u8>,
    done: u64,
}

fn message(seq: u64) -> Vec<u8> {
    let len = [64usize, 9000, 200_000][(seq % 3) as usize];
    pattern(len, seq)
}

#[test]
#[ignore = "run by scripts/soak.sh (release, bounded time)"]
fn soak() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let ctx = context();
    let server = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
    let mut clients: Vec<Client> = (0..CLIENTS)
        .map(|_| {
            let worker = Worker::with_async_mode(&ctx, AsyncMode::Poll).unwrap();
            let ep = worker.connect(server.address()).unwrap();
            Client {
                worker,
                ep,
                seq: 0,
                answer: None,
                sent: Vec::new(),
                done: 0,
            }
        })
        .collect();
    // The server's endpoints back to the clients, and one receive posted per client.
    let back: Vec<Ep> = clients
        .iter()
        .map(|c| server.connect(c.worker.address()).unwrap())
        .collect();
    let post = |i: usize| match server.tag_recv(i as u64, u64::MAX, vec![0; 256 << 10]).unwrap() {
        Issued::Pending(r) => r,
        Issued::Done(_) => panic!("client {i}'s message before it was sent"),
    };
    let mut posted: Vec<Request<TagRecvd>> = (0..CLIENTS).map(post).collect();
    let progress_all = |clients: &[Client], extra: &[&Worker]| {
        server.progress();
        for c in clients {
            c.worker.progress();
        }
        for w in extra {
            w.progress();
        }
    };
    // Warm up: every client's first exchange before the attacks and the memory baseline.
    let mut attackers: Vec<Attacker> = Vec::new();
    let start = Instant::now();
    let base = rss();
    let mut most = base;
    let mut replaced = 0;
    let mut rotated = Instant::now();
    let mut held = [0usize; 3];
    while start.elapsed() < Duration::from_secs(secs) {
        for (i, c) in clients.iter_mut().enumerate() {
            if c.answer.is_none() {
                c.seq += 1;
                c.sent = message(c.seq);
                c.answer = match c.worker.tag_recv(i as u64, u64::MAX, vec![0; 256 << 10]).unwrap() {
                    Issued::Pending(r) => Some(r),
                    Issued::Done(_) => panic!("an answer before the question"),
                };
                let _ = c.ep.tag_send(i as u64, &c.sent).unwrap();
            }
        }
        for (i, r) in posted.iter_mut().enumerate() {
            if let Some(got) = r.take() {
                let got = got.unwrap_or_else(|e| panic!("the server's receive from client {i}: {e}"));
                let _ = back[i].tag_send(i as u64, &got.data).unwrap();
                *r = post(i);
            }
        }
        for c in &mut clients {
            if let Some(got) = c.answer.as_mut().and_then(|r| r.take()) {
                let got = got.unwrap_or_else(|e| panic!("a client's answer: {e}"));
                assert!(got.data == c.sent, "answer {} came back changed", c.seq);
                c.answer = None;
                c.done += 1;
            }
        }
        if start.elapsed() > Duration::from_millis(500) {
            // A fresh pair of attackers every second (the server fails the old ones' peers,
            // which do not learn of it: error mode None has no way to).
            if attackers.is_empty() || rotated.elapsed() > Duration::from_secs(1) {
                attackers.clear();
                attackers.push(attacker(&ctx, &server));
                attackers.push(attacker(&ctx, &server));
                replaced += 2;
                rotated = Instant::now();
            }
            for a in &mut attackers {
                for _ in 0..4 {
                    a.attack();
                }
            }
        }
        let extra: Vec<&Worker> = attackers.iter().map(|a| &a.worker).collect();
        progress_all(&clients, &extra);
        most = most.max(rss());
        let now = [
            server.reassembly().bytes,
            server.tag_unexpected().bytes,
            server.stream_unread().bytes,
        ];
        for (h, n) in held.iter_mut().zip(now) {
            assert!(
                n <= 4 << 20,
                "the server holds {n} bytes for peers, over a 4m worker limit"
            );
            *h = (*h).max(n);
        }
    }
    for (i, c) in clients.iter().enumerate() {
        assert!(c.ep.error().is_none(), "client {i} failed: {:?}", c.ep.error());
        assert!(
            back[i].error().is_none(),
            "the server's endpoint to client {i} failed"
        );
        assert!(c.done >= 10, "client {i}: only {} answers in {secs} s", c.done);
    }
    let grown = most.saturating_sub(base);
    println!(
        "soak: {secs} s, {} answers, {replaced} attackers, RSS {} MiB at start, +{} MiB at most; \
         the server held at most {held:?} bytes (reassembly, unexpected, unread) and ends with \
         {:?} reassembling, {:?} unexpected, {:?} unread, {} passive endpoints",
        clients.iter().map(|c| c.done).sum::<u64>(),
        base >> 20,
        grown >> 20,
        server.reassembly(),
        server.tag_unexpected(),
        server.stream_unread(),
        server.passive_endpoints()
    );
    assert!(grown <= RSS_GROWTH_MAX, "RSS grew by {} MiB", grown >> 20);
    // Every attack class that holds memory got some: the test tested something.
    assert!(
        held.iter().all(|&h| h > 0),
        "held at most {held:?}: some attacks did nothing"
    );
}
