//! The server and the client: UCX's `ucp_hello_world` flow on the tag API, the failure
//! emulation of `-e`, and (after the hello) a table of tag round trips by size.

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;
use std::time::Instant;

use ucp::{
    AmFlags, AmProto, CloseMode, Context, Ep, EpParams, ErrMode, Features, Issued, TagMsg, TagRecvd, Worker,
};

use crate::args::{Args, Fail, Wake};
use crate::oob;
use crate::wake::progress_until;

/// The hello messages' tag (UCX's), matched with every bit.
const TAG: u64 = 0x1337_a880;
/// The round-trip messages, echoed by the server.
const TAG_ECHO: u64 = TAG + 1;
/// The client has no more round trips.
const TAG_DONE: u64 = TAG + 2;
const MASK: u64 = u64::MAX;
/// The round-trip table: short, copied, fragmented and rendezvous sizes on most transports.
const SIZES: &[usize] = &[8, 1024, 16 << 10, 256 << 10, 4 << 20];
/// The keepalive interval with `-e`, unless `RUCX_KEEPALIVE_INTERVAL` says otherwise: a
/// silent peer is declared dead after three intervals.
const FAIL_KEEPALIVE: &str = "0.5s";

type Res<T> = Result<T, String>;
/// The first error reported for the endpoint (by its error handler).
type Failed = Rc<RefCell<Option<String>>>;

fn context(a: &Args) -> Res<Context> {
    let mut features = Features::TAG;
    if a.wake != Wake::Busy {
        features = features | Features::WAKEUP;
    }
    let mut b = Context::builder(rucx::context()).features(features);
    if a.fail.is_some() && std::env::var_os("RUCX_KEEPALIVE_INTERVAL").is_none() {
        b = b.config("KEEPALIVE_INTERVAL", FAIL_KEEPALIVE);
    }
    b.build().map_err(|e| format!("UCP context: {e}"))
}

fn worker(ctx: &Context) -> Res<Worker> {
    Worker::new(ctx).map_err(|e| format!("UCP worker: {e}"))
}

/// Endpoint parameters: error mode `Peer` with `-e`; the handler records the failure.
fn ep_params(a: &Args, failed: &Failed) -> EpParams {
    let f = failed.clone();
    let p = EpParams::new().on_error(move |_, e| {
        f.borrow_mut().get_or_insert_with(|| e.to_string());
    });
    if a.fail.is_some() {
        p.err_mode(ErrMode::Peer)
    } else {
        p
    }
}

/// The server's message: a readable pattern of `size` bytes.
fn message(size: usize) -> Vec<u8> {
    b"UCP hello world! ".iter().copied().cycle().take(size).collect()
}

fn flush_stdout() {
    let _ = std::io::stdout().flush();
}

/// Kills this process (`-e`): the peer must find out by itself.
fn die(who: &str) -> ! {
    println!("emulating a failure: the {who} kills itself (SIGKILL)");
    flush_stdout();
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    unreachable!("SIGKILL returned")
}

/// The surviving side of `-e`: success is having seen the failure.
fn detected(failed: &Failed) -> Res<()> {
    println!(
        "peer failure detected: {}",
        failed.borrow().as_deref().unwrap_or("?")
    );
    Ok(())
}

fn wait_req<T>(w: &Worker, mode: Wake, what: &str, issued: ucp::Result<Issued<T>>) -> Res<T> {
    match issued.map_err(|e| format!("{what}: {e}"))? {
        Issued::Done(v) => Ok(v),
        Issued::Pending(mut r) => {
            progress_until(w, mode, what, || r.is_done())?;
            r.take()
                .expect("a done request has its result")
                .map_err(|e| format!("{what}: {e}"))
        }
    }
}

