//! The RPC server: an AM handler that runs the procedure and replies on the request's reply
//! endpoint; arguments that came by rendezvous are fetched first (`Worker::am_recv_data`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ucp::{AmFlags, AmMsg, Ep, WeakWorker, Worker};

use crate::proto::{self, OK, UNKNOWN_PROCEDURE};
use crate::wake::{progress_until, progress_until_forever, Wake};

/// Serves requests until a `SHUTDOWN` call; returns how many it served.
pub fn serve(w: &Worker, wake: Wake) -> Result<u64, String> {
    let stop = Rc::new(RefCell::new(None::<Ep>));
    let served = Rc::new(Cell::new(0u64));
    let (st, sv) = (stop.clone(), served.clone());
    let weak = w.downgrade();
    // Descriptors: rendezvous arguments are fetched into a buffer the procedure then owns.
    w.set_am_handler_with(proto::REQUEST, ucp::AmHandlerFlags::RNDV_DESC, move |m| {
        on_request(&weak, m, &st, &sv)
    })
    .map_err(|e| format!("the AM handler: {e}"))?;
    progress_until_forever(w, wake, || stop.borrow().is_some())?;
    w.clear_am_handler(proto::REQUEST);
    // The last reply must reach the client before this worker goes.
    let ep = stop.borrow_mut().take().expect("stopped by a SHUTDOWN call");
    if let Ok(ucp::Issued::Pending(mut r)) = ep.flush() {
        progress_until(w, wake, "the last reply", || r.is_done())?;
        let _ = r.take();
    }
    Ok(served.get())
}

fn on_request(w: &WeakWorker, m: &mut AmMsg<'_>, stop: &Rc<RefCell<Option<Ep>>>, served: &Rc<Cell<u64>>) {
    let Some(ep) = m.reply_ep().cloned() else {
        eprintln!("rpc server: a request without a reply endpoint (dropped)");
        return;
    };
    let Some((id, procedure)) = proto::parse_header(m.header()) else {
        eprintln!(
            "rpc server: a request with a {}-byte header (dropped)",
            m.header().len()
        );
        return;
    };
    served.set(served.get() + 1);
    let stop = stop.clone();
    match (m.take_data_desc(), w.upgrade()) {
        // Rendezvous: the arguments are still at the client; fetch them, then run.
        (Some(desc), Some(w)) => match w.am_recv_data(desc, Vec::new()) {
            Ok(fetch) => fetch.on_complete(move |args| match args {
                Ok(args) => run(&ep, id, procedure, args, &stop),
                Err(e) => eprintln!("rpc server: fetching the arguments of call {id}: {e}"),
            }),
            Err(e) => eprintln!("rpc server: fetching the arguments of call {id}: {e}"),
        },
        _ => run(&ep, id, procedure, m.data().to_vec(), &stop),
    }
}

/// Runs the procedure and sends the reply (owned: zero-copy or rendezvous where it pays); after
/// a `SHUTDOWN` reply, tells the loop to stop.
fn run(ep: &Ep, id: u64, procedure: u8, args: Vec<u8>, stop: &RefCell<Option<Ep>>) {
    let (status, result) = match proto::call(procedure, args) {
        Some(r) => (OK, r),
        None => (UNKNOWN_PROCEDURE, Vec::new()),
    };
    let header = proto::request_header(id, status);
    // A failed reply shows up at the client as a missing one; the request completes by itself.
    if let Err(e) = ep.am_send_owned(proto::REPLY, &header, result, AmFlags::default()) {
        eprintln!("rpc server: replying to call {id}: {e}");
    }
    if procedure == proto::SHUTDOWN {
        *stop.borrow_mut() = Some(ep.clone());
    }
}
