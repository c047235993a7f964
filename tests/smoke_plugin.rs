//! The self transport loaded as a plugin (.so) instead of linked in.
use std::cell::Cell;
use std::rc::Rc;

use uct::{AmCbFlags, AsyncMode, Context, Iface, IfaceParams, ModuleStatus, ThreadMode, Worker};

#[test]
fn self_plugin_loads_and_delivers() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug");
    std::env::set_var("RUCX_MODULE_DIR", &dir);
    let ctx = Context::builder().build();
    let m = ctx.modules().iter().find(|m| m.name == "self").expect("self plugin found");
    assert_eq!(m.status, ModuleStatus::Loaded, "{:?}", ctx.modules());
    let (md, _) = ctx.find_resource("self", "memory0").unwrap();
    let worker = Worker::new(AsyncMode::Poll, ThreadMode::Single).unwrap();
    let iface = Iface::open(&md, &worker, IfaceParams::new("self", "memory0")).unwrap();
    let n = Rc::new(Cell::new(0));
    let n2 = n.clone();
    iface.set_am_handler(0, AmCbFlags::SYNC, move |m| n2.set(n2.get() + m.data().len())).unwrap();
    let ep = iface.ep_create_connected(&iface.device_address().unwrap(), &iface.address().unwrap()).unwrap();
    ep.am_short(0, 1, &[1, 2, 3]).unwrap();
    assert_eq!(n.get(), 11);
    assert_eq!(ep.am_short(40, 1, &[]), Err(uct::Status::InvalidParam));
}
