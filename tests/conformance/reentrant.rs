//! A handler that sends to its own interface: over self the message is delivered inside the
//! send, that is inside the running handler. The handler is never re-entered (each message
//! waits until the running call returned) and sees every message, in order; over other
//! transports the same chain goes through progress.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use rucx_testkit::pair::connect_to_iface;
use rucx_testkit::Setup;
use uct::{IfaceFlags, Status};

const ID: u8 = 12;
const CHAIN: u64 = 50;

fn am_handler_sends_to_itself(s: &Setup) {
    let p = s.pair();
    if !p.supports(IfaceFlags::CONNECT_TO_IFACE, "am_handler_sends_to_itself")
        || !p.supports(IfaceFlags::AM_SHORT, "am_handler_sends_to_itself")
    {
        return;
    }
    let to_self = Rc::new(connect_to_iface(&p.rx, &p.rx));
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (depth, deepest) = (Rc::new(Cell::new(0u32)), Rc::new(Cell::new(0u32)));
    // Sends that met a full queue; the test's loop retries them.
    let later = Rc::new(RefCell::new(Vec::new()));
    let (s2, d2, x2, l2, ep) = (
        seen.clone(),
        depth.clone(),
        deepest.clone(),
        later.clone(),
        to_self.clone(),
    );
    p.rx.iface
        .set_am_handler(ID, p.am_flags(), move |m| {
            d2.set(d2.get() + 1);
            x2.set(x2.get().max(d2.get()));
            let h = m.header();
            s2.borrow_mut().push(h);
            if h < CHAIN {
                match ep.am_short(ID, h + 1, b"next") {
                    Ok(()) => {}
                    Err(e) if e == Status::NoResource => l2.borrow_mut().push(h + 1),
                    Err(e) => panic!("am_short from the handler: {e}"),
                }
            }
            d2.set(d2.get() - 1);
        })
        .unwrap();
    p.retry("am_short", || to_self.am_short(ID, 0, b"first")).unwrap();
    p.wait_for("the whole chain", || {
        let retry: Vec<u64> = later.borrow_mut().drain(..).collect();
        for h in retry {
            if to_self.am_short(ID, h, b"next").is_err() {
                later.borrow_mut().push(h);
            }
        }
        seen.borrow().len() as u64 > CHAIN
    });
    let want: Vec<u64> = (0..=CHAIN).collect();
    assert_eq!(*seen.borrow(), want, "[{}] every message, in order", p.name());
    assert_eq!(deepest.get(), 1, "[{}] the handler was re-entered", p.name());
}

conformance_test!(am_handler_sends_to_itself);