/// Probes for a `tag` message (removing it) until one arrived or the endpoint failed (`None`).
fn probe(w: &Worker, mode: Wake, tags: &[u64], failed: &Failed) -> Res<Option<TagMsg>> {
    let mut found = None;
    progress_until(w, mode, "a tag message", || {
        found = tags
            .iter()
            // (never an error: the context has Features::TAG)
            .find_map(|&t| w.tag_probe(t, MASK, true).ok().flatten())
            .and_then(|p| p.msg);
        found.is_some() || failed.borrow().is_some()
    })?;
    Ok(found)
}

/// Receives a probed message into a buffer of its size.
fn msg_recv(w: &Worker, mode: Wake, msg: TagMsg) -> Res<TagRecvd> {
    let len = msg.info().length;
    wait_req(w, mode, "tag_msg_recv", w.tag_msg_recv(msg, vec![0; len]))
}

pub fn server(a: &Args) -> Res<()> {
    let ctx = context(a)?;
    let w = worker(&ctx)?;
    let (listener, port) = oob::listen(a.port)?;
    println!("waiting for a client on port {port} ({})", a.wake.describe());
    flush_stdout();
    let (mut ch, peer) = oob::accept(&listener, w.address())?;
    println!("client {peer} connected; waiting for its worker address");
    let failed = Failed::default();
    let msg = probe(&w, a.wake, &[TAG], &failed)?.ok_or("no worker address came")?;
    let r = msg_recv(&w, a.wake, msg)?;
    let addr = r
        .data
        .get(8..)
        .filter(|rest| r.data[..8] == (rest.len() as u64).to_le_bytes())
        .ok_or("the client's address message is malformed")?;
    let ep = w
        .connect_with(addr, ep_params(a, &failed))
        .map_err(|e| format!("connect to the client: {e}"))?;
    println!("got the client's worker address ({} bytes)", addr.len());
    match a.fail {
        Some(Fail::Send) => die("server"),
        Some(Fail::Recv) => {
            // Tell the client it may die, and send only once it did.
            ch.send_byte()?;
            ch.wait_closed()?;
            println!("the client is gone; sending to it anyway");
            let sent = ep.tag_send(TAG, &message(a.size));
            match wait_req(&w, a.wake, "tag_send", sent) {
                Ok(()) => println!("the send completed; waiting for the error handler"),
                Err(e) => println!("the send failed: {e}"),
            }
            progress_until(&w, a.wake, "the endpoint's failure", || failed.borrow().is_some())?;
            return detected(&failed);
        }
        _ => {}
    }
    let sent = ep.tag_send(TAG, &message(a.size));
    wait_req(&w, a.wake, "tag_send", sent)?;
    println!("sent a {}-byte message", a.size);
    if a.fail == Some(Fail::Keepalive) {
        println!("waiting for the client's failure");
        progress_until(&w, a.wake, "the endpoint's failure", || failed.borrow().is_some())?;
        return detected(&failed);
    }
    let mut echoed = 0usize;
    loop {
        let msg = probe(&w, a.wake, &[TAG_ECHO, TAG_DONE], &failed)?
            .ok_or_else(|| format!("the client failed: {}", failed.borrow().as_deref().unwrap_or("?")))?;
        if msg.info().tag == TAG_DONE {
            break;
        }
        let r = msg_recv(&w, a.wake, msg)?;
        wait_req(&w, a.wake, "echo", ep.tag_send_owned(TAG_ECHO, r.data))?;
        echoed += 1;
    }
    // The client closes its endpoint: ours reports it.
    progress_until(&w, a.wake, "the client's close", || failed.borrow().is_some())?;
    ch.barrier()?;
    println!("echoed {echoed} messages; the client closed its endpoint; done");
    Ok(())
}

