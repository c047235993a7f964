//! One side of a test (UCX gtest's `entity`): a memory domain, a worker and an interface whose
//! error handler records what it reports.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Mutex, MutexGuard};

use uct::{AsyncMode, EpKey, Iface, IfaceAttr, IfaceParams, Md, Status, Worker};

use crate::am::{self, Recorder};

/// What an interface's error handler received, in order.
pub type ErrorLog = Rc<RefCell<Vec<(EpKey, Status)>>>;

/// Memory domain, worker and interface of one side.
pub struct Entity {
    pub md: Md,
    pub worker: Worker,
    pub iface: Iface,
    /// What the interface's error handler received.
    pub errors: ErrorLog,
}

/// A new worker in poll mode: everything happens in its `progress`.
pub fn worker() -> Worker {
    Worker::with_async_mode(AsyncMode::Poll).expect("Worker::with_async_mode(Poll)")
}

/// Interfaces the kit opens open one at a time in a process, so that a test can tell a new
/// interface's sockets from the others' ([`crate::tcp::Node`] finds its listening port so).
static OPENING: Mutex<()> = Mutex::new(());

/// Proof that this thread opens interfaces alone (see [`opening`]).
pub struct Opening {
    _alone: MutexGuard<'static, ()>,
}

/// Waits until no other thread of the process opens an interface through the kit, and keeps
/// it so until the result is dropped. Do not call [`Entity::open`] meanwhile (it would wait
/// for itself): use [`Entity::open_while`].
pub fn opening() -> Opening {
    Opening {
        _alone: OPENING.lock().unwrap_or_else(|e| e.into_inner()),
    }
}

impl Entity {
    /// Opens `params` on `md` and `worker`, with an error handler that records into
    /// [`Entity::errors`] (it replaces one the parameters had).
    pub fn open(md: &Md, worker: &Worker, params: IfaceParams) -> uct::Result<Entity> {
        Self::open_while(&opening(), md, worker, params)
    }

    /// [`Entity::open`] for a caller that holds [`opening`].
    pub fn open_while(_: &Opening, md: &Md, worker: &Worker, params: IfaceParams) -> uct::Result<Entity> {
        let errors = ErrorLog::default();
        let log = errors.clone();
        let params = params.err_handler(move |k, s| log.borrow_mut().push((k, s)));
        Ok(Entity {
            md: md.clone(),
            worker: worker.clone(),
            iface: Iface::open(md, worker, params)?,
            errors,
        })
    }

    pub fn attr(&self) -> &IfaceAttr {
        self.iface.attr()
    }

    /// The statuses reported for endpoint `key`.
    pub fn errors_for(&self, key: EpKey) -> Vec<Status> {
        self.errors
            .borrow()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, s)| *s)
            .collect()
    }

    /// Records every message of AM `id` arriving here (see [`am::record`]).
    pub fn record_am(&self, id: u8) -> Recorder {
        am::record(&self.iface, id)
    }
}
