//! Minimal end-to-end check of the self transport through the full API (the conformance suite
//! covers the rest).
use std::cell::RefCell;
use std::rc::Rc;

use uct::{AmCbFlags, AsyncMode, Context, Iface, IfaceParams, ProgressFlags, ThreadMode, Worker};

#[test]
fn am_short_round_trip_over_self() {
    let ctx = Context::builder().builtin(uct_self::module()).plugins(false).build();
    let (md, _) = ctx.find_resource("self", "memory0").unwrap();
    let worker = Worker::new(AsyncMode::Poll, ThreadMode::Single).unwrap();
    let iface = Iface::open(&md, &worker, IfaceParams::new("self", "memory0")).unwrap();
    iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    iface.set_am_handler(3, AmCbFlags::SYNC, move |m| g.borrow_mut().push((m.header(), m.data()[8..].to_vec()))).unwrap();
    let ep = iface.ep_create_connected(&iface.device_address().unwrap(), &iface.address().unwrap()).unwrap();
    ep.am_short(3, 0xabcdef, b"hello").unwrap();
    assert_eq!(got.borrow().as_slice(), &[(0xabcdef, b"hello".to_vec())]);
}
