//! The interface's progress: completions read from the CQ (sends and RMA completing, AMs
//! delivered, receive buffers posted again), pending requests dispatched, stalled endpoints
//! failed after the peer timeout.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use ucs::Status;

use super::*;

impl Shared {
    /// Finishes the operation of slot `i` with `status`.
    fn complete(&self, i: usize, status: Status) {
        let op = std::mem::replace(&mut self.ops.borrow_mut()[i], Op::Free);
        self.free.borrow_mut().push(i as u32);
        let (ep, comp) = match op {
            Op::Free => {
                ucs::warn!("ofi: completion for idle operation slot {i}: ignored");
                return;
            }
            Op::Plain { ep, comp } => (ep, comp),
            Op::Fetch {
                ep,
                comp,
                result,
                wide,
            } => {
                if status == Status::Ok {
                    // SAFETY: the atomic that wrote the slot's result has completed.
                    let b = unsafe { self.tx_bufs.bytes(i * self.seg + 16, 8) };
                    let v = if wide {
                        u64::from_le_bytes(b.try_into().expect("8 bytes"))
                    } else {
                        u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as u64
                    };
                    if let Some(r) = result {
                        r.set(v);
                    }
                }
                (ep, comp)
            }
        };
        ep.outstanding.set(ep.outstanding.get() - 1);
        self.outstanding.set(self.outstanding.get() - 1);
        if !comp.is_none() {
            comp.complete(status);
        }
        if status != Status::Ok {
            ep.fail(self, status);
        }
        if ep.outstanding.get() == 0 {
            ep.flushed();
        }
        if self.outstanding.get() == 0 {
            let w = std::mem::take(&mut *self.flush_waiters.borrow_mut());
            for c in w {
                c.complete(Status::Ok);
            }
        }
    }

    /// A received message in buffer `j`: delivered to its AM handler, then the buffer waits to
    /// be posted again with the next batch.
    fn receive(&self, j: usize, len: usize) {
        if len > self.seg {
            ucs::warn!(
                "ofi: received {len} bytes into a {}-byte buffer: dropped",
                self.seg
            );
        } else {
            // SAFETY: the receive into buffer j has completed and is reposted only below.
            let msg = unsafe { self.rx_bufs.bytes(j * self.seg, len) };
            match wire::parse(msg) {
                Ok((id, data)) => {
                    let _ = self.am.invoke(id, data, None);
                }
                Err(bad) => ucs::warn!("ofi {}: dropped a received message: {bad}", self.md.name),
            }
        }
        let full = {
            let mut done = self.rx_done.borrow_mut();
            done.push(j as u32);
            done.len() >= self.rx_batch
        };
        if full {
            self.repost();
        }
    }

    /// Posts the consumed receive buffers again. Out of the latency path where it can be:
    /// progress calls it when it finds no completion, and when a batch is full.
    pub(super) fn repost(&self) {
        loop {
            let Some(j) = self.rx_done.borrow_mut().pop() else {
                return;
            };
            if let Err(e) = self.post_recv(j as usize) {
                ucs::error!(
                    "ofi {}: reposting a receive buffer failed: {} (one fewer receive buffer)",
                    self.md.name,
                    ffi::strerror(e as i64)
                );
            }
        }
    }

    /// The slot of a context address: `Ok(send slot)` or `Err(receive buffer)`; `None` for an
    /// address that is none of ours.
    fn slot_of(&self, ctx: usize) -> Option<std::result::Result<usize, usize>> {
        let base = self.contexts.addr(0) as usize;
        let off = ctx.checked_sub(base)?;
        if off % CTX_LEN != 0 {
            return None;
        }
        let i = off / CTX_LEN;
        if i < self.tx_len {
            Some(Ok(i))
        } else if i < self.tx_len + self.rx_len {
            Some(Err(i - self.tx_len))
        } else {
            None
        }
    }

    fn handle(&self, e: &CqEntry) {
        match self.slot_of(e.context()) {
            Some(Ok(i)) => self.complete(i, Status::Ok),
            Some(Err(j)) => self.receive(j, e.len()),
            None => ucs::warn!(
                "ofi: completion with a foreign context {:#x}: ignored",
                e.context()
            ),
        }
    }

