//! Atomics on the endpoint's AMO lane: add, and, or, xor, swap and compare-and-swap, 32 and 64
//! bit, posted (no result) or fetching (the old value).
//!
//! An op the lane does in hardware (or in the target's progress, for software transports)
//! goes as one transport atomic: both sides' capabilities must include it. Others are
//! emulated with compare-and-swap, which is correct for every op: read-modify-write rounds of
//! `cswap(guess, op(guess))` until the value seen is the guess (the first guess is 0, so an op
//! on a zeroed word takes one round). A 32-bit op on a lane with 64-bit cswap only works on
//! the aligned 8-byte word holding it and leaves the other half as it finds it, which needs
//! that whole word inside the remote region. Emulated and native ops on one location are
//! atomic with respect to each other because the lane's cswap is. A posted op that is
//! emulated completes when its last round did.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use ucs::{Error, Outcome, Result, Status};
use uct::{AtomicOps, AtomicResult, Completion};

pub use uct::{AtomicOp, AtomicWidth};

use super::rkey::{no_lanes, RemoteKey, RkeyInner};
use super::{submit, worker_of, RmaOp};
use crate::ep::{Ep, EpInner};
use crate::request::{request, Issued};

/// How an op goes on the lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// `atomic_post`.
    Post,
    /// `atomic_fetch` (for a posted op: the result is dropped).
    Fetch,
    /// `atomic_cswap`.
    Cswap,
    /// Compare-and-swap rounds of `width` on the word at `raddr - shift/8`.
    Emulated { width: AtomicWidth, shift: u32 },
}

fn mask(w: AtomicWidth) -> u64 {
    match w {
        AtomicWidth::U32 => u32::MAX as u64,
        AtomicWidth::U64 => u64::MAX,
    }
}

/// The plan for `op` of `width` at `raddr` with the lane's ops `(post, fetch)` per width
/// (both sides' capabilities intersected).
pub(crate) fn plan(
    op: AtomicOp,
    width: AtomicWidth,
    post: bool,
    raddr: u64,
    caps32: (AtomicOps, AtomicOps),
    caps64: (AtomicOps, AtomicOps),
) -> Result<Plan> {
    let (p, f) = match width {
        AtomicWidth::U32 => caps32,
        AtomicWidth::U64 => caps64,
    };
    if post && p.contains(op.flag()) {
        return Ok(Plan::Post);
    }
    if f.contains(op.flag()) {
        return Ok(if op == AtomicOp::Cswap {
            Plan::Cswap
        } else {
            Plan::Fetch
        });
    }
    if f.contains(AtomicOps::CSWAP) {
        return Ok(Plan::Emulated { width, shift: 0 });
    }
    if width == AtomicWidth::U32 && caps64.1.contains(AtomicOps::CSWAP) {
        return Ok(Plan::Emulated {
            width: AtomicWidth::U64,
            shift: (raddr & 7) as u32 * 8,
        });
    }
    Err(Error::new(
        Status::Unsupported,
        format!(
            "ucp: the atomic lane has no {}-bit {op:?} and no compare-and-swap to emulate it \
             (Features::AMO32 / AMO64 select a lane that has)",
            width as u8 * 8
        ),
    ))
}

/// The new value of a `width`-bit location holding `old` after `op`.
fn apply(op: AtomicOp, old: u64, value: u64, compare: u64) -> u64 {
    match op {
        AtomicOp::Add => old.wrapping_add(value),
        AtomicOp::And => old & value,
        AtomicOp::Or => old | value,
        AtomicOp::Xor => old ^ value,
        AtomicOp::Swap => value,
        AtomicOp::Cswap => {
            if old == compare {
                value
            } else {
                old
            }
        }
    }
}

type Done = Box<dyn FnOnce(Result<u64>)>;

/// One atomic op (an emulated one is re-queued for each round).
pub(crate) struct AmoOp {
    pub lane: usize,
    rkey: Rc<RkeyInner>,
    plan: Plan,
    op: AtomicOp,
    width: AtomicWidth,
    value: u64,
    compare: u64,
    raddr: u64,
    /// Emulation: the value the next cswap expects (of the cswap's width).
    guess: u64,
    /// Emulation: the id under which a flush waits for it ([`super::EpRma`]).
    live: Option<u64>,
    /// Emulation: it holds its word (the endpoint's other emulated ops on it wait).
    owner: bool,
    /// Emulation: the word's value after this op, once done (the next op's first guess).
    written: Option<u64>,
    ep: Weak<EpInner>,
    done: Option<Done>,
}

