//! Messages arriving in fragments, for active messages and tag matching alike: which messages
//! are being reassembled, whether a fragment continues one, and what they hold.
//!
//! A message is keyed by (sender worker, message id). Fragments must come in order (each
//! continues where the last ended, none runs past the announced total), as UCP's lanes deliver
//! them. What a peer can make a worker hold this way is bounded three ways:
//! - **budgets**: the bytes held in reassembly buffers (plus [`ENTRY_COST`] per message) are
//!   charged to the sending peer and to the worker (`RUCX_REASM_PEER_LIMIT`,
//!   `RUCX_REASM_WORKER_LIMIT`); a first fragment or growth past either is refused, and the
//!   caller fails that peer's endpoints. Memory grows with the data that arrived, never with
//!   a total the peer claims.
//! - **stalls**: a message that receives no fragment for `RUCX_REASM_TIMEOUT` is dropped
//!   ([`Reassembler::tick`], driven by a timer: no clock read per fragment).
//! - **cleanup**: a failed peer's messages go with it ([`Reassembler::remove_peer`]).
//!
//! The targets (`T`) are the callers' own: am.rs keeps its reassembly buffer, tag matching
//! its posted receive or unexpected message; one [`Budget`] is shared by both.

use std::cell::RefCell;

use ucs::hash::FastMap;
use ucs::{Error, Status};

pub(crate) use super::budget::{Budget, BudgetSpec, ENTRY_COST};
use super::stall::StallTimer;
pub(crate) use crate::config::ReasmLimits;

/// (sender worker id, message id).
pub(crate) type Key = (u64, u64);

struct Entry<T> {
    total: usize,
    received: usize,
    /// Bytes charged to the budget (buffer held plus [`ENTRY_COST`]).
    charged: usize,
    /// The reassembler's tick when a fragment last arrived.
    tick: u32,
    target: T,
}

/// One kind of message under reassembly (its target `T`).
pub(crate) struct Reassembler<T> {
    map: FastMap<Key, Entry<T>>,
    tick: u32,
}

impl<T> Default for Reassembler<T> {
    fn default() -> Self {
        Reassembler {
            map: FastMap::default(),
            tick: 0,
        }
    }
}

/// Why a fragment was refused; `target` is the message it belonged to, now dropped from
/// reassembly (the caller ends what waited for it).
pub(crate) struct Refused<T> {
    pub error: Error,
    pub target: Option<T>,
}

impl<T> Reassembler<T> {
    /// Messages under reassembly.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether a first fragment for `key` whose target holds `held` bytes may start (the
    /// caller checks before building the target, so a refused one allocates nothing).
    pub fn admit(&self, budget: &Budget, key: Key, held: usize) -> Result<(), Error> {
        if self.map.contains_key(&key) {
            return Err(Error::new(
                Status::InvalidParam,
                format!("message id {} from worker {:#x} restarted", key.1, key.0),
            ));
        }
        budget.allows(key.0, held + ENTRY_COST)
    }

    /// Starts `key` ([`Reassembler::admit`] said yes): `total` bytes, `received` of them in the
    /// first fragment, the target holding `held` bytes.
    pub fn insert(
        &mut self,
        budget: &Budget,
        key: Key,
        total: usize,
        received: usize,
        held: usize,
        target: T,
    ) {
        let charged = held + ENTRY_COST;
        if budget.recharge(key.0, 0, charged).is_err() {
            // admit checked it; a caller that skipped admit still keeps within the budget
            return;
        }
        let tick = self.tick;
        self.map.insert(
            key,
            Entry {
                total,
                received,
                charged,
                tick,
                target,
            },
        );
    }

    /// A fragment of `len` bytes at `offset` for `key`: the target to copy it into, the
    /// fragment counted as received. Refused (the message dropped) when no message `key` is
    /// under reassembly, or the fragment is not the next one or runs past the total.
    pub fn fragment(
        &mut self,
        budget: &Budget,
        key: Key,
        offset: u64,
        len: usize,
    ) -> Result<&mut T, Refused<T>> {
        let Some(e) = self.map.get_mut(&key) else {
            return Err(Refused {
                error: Error::new(
                    Status::InvalidParam,
                    format!(
                        "no message {} from worker {:#x} is being reassembled",
                        key.1, key.0
                    ),
                ),
                target: None,
            });
        };
        if offset != e.received as u64 || len > e.total - e.received {
            let error = Error::new(
                Status::InvalidParam,
                format!(
                    "fragment at {offset} with {len} bytes, expected offset {} of {}",
                    e.received, e.total
                ),
            );
            let target = self.remove(budget, key);
            return Err(Refused { error, target });
        }
        e.received += len;
        e.tick = self.tick;
        Ok(&mut self.map.get_mut(&key).expect("looked up above").target)
    }