    fn handle_error(&self) {
        let Some(err) = self.cq.readerr() else {
            return;
        };
        match self.slot_of(err.context) {
            Some(Ok(i)) => {
                ucs::debug!("ofi {}: operation failed: {}", self.md.name, err.message);
                let st = if err.err == ffi::errno::ECANCELED {
                    Status::Canceled
                } else {
                    Status::IoError
                };
                self.complete(i, st);
            }
            Some(Err(j)) => {
                if err.err != ffi::errno::ECANCELED {
                    ucs::warn!(
                        "ofi {}: receive failed ({}): message dropped",
                        self.md.name,
                        err.message
                    );
                    if let Err(e) = self.post_recv(j) {
                        ucs::error!("ofi: reposting a receive failed: {}", ffi::strerror(e as i64));
                    }
                }
            }
            None => ucs::warn!("ofi {}: error completion: {}", self.md.name, err.message),
        }
    }

    /// Dispatches pending requests, each waiting endpoint once, in order.
    fn dispatch_pending(&self) {
        let n = self.arbiter.borrow().len();
        for _ in 0..n {
            let Some(ep) = self.arbiter.borrow_mut().pop_front() else {
                break;
            };
            ep.dispatch(self);
            if ep.has_pending() {
                self.arbiter.borrow_mut().push_back(ep);
            } else {
                ep.queued.set(false);
            }
        }
    }

    /// Waits (a bounded time) for the operations in flight before the interface closes, on RxM
    /// stacks (libfabric 1.17's `verbs;ofi_rxm` crashes closing an endpoint with sends in
    /// flight) and connected devices (their endpoints close with the interface).
    /// Not on others: `shm`'s progress touches the peer's region, which may be gone by now.
    /// Their completions are dropped: the host has destroyed their endpoints.
    pub(super) fn drain(&self) {
        if !self.md.info.get().prov_name().contains("ofi_rxm") && self.msg.is_none() {
            return;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        let mut ents = [MaybeUninit::<CqEntry>::uninit(); CQ_BATCH];
        while std::time::Instant::now() < deadline {
            let mut slots: Vec<usize> = Vec::new();
            match self.cq.read(&mut ents) {
                Ok(es) => slots.extend(es.iter().filter_map(|e| self.slot_of(e.context())?.ok())),
                Err(n) if -n as i32 == ffi::errno::EAGAIN && self.outstanding.get() == 0 => break,
                Err(n) if -n as i32 == ffi::errno::EAVAIL => {
                    if let Some(err) = self.cq.readerr() {
                        slots.extend(self.slot_of(err.context).and_then(|r| r.ok()));
                    }
                }
                Err(_) => {}
            }
            for i in slots {
                if !matches!(
                    std::mem::replace(&mut self.ops.borrow_mut()[i], Op::Free),
                    Op::Free
                ) {
                    self.outstanding.set(self.outstanding.get() - 1);
                }
            }
        }
    }

    pub(crate) fn progress(&self) -> u32 {
        let mut ents = [MaybeUninit::<CqEntry>::uninit(); CQ_BATCH];
        let mut done = 0u32;
        match self.cq.read(&mut ents) {
            Ok(es) => {
                for e in es {
                    self.handle(e);
                }
                done = es.len() as u32;
            }
            Err(n) if -n as i32 == ffi::errno::EAVAIL => {
                self.handle_error();
                done = 1;
            }
            Err(n) if -n as i32 == ffi::errno::EAGAIN => self.repost(),
            Err(n) if n < 0 && !self.warned_cq.replace(true) => ucs::error!(
                "ofi {}: fi_cq_read failed: {}",
                self.md.name,
                ffi::strerror(n as i64)
            ),
            Err(_) => {}
        }
        if let Some(m) = &self.msg {
            if m.due() {
                done += m.poll(self);
            }
        }
        if !self.arbiter.borrow().is_empty() {
            self.dispatch_pending();
        }
        if !self.stalled.borrow().is_empty() {
            let t = self.ticks.get().wrapping_add(1);
            self.ticks.set(t);
            if t & 63 == 0 {
                self.fail_stalled();
            }
        }
        done
    }

    /// Fails the endpoints whose sends found the provider full for longer than the peer
    /// timeout (a peer that is gone: RxM retries its connection for ever); forgets those that
    /// sent since.
    fn fail_stalled(&self) {
        let now = std::time::Instant::now();
        let mut gone = Vec::new();
        self.stalled.borrow_mut().retain(|ep| {
            let keep = match ep.stalled_since.get() {
                Some(_) if ep.is_failed() => false,
                Some(t) if now.saturating_duration_since(t) > self.peer_timeout => {
                    gone.push(ep.clone());
                    false
                }
                Some(_) => true,
                None => false,
            };
            ep.watched.set(keep);
            keep
        });
        for ep in gone {
            ucs::warn!(
                "ofi {}: sends found the provider full for {:?}: peer counted as gone (RUCX_OFI_PEER_TIMEOUT)",
                self.md.name,
                self.peer_timeout
            );
            ep.fail(self, Status::EndpointTimeout);
        }
    }
}