impl AmoOp {
    /// Completes the op (once); an emulated one stops counting for flushes.
    fn end(&mut self, r: Result<u64>) {
        if let Some(done) = self.done.take() {
            done(r);
        }
        self.release();
    }

    /// The word's address an emulated op works on.
    fn word(&self) -> u64 {
        match self.plan {
            Plan::Emulated { shift, .. } => self.raddr - u64::from(shift / 8),
            _ => self.raddr,
        }
    }

    /// An emulated op is over: flushes stop waiting for it, and the next op of the endpoint
    /// on its word starts, guessing the value this one left.
    fn release(&mut self) {
        let Some(ep) = self.ep.upgrade() else { return };
        if let Some(id) = self.live.take() {
            ep.rma().end(id);
        }
        if !std::mem::take(&mut self.owner) {
            return;
        }
        let next = {
            let mut words = ep.rma().words.borrow_mut();
            let next = words.get_mut(&self.word()).and_then(|q| q.pop_front());
            if next.is_none() {
                words.remove(&self.word());
            }
            next
        };
        if let Some(mut next) = next {
            next.owner = true;
            if let (Some(v), Plan::Emulated { width, .. }) = (self.written, next.plan) {
                next.guess = v & mask(width);
            }
            resubmit(&ep, next);
        }
    }