    /// After a fragment was copied: the target now holds `held` bytes. `Ok(Some(target))`
    /// when the message is complete (it leaves reassembly), `Ok(None)` while fragments are
    /// due; refused (and dropped) when the growth is over budget.
    pub fn settle(&mut self, budget: &Budget, key: Key, held: usize) -> Result<Option<T>, Refused<T>> {
        let Some(e) = self.map.get_mut(&key) else {
            return Ok(None);
        };
        let charged = held + ENTRY_COST;
        if let Err(error) = budget.recharge(key.0, e.charged, charged) {
            let target = self.remove(budget, key);
            return Err(Refused { error, target });
        }
        e.charged = charged;
        if e.received == e.total {
            return Ok(self.remove(budget, key));
        }
        Ok(None)
    }

    /// Drops `key` from reassembly: its target, if it was there.
    pub fn remove(&mut self, budget: &Budget, key: Key) -> Option<T> {
        let e = self.map.remove(&key)?;
        let _ = budget.recharge(key.0, e.charged, 0);
        Some(e.target)
    }

    /// Drops every message from `peer` (its endpoints failed or closed).
    pub fn remove_peer(&mut self, budget: &Budget, peer: u64) -> Vec<T> {
        let keys: Vec<Key> = self.map.keys().filter(|k| k.0 == peer).copied().collect();
        keys.into_iter().filter_map(|k| self.remove(budget, k)).collect()
    }

    /// The stall timer's tick (every half `RUCX_REASM_TIMEOUT`): drops and returns the
    /// messages that received nothing during the last two full ticks, so a stall is caught
    /// after between one and one and a half timeouts.
    pub fn tick(&mut self, budget: &Budget) -> Vec<(Key, T)> {
        self.tick = self.tick.wrapping_add(1);
        let now = self.tick;
        let stale: Vec<Key> = self
            .map
            .iter()
            .filter(|(_, e)| StallTimer::stalled(e.tick, now))
            .map(|(k, _)| *k)
            .collect();
        stale
            .into_iter()
            .filter_map(|k| self.remove(budget, k).map(|t| (k, t)))
            .collect()
    }

    /// The error a message dropped by [`Reassembler::tick`] completes with.
    pub fn stalled(timer: &StallTimer, key: Key) -> Error {
        Error::new(
            Status::TimedOut,
            format!(
                "message {} from worker {:#x} received no fragment for {} ms \
                 (RUCX_REASM_TIMEOUT); dropped",
                key.1,
                key.0,
                timer.millis()
            ),
        )
    }
}

/// A worker's reassembly state shared by its protocols: the budget and the stall timer, which
/// runs on the worker's async context while messages are under reassembly (progress looks at
/// one flag).
pub(crate) struct Reasm {
    pub budget: Budget,
    /// Peers whose endpoints failed for exceeding a budget: their fragments start nothing
    /// until a new endpoint toward them is made.
    pub shunned: RefCell<FastMap<u64, ()>>,
    pub timer: StallTimer,
}

impl Reasm {
    pub fn new(limits: ReasmLimits) -> Reasm {
        Reasm {
            budget: Budget::new(BudgetSpec {
                what: "messages under reassembly",
                peer: ("RUCX_REASM_PEER_LIMIT", limits.peer_bytes),
                worker: ("RUCX_REASM_WORKER_LIMIT", limits.worker_bytes),
            }),
            shunned: RefCell::new(FastMap::default()),
            timer: StallTimer::new(limits.timeout, "reassembly stall"),
        }
    }
}