pub fn client(a: &Args, host: &str) -> Res<()> {
    let ctx = context(a)?;
    let w = worker(&ctx)?;
    let (mut ch, server_addr) = oob::connect(host, a.port)?;
    let failed = Failed::default();
    let ep = w
        .connect_with(&server_addr, ep_params(a, &failed))
        .map_err(|e| format!("connect to the server: {e}"))?;
    println!(
        "connected to {host}:{}: server worker {:#x} ({})",
        a.port,
        ep.remote_id(),
        a.wake.describe()
    );
    let mut hello = (w.address().len() as u64).to_le_bytes().to_vec();
    hello.extend_from_slice(w.address());
    wait_req(&w, a.wake, "sending the worker address", ep.tag_send(TAG, &hello))?;
    println!(
        "sent the worker address ({} bytes) with tag {TAG:#x}",
        w.address().len()
    );
    if a.fail == Some(Fail::Recv) {
        ch.recv_byte()?; // the server has it
        die("client");
    }
    let msg = probe(&w, a.wake, &[TAG], &failed)?;
    let msg = match (msg, a.fail) {
        (None, Some(Fail::Send)) => return detected(&failed),
        (Some(_), Some(Fail::Send)) => {
            return Err("the server's message came although it should have died".into())
        }
        (None, _) => {
            return Err(format!(
                "the server failed: {}",
                failed.borrow().as_deref().unwrap_or("?")
            ))
        }
        (Some(m), _) => m,
    };
    let r = msg_recv(&w, a.wake, msg)?;
    let shown = String::from_utf8_lossy(&r.data[..r.data.len().min(64)]).into_owned();
    println!(
        "received a {}-byte message: \"{shown}\"{}",
        r.data.len(),
        if r.data.len() > 64 { "..." } else { "" }
    );
    if r.data != message(r.data.len()) {
        return Err("the server's message is not the expected pattern".into());
    }
    if a.fail == Some(Fail::Keepalive) {
        die("client");
    }
    println!("\nresources: {}", ctx.resource_names().join(", "));
    println!("lanes:\n{}", ep.describe_lanes().trim_end());
    println!(
        "protocols by size (tag sends take the active messages' ranges):\n{}",
        ep.describe_protocols().trim_end()
    );
    round_trips(&w, a.wake, &ep)?;
    wait_req(&w, a.wake, "the last message", ep.tag_send(TAG_DONE, &[]))?;
    wait_req(&w, a.wake, "closing the endpoint", Ok(ep.close(CloseMode::Flush)))?;
    ch.barrier()?;
    println!("\nall round trips intact; endpoint closed");
    Ok(())
}

/// The protocol a tag send of `len` bytes takes (the active messages' thresholds).
fn protocol(ep: &Ep, len: usize) -> String {
    match ep.am_protocol(0, len, AmFlags::default(), false) {
        AmProto::Fragments(_) => "eager bcopy, in fragments".into(),
        p => p.to_string(),
    }
}

/// Tag round trips of each size: the receive is posted first (an expected message), the
/// server probes and echoes. Prints the median time and checks every echo.
fn round_trips(w: &Worker, mode: Wake, ep: &Ep) -> Res<()> {
    println!("\n{:>9}  {:<26} {:>12}", "bytes", "protocol", "round trip");
    for &len in SIZES {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let iters = match len {
            l if l >= 1 << 20 => 5,
            l if l >= 64 << 10 => 20,
            _ => 100,
        };
        let mut times = Vec::with_capacity(iters);
        let mut buf = vec![0u8; len];
        for _ in 0..iters {
            let t = Instant::now();
            let recv = w.tag_recv(TAG_ECHO, MASK, buf);
            wait_req(w, mode, "tag_send", ep.tag_send(TAG_ECHO, &data))?;
            let got = wait_req(w, mode, "the echo", recv)?;
            times.push(t.elapsed());
            if got.data != data {
                return Err(format!("the echo of {len} bytes came back different"));
            }
            buf = got.data;
        }
        times.sort();
        println!(
            "{len:>9}  {:<26} {:>9.1} us",
            protocol(ep, len),
            times[iters / 2].as_secs_f64() * 1e6
        );
    }
    Ok(())
}