    pub fn progress(&mut self, ep: &EpInner) -> Result<bool> {
        if self.done.is_none() {
            return Ok(true);
        }
        let u = &ep.uct[self.lane];
        let rk = self.rkey.clone();
        let Some(key) = rk.keys[self.lane].as_ref() else {
            return Err(Error::new(
                Status::InvalidParam,
                "ucp: the RemoteKey has no key for the lane",
            ));
        };
        let m = mask(self.width);
        let r = match self.plan {
            Plan::Post => match u.atomic_post(self.width, self.op, self.value, self.raddr, key) {
                Ok(()) => Ok(Outcome::Done),
                Err(e) => Err(e),
            },
            Plan::Fetch | Plan::Cswap => {
                let res = AtomicResult::new();
                let slot = Rc::new(RefCell::new(None::<Done>));
                let (s, rr) = (slot.clone(), res.clone());
                let c = Completion::new(move |st| {
                    if let Some(done) = s.borrow_mut().take() {
                        done(if st.is_err() {
                            Err(st.into())
                        } else {
                            Ok(rr.get() & m)
                        });
                    }
                });
                let r = if self.plan == Plan::Cswap {
                    u.atomic_cswap(
                        self.width,
                        self.compare,
                        self.value,
                        &res,
                        self.raddr,
                        key,
                        Some(&c),
                    )
                } else {
                    u.atomic_fetch(self.width, self.op, self.value, &res, self.raddr, key, Some(&c))
                };
                match r {
                    Ok(Outcome::InProgress) => {
                        *slot.borrow_mut() = self.done.take();
                        return Ok(true);
                    }
                    Ok(Outcome::Done) => {
                        self.end(Ok(res.get() & m));
                        return Ok(true);
                    }
                    Err(e) => Err(e),
                }
            }
            Plan::Emulated { width, shift } => return self.emulate(ep, width, shift),
        };
        match r {
            Ok(_) => {
                self.end(Ok(0));
                Ok(true)
            }
            Err(e) if e == Status::NoResource => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The word the cswap of round `guess` writes, and the op's old value within `guess`.
    fn round(&self, shift: u32, width: AtomicWidth) -> (u64, u64) {
        let opm = mask(self.width);
        let old = (self.guess >> shift) & opm;
        let new = apply(self.op, old, self.value, self.compare) & opm;
        let word = (self.guess & !(opm << shift)) | (new << shift);
        (word & mask(width), old)
    }

    fn emulate(&mut self, ep: &EpInner, width: AtomicWidth, shift: u32) -> Result<bool> {
        if self.live.is_none() {
            self.live = Some(ep.rma().start());
        }
        if !self.owner {
            // One emulated op per word and endpoint at a time: ops racing each other on a
            // word would retry each other's rounds; in turn, each succeeds at once.
            let mut words = ep.rma().words.borrow_mut();
            match words.get_mut(&self.word()) {
                Some(q) => {
                    q.push_back(self.take_round());
                    return Ok(true);
                }
                None => {
                    words.insert(self.word(), Default::default());
                    self.owner = true;
                }
            }
        }
        let u = &ep.uct[self.lane];
        let rk = self.rkey.clone();
        let Some(key) = rk.keys[self.lane].as_ref() else {
            return Err(Error::new(
                Status::InvalidParam,
                "ucp: the RemoteKey has no key for the lane",
            ));
        };
        let waddr = self.raddr - u64::from(shift / 8);
        loop {
            let (word, _) = self.round(shift, width);
            let res = AtomicResult::new();
            let next = Rc::new(RefCell::new(None::<AmoOp>));
            let (n, rr) = (next.clone(), res.clone());
            let c = Completion::new(move |st| {
                let Some(mut op) = n.borrow_mut().take() else {
                    return;
                };
                if st.is_err() {
                    return op.end(Err(
                        Error::from(st).context_with("ucp: atomic (compare-and-swap round)")
                    ));
                }
                if op.settle(rr.get(), shift, width) {
                    return;
                }
                match op.ep.upgrade() {
                    Some(ep) => resubmit(&ep, op),
                    None => op.end(Err(Error::new(Status::Canceled, "ucp: the endpoint is gone"))),
                }
            });
            match u.atomic_cswap(width, self.guess, word, &res, waddr, key, Some(&c)) {
                Ok(Outcome::InProgress) => {
                    // The next round (or the end) happens in the completion.
                    *next.borrow_mut() = Some(self.take_round());
                    return Ok(true);
                }
                Ok(Outcome::Done) => {
                    if self.settle(res.get(), shift, width) {
                        return Ok(true);
                    }
                }
                Err(e) if e == Status::NoResource => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }

    /// After a round that saw `seen`: true when the op is done (completed), else the next
    /// guess is set.
    fn settle(&mut self, seen: u64, shift: u32, width: AtomicWidth) -> bool {
        let seen = seen & mask(width);
        if seen == self.guess {
            let (word, old) = self.round(shift, width);
            self.written = Some(word);
            self.end(Ok(old));
            return true;
        }
        self.guess = seen;
        false
    }

    /// This op's state, moved out for its next round (this one is left done).
    fn take_round(&mut self) -> AmoOp {
        AmoOp {
            lane: self.lane,
            rkey: self.rkey.clone(),
            plan: self.plan,
            op: self.op,
            width: self.width,
            value: self.value,
            compare: self.compare,
            raddr: self.raddr,
            guess: self.guess,
            live: self.live.take(),
            owner: std::mem::take(&mut self.owner),
            written: None,
            ep: self.ep.clone(),
            done: self.done.take(),
        }
    }

    pub fn finish(mut self, r: Result<()>) {
        if let Err(e) = r {
            self.end(Err(e));
        }
    }
}

impl Drop for AmoOp {
    fn drop(&mut self) {
        // Dropped unfinished (its endpoint or worker went away): flushes stop waiting for it;
        // the request completes with Canceled when its completer goes.
        self.release();
    }
}

/// Queues the next round of an emulated op, or fails it when the endpoint can no longer send.
fn resubmit(ep: &Rc<EpInner>, mut op: AmoOp) {
    match ep.check_usable() {
        Ok(()) => submit(ep, RmaOp::Amo(op)),
        Err(e) => op.end(Err(e)),
    }
}

/// Checks and queues an atomic op; its result when it finished in the call.
#[allow(clippy::too_many_arguments)]
fn issue<T: 'static>(
    ep: &Rc<EpInner>,
    op: AtomicOp,
    width: AtomicWidth,
    post: bool,
    value: u64,
    compare: u64,
    raddr: u64,
    rk: &RemoteKey,
    map: impl FnOnce(u64) -> T + 'static,
) -> Result<Issued<T>> {
    let what = "atomic";
    ep.check_usable()?;
    let w = worker_of(ep)?;
    let (feature, name) = match width {
        AtomicWidth::U32 => (crate::Features::AMO32, "Features::AMO32"),
        AtomicWidth::U64 => (crate::Features::AMO64, "Features::AMO64"),
    };
    super::require(&w, &[feature], name, what)?;
    let Some(lane) = ep.route.lanes.amo else {
        return Err(no_lanes(ep, what));
    };
    let bytes = width as u64;
    if raddr & (bytes - 1) != 0 {
        return Err(Error::new(
            Status::InvalidParam,
            format!(
                "ucp: a {}-bit atomic at {raddr:#x}: not aligned to {bytes} bytes",
                bytes * 8
            ),
        ));
    }
    if (value | compare) & !mask(width) != 0 {
        return Err(Error::new(
            Status::InvalidParam,
            format!("ucp: a 32-bit atomic with operand {value:#x} / {compare:#x} wider than 32 bits"),
        ));
    }
    rk.inner.check(ep, raddr, bytes, what)?;
    if rk.inner.keys[lane].is_none() {
        return Err(Error::new(
            Status::InvalidParam,
            "ucp: atomic: the RemoteKey has no key for this endpoint's atomic lane",
        ));
    }
    let l = &ep.route.lanes.lanes[lane];
    let local = &w.ifaces[l.local].info.attr;
    let remote = &ep.remote.entries[l.remote].tl.attr;
    let both = |a: (AtomicOps, AtomicOps), b: (AtomicOps, AtomicOps)| (a.0 & b.0, a.1 & b.1);
    let (mut caps32, mut caps64) = (
        both(local.atomic32, remote.atomic32),
        both(local.atomic64, remote.atomic64),
    );
    if w.ctx.inner.cfg.atomic_emulate {
        caps32 = (AtomicOps::EMPTY, AtomicOps::EMPTY);
        caps64 = (AtomicOps::EMPTY, caps64.1 & AtomicOps::CSWAP);
    }
    let plan = plan(op, width, post, raddr, caps32, caps64)?;
    if let Plan::Emulated { shift, .. } = plan {
        if shift != 0 || width == AtomicWidth::U32 {
            rk.inner
                .check(ep, raddr & !7, 8, "atomic (on the enclosing 8-byte word)")?;
        }
    }
    let (mut req, c) = request(&ep.worker);
    let a = AmoOp {
        lane,
        rkey: rk.inner.clone(),
        plan,
        op,
        width,
        value,
        compare,
        raddr,
        guess: 0,
        live: None,
        owner: false,
        written: None,
        ep: Rc::downgrade(ep),
        done: Some(Box::new(move |r: Result<u64>| c.complete(r.map(map)))),
    };
    submit(ep, RmaOp::Amo(a));
    match req.take() {
        Some(r) => r.map(Issued::Done),
        None => Ok(Issued::Pending(req)),
    }
}

impl Ep {
    /// Applies `op` (add, and, or, xor) with `value` to the `width`-bit word at `remote_addr`
    /// (aligned to its size, inside the region of `rkey`), without a result. Completes when
    /// issued (an emulated op: when done); [`Ep::flush`] when done at the peer.
    pub fn atomic_post(
        &self,
        op: AtomicOp,
        width: AtomicWidth,
        value: u64,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Issued<()>> {
        if matches!(op, AtomicOp::Swap | AtomicOp::Cswap) {
            return Err(Error::new(
                Status::InvalidParam,
                format!("ucp: atomic_post of {op:?}: it returns a value, use atomic_fetch / atomic_cswap"),
            ));
        }
        issue(
            self.connected_ep("Ep::atomic_post")?,
            op,
            width,
            true,
            value,
            0,
            remote_addr,
            rkey,
            |_| (),
        )
    }

    /// Applies `op` (add, and, or, xor, swap) with `value` to the `width`-bit word at
    /// `remote_addr`; the request gives the value it held before.
    pub fn atomic_fetch(
        &self,
        op: AtomicOp,
        width: AtomicWidth,
        value: u64,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Issued<u64>> {
        if op == AtomicOp::Cswap {
            return Err(Error::new(
                Status::InvalidParam,
                "ucp: atomic_fetch of Cswap: use atomic_cswap (it takes the compare value)",
            ));
        }
        issue(
            self.connected_ep("Ep::atomic_fetch")?,
            op,
            width,
            false,
            value,
            0,
            remote_addr,
            rkey,
            |v| v,
        )
    }

    /// Writes `swap` to the `width`-bit word at `remote_addr` if it holds `compare`; the
    /// request gives the value it held before (equal to `compare` when it swapped).
    pub fn atomic_cswap(
        &self,
        width: AtomicWidth,
        compare: u64,
        swap: u64,
        remote_addr: u64,
        rkey: &RemoteKey,
    ) -> Result<Issued<u64>> {
        issue(
            self.connected_ep("Ep::atomic_cswap")?,
            AtomicOp::Cswap,
            width,
            false,
            swap,
            compare,
            remote_addr,
            rkey,
            |v| v,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_POST: AtomicOps = AtomicOps(0b1111);
    const ALL_FETCH: AtomicOps = AtomicOps(0b11_1111);
    const NONE: (AtomicOps, AtomicOps) = (AtomicOps::EMPTY, AtomicOps::EMPTY);

    #[test]
    fn plans() {
        let full = (ALL_POST, ALL_FETCH);
        let rc = (AtomicOps::ADD, AtomicOps(AtomicOps::ADD.0 | AtomicOps::CSWAP.0));
        let p = |op, w, post, addr, c32, c64| plan(op, w, post, addr, c32, c64).unwrap();
        assert_eq!(
            p(AtomicOp::Add, AtomicWidth::U64, true, 0, full, full),
            Plan::Post
        );
        assert_eq!(
            p(AtomicOp::Swap, AtomicWidth::U32, false, 0, full, full),
            Plan::Fetch
        );
        assert_eq!(
            p(AtomicOp::Cswap, AtomicWidth::U64, false, 0, NONE, rc),
            Plan::Cswap
        );
        assert_eq!(
            p(AtomicOp::Add, AtomicWidth::U64, false, 0, NONE, rc),
            Plan::Fetch
        );
        let e64 = Plan::Emulated {
            width: AtomicWidth::U64,
            shift: 0,
        };
        assert_eq!(p(AtomicOp::Xor, AtomicWidth::U64, true, 0, NONE, rc), e64);
        assert_eq!(p(AtomicOp::Swap, AtomicWidth::U64, false, 0, NONE, rc), e64);
        assert_eq!(
            p(AtomicOp::Add, AtomicWidth::U32, false, 12, NONE, rc),
            Plan::Emulated {
                width: AtomicWidth::U64,
                shift: 32
            }
        );
        let e = plan(AtomicOp::Add, AtomicWidth::U64, false, 0, full, NONE).unwrap_err();
        assert_eq!(e, Status::Unsupported);
    }

    #[test]
    fn round_keeps_the_other_half() {
        let mut a = AmoOp {
            lane: 0,
            rkey: Rc::new(RkeyInner {
                ep: Weak::new(),
                addr: 0,
                len: 8,
                keys: Vec::new(),
            }),
            plan: Plan::Fetch,
            op: AtomicOp::Add,
            width: AtomicWidth::U32,
            value: 1,
            compare: 0,
            raddr: 4,
            guess: 0xaaaa_aaaa_ffff_ffff,
            live: None,
            owner: false,
            written: None,
            ep: Weak::new(),
            done: None,
        };
        // the upper half, 0xaaaaaaaa, + 1; the lower half untouched
        assert_eq!(
            a.round(32, AtomicWidth::U64),
            (0xaaaa_aaab_ffff_ffff, 0xaaaa_aaaa)
        );
        a.raddr = 0;
        a.op = AtomicOp::Add;
        // the lower half wraps without carrying into the upper one
        assert_eq!(a.round(0, AtomicWidth::U64), (0xaaaa_aaaa_0000_0000, 0xffff_ffff));
        a.op = AtomicOp::Cswap;
        a.compare = 0xffff_ffff;
        a.value = 7;
        assert_eq!(a.round(0, AtomicWidth::U64), (0xaaaa_aaaa_0000_0007, 0xffff_ffff));
    }
}