/// What a first fragment of a `total`-byte message carrying `carried` reserves: what
/// arrived, or up to 1 MiB (a sixteenth of the peer's budget if less) so that later
/// fragments rarely reallocate; never the claimed total alone.
pub(crate) fn first_room(budget: &Budget, total: usize, carried: usize) -> usize {
    total.min(carried.max((1 << 20).min(budget.peer_limit() / 16)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(peer: usize, worker: usize) -> Budget {
        Budget::new(BudgetSpec {
            what: "test messages",
            peer: ("RUCX_REASM_PEER_LIMIT", peer),
            worker: ("RUCX_REASM_WORKER_LIMIT", worker),
        })
    }

    /// A fake target: the bytes copied so far.
    fn start(
        r: &mut Reassembler<Vec<u8>>,
        b: &Budget,
        key: Key,
        total: usize,
        first: &[u8],
    ) -> Result<(), Error> {
        r.admit(b, key, first.len())?;
        r.insert(b, key, total, first.len(), first.len(), first.to_vec());
        Ok(())
    }

    fn frag(
        r: &mut Reassembler<Vec<u8>>,
        b: &Budget,
        key: Key,
        at: u64,
        d: &[u8],
    ) -> Result<Option<Vec<u8>>, Error> {
        let t = r.fragment(b, key, at, d.len()).map_err(|x| x.error)?;
        t.extend_from_slice(d);
        let held = t.len();
        r.settle(b, key, held).map_err(|x| x.error)
    }

    #[test]
    fn fragments_at_every_boundary() {
        let b = limits(1 << 20, 1 << 20);
        let msg: Vec<u8> = (0..100u8).collect();
        for first in 0..msg.len() {
            for second in first..msg.len() {
                let mut r = Reassembler::default();
                let key = (7, first as u64);
                start(&mut r, &b, key, msg.len(), &msg[..first]).unwrap();
                let got = frag(&mut r, &b, key, first as u64, &msg[first..second]).unwrap();
                if second == msg.len() {
                    assert_eq!(got.as_deref(), Some(&msg[..]));
                } else {
                    assert_eq!(got, None);
                    let done = frag(&mut r, &b, key, second as u64, &msg[second..]).unwrap();
                    assert_eq!(done.as_deref(), Some(&msg[..]));
                }
                assert!(r.is_empty());
                assert_eq!(b.held(), 0);
            }
        }
    }

    #[test]
    fn out_of_order_and_overlong_fragments_drop_the_message() {
        let b = limits(1 << 20, 1 << 20);
        let mut r = Reassembler::default();
        start(&mut r, &b, (1, 1), 10, b"abc").unwrap();
        let e = r.fragment(&b, (1, 1), 4, 2).err().unwrap();
        assert_eq!(e.error.status(), Status::InvalidParam);
        assert_eq!(e.target.as_deref(), Some(&b"abc"[..]));
        assert!(r.is_empty());
        assert_eq!(b.held(), 0);

        start(&mut r, &b, (1, 2), 10, b"abc").unwrap();
        assert!(r.fragment(&b, (1, 2), 3, 8).is_err(), "past the total");
        assert!(
            r.fragment(&b, (1, 2), 3, 1).is_err(),
            "the message went with the bad fragment"
        );
        assert_eq!(b.held(), 0);
        // a restart of a message still arriving is refused, the first one kept
        start(&mut r, &b, (1, 3), 10, b"abc").unwrap();
        assert!(start(&mut r, &b, (1, 3), 10, b"xyz").is_err());
        assert_eq!(
            frag(&mut r, &b, (1, 3), 3, b"defghij").unwrap().as_deref(),
            Some(&b"abcdefghij"[..])
        );
    }

    #[test]
    fn budgets_per_peer_and_per_worker() {
        let b = limits(2 * ENTRY_COST + 100, 3 * ENTRY_COST + 150);
        let mut r = Reassembler::default();
        start(&mut r, &b, (1, 1), 1000, &[0; 50]).unwrap();
        start(&mut r, &b, (1, 2), 1000, &[0; 50]).unwrap();
        assert_eq!(b.peer_held(1), 2 * ENTRY_COST + 100);
        let e = start(&mut r, &b, (1, 3), 1000, &[]).unwrap_err();
        assert_eq!(e.status(), Status::ExceedsLimit);
        assert!(e.to_string().contains("RUCX_REASM_PEER_LIMIT"), "{e}");
        // another peer fits within the worker's budget, then not
        start(&mut r, &b, (2, 1), 1000, &[0; 50]).unwrap();
        let e = start(&mut r, &b, (3, 1), 1000, &[]).unwrap_err();
        assert!(e.to_string().contains("RUCX_REASM_WORKER_LIMIT"), "{e}");
        // growth past the peer's budget drops the message it grew
        let e = frag(&mut r, &b, (2, 1), 50, &[0; 200]).unwrap_err();
        assert_eq!(e.status(), Status::ExceedsLimit);
        assert_eq!(r.len(), 2);
        assert_eq!(b.peer_held(2), 0);
        // a peer's messages go with it, and so does its charge
        assert_eq!(r.remove_peer(&b, 1).len(), 2);
        assert_eq!((b.held(), r.len()), (0, 0));
    }

    #[test]
    fn stalled_messages_go_after_three_ticks() {
        let b = limits(1 << 20, 1 << 20);
        let mut r = Reassembler::default();
        start(&mut r, &b, (1, 1), 10, b"a").unwrap();
        start(&mut r, &b, (1, 2), 10, b"a").unwrap();
        assert!(r.tick(&b).is_empty());
        assert!(r.tick(&b).is_empty());
        // (1, 2) progresses, (1, 1) does not
        frag(&mut r, &b, (1, 2), 1, b"b").unwrap();
        let gone = r.tick(&b);
        assert_eq!(gone.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![(1, 1)]);
        assert!(r.tick(&b).is_empty());
        assert_eq!(r.tick(&b).len(), 1);
        assert_eq!(b.held(), 0);
        let t = StallTimer::new(Some(std::time::Duration::from_secs(1)), "test");
        let e = Reassembler::<()>::stalled(&t, (1, 1));
        assert_eq!(e.status(), Status::TimedOut);
    }
}
