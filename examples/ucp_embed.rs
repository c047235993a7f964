//! The README's embedding example: two UCP workers, an endpoint between them chosen by UCP,
//! and one active message with a reply.
use std::{cell::RefCell, rc::Rc};
use ucp::{AmFlags, Context, Worker};

fn main() -> ucp::Result<()> {
    let ctx = Context::builder(rucx::context())
        .config("TLS", "tcp,self")
        .build()?;
    let (server, client) = (Worker::new(&ctx)?, Worker::new(&ctx)?);
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    server.set_am_handler(1, move |m| {
        *g.borrow_mut() = Some(String::from_utf8_lossy(m.data()).into_owned());
        let _ = m
            .reply_ep()
            .unwrap()
            .am_send(2, &[], b"hello back", AmFlags::default());
    })?;
    let replied = Rc::new(RefCell::new(false));
    let r = replied.clone();
    client.set_am_handler(2, move |_| *r.borrow_mut() = true)?;
    // The address usually travels out of band (a socket, a file, MPI).
    let ep = client.connect(server.address())?;
    let _sent = ep.am_send(1, &[], b"hello", AmFlags::REPLY)?; // Done, or Pending: completes later
                                                               // Both workers live in this thread: progress both (each would progress its own).
    while !*replied.borrow() {
        server.progress();
        client.progress();
    }
    println!(
        "server got {:?}; lanes:\n{}",
        got.borrow().as_deref().unwrap_or(""),
        ep.describe_lanes()
    );
    Ok(())
}
