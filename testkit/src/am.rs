//! Recording active messages.

use std::cell::RefCell;
use std::rc::Rc;

use uct::{AmCbFlags, Iface, IfaceAttr, IfaceFlags};

/// Received messages (header included), in arrival order.
pub type Recorder = Rc<RefCell<Vec<Vec<u8>>>>;

/// Handler flags an interface with `attr` accepts: sync when it has `CB_SYNC`.
pub fn cb_flags(attr: &IfaceAttr) -> AmCbFlags {
    if attr.flags.contains(IfaceFlags::CB_SYNC) {
        AmCbFlags::SYNC
    } else {
        AmCbFlags::ASYNC
    }
}

/// Installs a handler for AM `id` on `iface` that records every message.
pub fn record(iface: &Iface, id: u8) -> Recorder {
    let rec = Recorder::default();
    let r = rec.clone();
    iface
        .set_am_handler(id, cb_flags(iface.attr()), move |m| {
            r.borrow_mut().push(m.data().to_vec())
        })
        .unwrap_or_else(|e| {
            panic!(
                "[{}/{}] set_am_handler({id}): {e}",
                iface.tl_name(),
                iface.dev_name()
            )
        });
    rec
}

/// The 8-byte little-endian headers of `rec`'s messages (their sequence numbers, as most tests
/// send them).
pub fn headers(rec: &Recorder) -> Vec<u64> {
    rec.borrow()
        .iter()
        .map(|m| u64::from_le_bytes(m[..8].try_into().expect("an 8-byte header")))
        .collect()
}
