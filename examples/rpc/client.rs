//! The RPC client: invokes the server's procedures with arguments of each size, checks every
//! result, and prints the invocation latency percentiles.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucp::{AmFlags, Ep, Worker};

use crate::proto::{self, ECHO, OK, SHUTDOWN, TRANSFORM};
use crate::wake::{progress_until, Wake};

type Res<T> = Result<T, String>;
/// Replies by request id: the status byte and the result, or why the result was lost.
type Replies = Rc<RefCell<HashMap<u64, Res<(u8, Vec<u8>)>>>>;

pub struct Opts {
    pub sizes: Vec<usize>,
    /// Measured calls per size (a tenth of them from 256 KiB up); a tenth more warm up first.
    pub iters: usize,
    pub wake: Wake,
}

pub struct Client<'w> {
    w: &'w Worker,
    ep: Ep,
    wake: Wake,
    replies: Replies,
    next_id: u64,
}

impl<'w> Client<'w> {
    pub fn connect(w: &'w Worker, server: &[u8], wake: Wake) -> Res<Client<'w>> {
        let ep = w
            .connect(server)
            .map_err(|e| format!("connect to the server: {e}"))?;
        let replies = Replies::default();
        let r = replies.clone();
        let weak = w.downgrade();
        w.set_am_handler_with(proto::REPLY, ucp::AmHandlerFlags::RNDV_DESC, move |m| {
            let Some((id, status)) = proto::parse_header(m.header()) else {
                eprintln!(
                    "rpc client: a reply with a {}-byte header (dropped)",
                    m.header().len()
                );
                return;
            };
            match (m.take_data_desc(), weak.upgrade()) {
                // A large result comes by rendezvous: fetch it.
                (Some(desc), Some(w)) => {
                    let r = r.clone();
                    let done = move |d: ucp::Result<Vec<u8>>| {
                        let v = d
                            .map(|d| (status, d))
                            .map_err(|e| format!("fetching reply {id}: {e}"));
                        r.borrow_mut().insert(id, v);
                    };
                    match w.am_recv_data(desc, Vec::new()) {
                        Ok(fetch) => fetch.on_complete(done),
                        Err(e) => done(Err(e)),
                    }
                }
                _ => {
                    r.borrow_mut().insert(id, Ok((status, m.data().to_vec())));
                }
            }
        })
        .map_err(|e| format!("the AM handler: {e}"))?;
        Ok(Client {
            w,
            ep,
            wake,
            replies,
            next_id: 1,
        })
    }

    /// Calls `procedure(args)` and waits for its result.
    pub fn call(&mut self, procedure: u8, args: &[u8]) -> Res<Vec<u8>> {
        let id = self.next_id;
        self.next_id += 1;
        let header = proto::request_header(id, procedure);
        // The arguments are copied (a rendezvous keeps a registered copy until the server
        // fetched it): the send request, dropped, completes by itself.
        let _sent = self
            .ep
            .am_send(proto::REQUEST, &header, args, AmFlags::REPLY)
            .map_err(|e| format!("call {id}: {e}"))?;
        let replies = &self.replies;
        progress_until(self.w, self.wake, "a reply", || {
            replies.borrow().contains_key(&id)
        })?;
        let reply = replies.borrow_mut().remove(&id).expect("present");
        match reply? {
            (OK, result) => Ok(result),
            (status, _) => Err(format!("call {id}: the server answered status {status}")),
        }
    }

    /// The protocol the arguments of a `len`-byte call take.
    pub fn protocol(&self, len: usize) -> String {
        self.ep.am_protocol(9, len, AmFlags::REPLY, false).to_string()
    }
}

/// The `p`-th percentile of sorted latencies, in microseconds.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let n = sorted.len();
    let i = ((p / 100.0 * n as f64).ceil() as usize).clamp(1, n) - 1;
    sorted[i].as_secs_f64() * 1e6
}

/// Invokes ECHO and TRANSFORM alternately for each size, checks each result, prints the
/// latency percentiles, then shuts the server down.
pub fn run(w: &Worker, server: &[u8], o: &Opts) -> Res<()> {
    let mut c = Client::connect(w, server, o.wake)?;
    println!(
        "{:>10}  {:<28} {:>6} {:>10} {:>10} {:>10}",
        "arg bytes", "protocol", "calls", "p50 us", "p90 us", "p99 us"
    );
    let mut checked = 0usize;
    for &size in &o.sizes {
        let args: Vec<u8> = (0..size).map(|i| (i * 13 + size) as u8).collect();
        let transformed = proto::call(TRANSFORM, args.clone()).expect("a known procedure");
        let iters = if size >= 256 << 10 {
            o.iters.div_ceil(10)
        } else {
            o.iters
        };
        let warmup = iters.div_ceil(10);
        let mut lat = Vec::with_capacity(iters);
        for i in 0..warmup + iters {
            let (procedure, expected) = if i % 2 == 0 {
                (ECHO, &args)
            } else {
                (TRANSFORM, &transformed)
            };
            let t = Instant::now();
            let result = c.call(procedure, &args)?;
            let took = t.elapsed();
            if result != *expected {
                return Err(format!(
                    "procedure {procedure} on {size} bytes returned a wrong result ({} bytes)",
                    result.len()
                ));
            }
            checked += 1;
            if i >= warmup {
                lat.push(took);
            }
        }
        lat.sort();
        println!(
            "{size:>10}  {:<28} {iters:>6} {:>10.1} {:>10.1} {:>10.1}",
            c.protocol(size),
            percentile(&lat, 50.0),
            percentile(&lat, 90.0),
            percentile(&lat, 99.0)
        );
    }
    c.call(SHUTDOWN, &[])?;
    println!("all {checked} replies correct (echo and transform); server shut down");
    Ok(())
}
