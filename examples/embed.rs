//! The README's embedding example: an active message over TCP on the loopback device.
use std::{cell::RefCell, rc::Rc};
use uct::{AmCbFlags, Iface, IfaceParams, Worker};

fn main() -> uct::Result<()> {
    let ctx = rucx::context_builder().config("TCP_NODELAY", "y").build();
    let (md, _) = ctx.find_resource("tcp", "lo")?;
    let worker = Worker::new()?;
    let server = Iface::open(&md, &worker, IfaceParams::new("tcp", "lo"))?;
    let client = Iface::open(&md, &worker, IfaceParams::new("tcp", "lo"))?;
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    server.set_am_handler(1, AmCbFlags::SYNC, move |m| {
        g.borrow_mut().extend_from_slice(&m.data()[8..])
    })?;
    let ep = client.ep_create_connected(&server.device_address()?, &server.address()?)?;
    while let Err(e) = ep.am_short(1, 0, b"hello") {
        if e != uct::Status::NoResource {
            return Err(e); // the error says what went wrong and how to fix it
        }
        worker.progress(); // connecting
    }
    while got.borrow().is_empty() {
        worker.progress();
    }
    println!("{}", String::from_utf8_lossy(&got.borrow()));
    Ok(())
}
