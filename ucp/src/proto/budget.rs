//! Byte budgets for what peers make a worker hold (messages under reassembly, unexpected tag
//! messages): charged per peer worker and for the whole worker, each with its `RUCX_*` limit.
//! A charge that would pass either limit is refused with `ExceedsLimit`, the error naming the
//! variable; the caller then fails the peer or drops what it sent.

use std::cell::{Cell, RefCell};

use ucs::hash::FastMap;
use ucs::{Error, Status};

/// Bytes an entry (a message under reassembly, an unexpected message) costs beyond its data,
/// so that empty messages are bounded too.
pub(crate) const ENTRY_COST: usize = 256;

/// The peer key of what came from a sender the message does not name (a plain eager tag
/// message): only the per-worker limit applies to it.
pub(crate) const ANONYMOUS: u64 = 0;

/// What a budget bounds and its two limits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BudgetSpec {
    /// What is held, for messages ("messages under reassembly").
    pub what: &'static str,
    /// The per-peer limit and its variable.
    pub peer: (&'static str, usize),
    /// The per-worker limit and its variable.
    pub worker: (&'static str, usize),
}

/// Bytes held per peer and in all, within a [`BudgetSpec`].
pub(crate) struct Budget {
    spec: BudgetSpec,
    held: Cell<usize>,
    peers: RefCell<FastMap<u64, usize>>,
}

impl Budget {
    pub fn new(spec: BudgetSpec) -> Budget {
        Budget {
            spec,
            held: Cell::new(0),
            peers: RefCell::new(FastMap::default()),
        }
    }

    /// The per-peer limit in bytes.
    pub fn peer_limit(&self) -> usize {
        self.spec.peer.1
    }

    /// `Ok` when `peer` holding `mine` bytes and the worker `all` are within the limits.
    fn check(&self, peer: u64, mine: usize, all: usize) -> Result<(), Error> {
        let (var, limit, would) = if peer != ANONYMOUS && mine > self.spec.peer.1 {
            (self.spec.peer.0, self.spec.peer.1, mine)
        } else if all > self.spec.worker.1 {
            (self.spec.worker.0, self.spec.worker.1, all)
        } else {
            return Ok(());
        };
        Err(Error::new(
            Status::ExceedsLimit,
            format!(
                "{} from {} would hold {would} bytes, over {var}={limit} (raise {var} if the \
                 messages are honest)",
                self.spec.what,
                if peer == ANONYMOUS {
                    "senders the messages do not name".to_string()
                } else {
                    format!("worker {peer:#x}")
                }
            ),
        ))
    }

    /// Whether `peer` may take `n` more bytes (nothing charged).
    pub fn allows(&self, peer: u64, n: usize) -> Result<(), Error> {
        self.check(peer, self.peer_held(peer) + n, self.held() + n)
    }

    /// Bytes charged in all.
    pub fn held(&self) -> usize {
        self.held.get()
    }

    /// Bytes charged to `peer`.
    pub fn peer_held(&self, peer: u64) -> usize {
        self.peers.borrow().get(&peer).copied().unwrap_or(0)
    }

    /// Moves `peer`'s charge from `old` to `new` bytes, if both limits allow the growth
    /// (shrinking always succeeds).
    pub fn recharge(&self, peer: u64, old: usize, new: usize) -> Result<(), Error> {
        if peer == ANONYMOUS {
            // No per-peer account (and no map update on the unexpected eager path).
            let all_now = self.held.get() - old + new;
            if new > old {
                self.check(peer, 0, all_now)?;
            }
            self.held.set(all_now);
            return Ok(());
        }
        let mut peers = self.peers.borrow_mut();
        let mine = peers.get(&peer).copied().unwrap_or(0);
        let (mine_now, all_now) = (mine - old + new, self.held.get() - old + new);
        if new > old {
            self.check(peer, mine_now, all_now)?;
        }
        if mine_now == 0 {
            peers.remove(&peer);
        } else {
            peers.insert(peer, mine_now);
        }
        self.held.set(all_now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_peer_and_per_worker_limits_name_their_variable() {
        let b = Budget::new(BudgetSpec {
            what: "things",
            peer: ("RUCX_P", 100),
            worker: ("RUCX_W", 150),
        });
        b.recharge(1, 0, 100).unwrap();
        let e = b.recharge(1, 100, 101).unwrap_err();
        assert_eq!(e.status(), Status::ExceedsLimit);
        assert!(e.to_string().contains("RUCX_P=100"), "{e}");
        assert!(b.allows(2, 50).is_ok());
        let e = b.allows(2, 51).unwrap_err();
        assert!(e.to_string().contains("RUCX_W=150"), "{e}");
        // a refused growth changes nothing; shrinking always works
        assert_eq!((b.held(), b.peer_held(1)), (100, 100));
        b.recharge(1, 100, 0).unwrap();
        assert_eq!((b.held(), b.peer_held(1)), (0, 0));
        // unnamed senders share only the worker limit
        b.recharge(ANONYMOUS, 0, 150).unwrap();
        let e = b.allows(ANONYMOUS, 1).unwrap_err();
        assert!(e.to_string().contains("RUCX_W=150"), "{e}");
    }
}
