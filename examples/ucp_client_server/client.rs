//! The client: connects to the server's socket address and sends `-i` messages of `-s` bytes
//! with the API of `-c`, one at a time (each completes before the next goes), flushes its
//! endpoint and waits for the server to close it.

use std::net::{SocketAddr, ToSocketAddrs};

use ucp::{AmFlags, CloseMode, Ep};

use crate::args::{Api, Args};
use crate::common::{self, pattern, shown, wait, Failed, Res, AM_ID, TAG};

pub fn run(a: &Args, host: &str) -> Res<()> {
    let addr: SocketAddr = (host, a.port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let ctx = common::context(a.api)?;
    let w = common::worker(&ctx)?;
    let failed = Failed::default();
    let ep = w
        .connect_sockaddr(addr, common::ep_params(&failed))
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    println!(
        "connecting to {addr} ({}, {} x {} bytes)",
        a.api.name(),
        a.iters,
        a.size
    );
    for i in 1..=a.iters {
        let data = pattern(a.size, i);
        let sent = match a.api {
            Api::Stream => ep.stream_send(&data),
            Api::Tag => ep.tag_send(TAG, &data),
            Api::Am => ep.am_send(AM_ID, &[], &data, AmFlags::default()),
        };
        wait(&w, &failed, sent).map_err(|e| format!("iteration {i} of {}: {e}", a.iters))?;
        if i == 1 || i == a.iters || i % 2000 == 0 {
            println!(
                "iteration {i}/{}: sent {} bytes by {} ({}): \"{}\"",
                a.iters,
                data.len(),
                a.api.name(),
                protocol(a, &ep),
                shown(&data)
            );
        }
    }
    // Everything is at the server once the flush completed; the server, having read it all,
    // closes the connection.
    wait(&w, &failed, ep.flush()).map_err(|e| format!("flushing the endpoint: {e}"))?;
    println!("sent {} messages of {} bytes; all at the server", a.iters, a.size);
    while failed.borrow().is_none() {
        w.progress();
    }
    println!(
        "the server closed the connection ({})",
        failed.borrow().as_deref().unwrap_or("?")
    );
    let _ = ep.close(CloseMode::Force);
    Ok(())
}

/// The protocol the messages take (streams go eager, in segments; tag sends take the active
/// messages' ranges).
fn protocol(a: &Args, ep: &Ep) -> String {
    match a.api {
        Api::Stream => "eager".into(),
        Api::Tag | Api::Am => ep.am_protocol(0, a.size, AmFlags::default(), false).to_string(),
    }
}
