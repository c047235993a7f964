//! The server: listens on a socket address, serves one client at a time (a second concurrent
//! one is rejected), receives and checks its `-i` messages with the API of `-c`, then closes
//! the endpoint and serves the next client (or exits, with `--once`). A client that fails,
//! sends a wrong message or stays silent for `--idle` is dropped and the next one served.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;

use ucp::{CloseMode, ConnRequest, Ep, ListenerParams, Worker};

use crate::args::{Api, Args};
use crate::common::{self, pattern, shown, wait, wait_within, Failed, Res, AM_ID};

/// Active messages received (the data, and whether it came by rendezvous), in order.
type Inbox = Rc<RefCell<VecDeque<(Res<Vec<u8>>, bool)>>>;

pub fn run(a: &Args, ip: std::net::IpAddr) -> Res<()> {
    let ctx = common::context(a.api)?;
    let w = common::worker(&ctx)?;
    // A request waiting to be served; `busy` while a client is served.
    let next: Rc<RefCell<Option<ConnRequest>>> = Rc::default();
    let busy = Rc::new(Cell::new(false));
    let (n, b) = (next.clone(), busy.clone());
    let params = ListenerParams::new().on_conn_request(move |req| {
        if b.get() || n.borrow().is_some() {
            println!(
                "rejecting the client at {}: another client is being served",
                req.client_addr()
            );
            req.reject();
        } else {
            *n.borrow_mut() = Some(req);
        }
    });
    let listener = w
        .listen(SocketAddr::new(ip, a.port), params)
        .map_err(|e| format!("listen on {ip} port {}: {e}", a.port))?;
    let inbox = Inbox::default();
    if a.api == Api::Am {
        collect(&w, &inbox)?;
    }
    println!(
        "server listening on {} ({}, {} x {} bytes)",
        listener.local_addr(),
        a.api.name(),
        a.iters,
        a.size
    );
    loop {
        println!("waiting for a connection");
        while next.borrow().is_none() {
            w.progress();
        }
        let req = next.borrow_mut().take().expect("a request");
        let from = req.client_addr();
        let failed = Failed::default();
        let ep = match req.accept(common::ep_params(&failed)) {
            Ok(ep) => ep,
            Err(e) => {
                eprintln!("ucp_client_server: server: accepting the client at {from}: {e}");
                continue;
            }
        };
        busy.set(true);
        println!("client {from} connected");
        inbox.borrow_mut().clear();
        let r = serve(a, &w, &ep, &failed, &inbox);
        if r.is_err() {
            let _ = ep.close(CloseMode::Force);
        }
        busy.set(false);
        let r = r.map_err(|e| format!("the client at {from}: {e}"));
        if a.once {
            return r;
        }
        // One client's failure is that client's: the server goes on with the next.
        if let Err(e) = r {
            eprintln!("ucp_client_server: server: {e}: dropped");
            // Tag matching is the worker's, not the endpoint's: what the dropped client sent
            // and nobody received (some of it still arriving) must not be taken for the next
            // client's messages. Discarded until 200 ms pass without any.
            if a.api == Api::Tag {
                let mut quiet = std::time::Instant::now();
                while quiet.elapsed() < std::time::Duration::from_millis(200) {
                    w.progress();
                    if let Ok(Some(_)) = w.tag_probe(0, 0, true) {
                        quiet = std::time::Instant::now();
                    }
                }
            }
        }
    }
}

/// Receives and checks the client's messages; then waits for its close.
fn serve(a: &Args, w: &Worker, ep: &Ep, failed: &Failed, inbox: &Inbox) -> Res<()> {
    for i in 1..=a.iters {
        let (data, rndv) =
            recv(a, w, ep, failed, inbox).map_err(|e| format!("iteration {i} of {}: {e}", a.iters))?;
        if data.len() != a.size || data != pattern(a.size, i) {
            return Err(format!(
                "iteration {i}: got {} bytes \"{}\", expected {} bytes \"{}\" (do -i and -s match?)",
                data.len(),
                shown(&data),
                a.size,
                shown(&pattern(a.size, i))
            ));
        }
        if i == 1 || i == a.iters || i % 2000 == 0 {
            println!(
                "iteration {i}/{}: received {} bytes by {}{}: \"{}\" (intact)",
                a.iters,
                data.len(),
                a.api.name(),
                if rndv { " (rendezvous)" } else { "" },
                shown(&data)
            );
        }
    }
    println!("received {} messages of {} bytes: all intact", a.iters, a.size);
    // The reader closes: the client waits for it (a close from the client could drop stream
    // bytes that arrived here but were not read yet).
    match wait(w, failed, Ok(ep.close(CloseMode::Flush))) {
        Ok(()) => println!("closed the connection"),
        Err(e) => println!("closing the connection: {e} (everything had arrived)"),
    }
    Ok(())
}

/// One message, and whether it came by rendezvous (active messages only say).
fn recv(a: &Args, w: &Worker, ep: &Ep, failed: &Failed, inbox: &Inbox) -> Res<(Vec<u8>, bool)> {
    let idle = Some(a.idle);
    match a.api {
        Api::Stream => Ok((
            wait_within(w, failed, idle, ep.stream_recv(vec![0; a.size], true))?,
            false,
        )),
        // Mask 0: any tag (as UCX's server); a longer message fails with MessageTruncated.
        Api::Tag => Ok((
            wait_within(w, failed, idle, w.tag_recv(0, 0, vec![0; a.size]))?.data,
            false,
        )),
        Api::Am => {
            common::progress_within(w, failed, idle, || !inbox.borrow().is_empty())?;
            let (data, rndv) = inbox.borrow_mut().pop_front().expect("not empty");
            Ok((data?, rndv))
        }
    }
}

/// The AM handler: eager data is copied out; a rendezvous message comes as a descriptor
/// (`AmHandlerFlags::RNDV_DESC`, so the server can say it was one) and its data is fetched
/// (`Worker::am_recv_data`). The client sends one message at a time and a rendezvous send
/// completes only once fetched, so messages complete in the order they were sent.
fn collect(w: &Worker, inbox: &Inbox) -> Res<()> {
    let i = inbox.clone();
    let weak = w.downgrade();
    w.set_am_handler_with(AM_ID, ucp::AmHandlerFlags::RNDV_DESC, move |m| {
        let Some(desc) = m.take_data_desc() else {
            i.borrow_mut().push_back((Ok(m.data().to_vec()), false));
            return;
        };
        let Some(w) = weak.upgrade() else { return };
        let i = i.clone();
        let fail = |e: ucp::Error| format!("fetching a rendezvous message: {e}");
        match w.am_recv_data(desc, Vec::new()) {
            Ok(fetch) => fetch.on_complete(move |r| i.borrow_mut().push_back((r.map_err(fail), true))),
            Err(e) => i.borrow_mut().push_back((Err(fail(e)), true)),
        }
    })
    .map_err(|e| format!("the AM handler: {e}"))?;
    Ok(())
}
