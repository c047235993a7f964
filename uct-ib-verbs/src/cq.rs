//! Completion queues and completion channels (event fd, `ibv_req_notify_cq`, ack).

use crate::device::Context;
use crate::error::{errno, fail, last_errno, CallKind};
use crate::wc::{WcBatch, WorkCompletion};
use rdma_sys::*;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use ucs::{Error, Result, Status};

/// A completion channel (`ibv_create_comp_channel`): one fd that becomes readable when any
/// armed CQ attached to it gets a completion. Add [`CompletionChannel::fd`] to epoll.
pub struct CompletionChannel {
    ch: NonNull<ibv_comp_channel>,
    ctx: Arc<Context>,
}

// SAFETY: channel calls (get_cq_event) are thread-safe in libibverbs; the fd is a plain int.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

/// Identifies which CQ an event from a shared [`CompletionChannel`] belongs to; compare with
/// [`CompletionQueue::id`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqId(usize);

impl CompletionChannel {
    /// Creates a channel on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<CompletionChannel>> {
        // SAFETY: valid context.
        let ch = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        match NonNull::new(ch) {
            Some(ch) => Ok(Arc::new(CompletionChannel { ch, ctx: ctx.clone() })),
            None => Err(fail(
                "ibv_create_comp_channel",
                format_args!("{}", ctx.name()),
                last_errno(),
                CallKind::Control,
            )),
        }
    }

    /// The event fd (readable when an event is pending).
    pub fn fd(&self) -> RawFd {
        // SAFETY: valid channel; `fd` is set at creation and never changes.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// Makes [`CompletionChannel::get_event`] return `Ok(None)` instead of blocking when no
    /// event is pending (what an event-driven progress engine wants).
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let fd = self.fd();
        let map = |e: nix::Error| {
            fail(
                "fcntl",
                format_args!("comp channel fd {fd}"),
                e as i32,
                CallKind::Control,
            )
        };
        let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL).map_err(map)?);
        let flags = if nonblocking {
            flags | OFlag::O_NONBLOCK
        } else {
            flags - OFlag::O_NONBLOCK
        };
        fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(map)?;
        Ok(())
    }

    /// Reads one completion event and acknowledges it at once (as UCX does), so destroying
    /// a CQ can never wait for unacknowledged events. `Ok(None)`: no event pending (only in
    /// non-blocking mode). After an event, re-arm the CQ with
    /// [`CompletionQueue::req_notify`] and then poll it until empty.
    pub fn get_event(&self) -> Result<Option<CqId>> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut std::os::raw::c_void = std::ptr::null_mut();
        // SAFETY: valid channel and out-pointers.
        let rc = unsafe { ibv_get_cq_event(self.ch.as_ptr(), &mut cq, &mut cq_ctx) };
        if rc != 0 {
            let e = last_errno();
            if e == errno::EAGAIN {
                return Ok(None);
            }
            return Err(fail(
                "ibv_get_cq_event",
                format_args!("{}", self.ctx.name()),
                e,
                CallKind::Control,
            ));
        }
        // SAFETY: `cq` was just reported by the channel; a CQ cannot finish being destroyed
        // while it has reported but unacknowledged events, so it is valid here.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(Some(CqId(cq as usize)))
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: CQs using the channel hold an Arc to it, so none is alive; destroyed once.
        let rc = unsafe { ibv_destroy_comp_channel(self.ch.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_destroy_comp_channel",
                format_args!("{}", self.ctx.name()),
                rc,
                CallKind::Control,
            );
        }
    }
}

/// A completion queue (`ibv_create_cq`), optionally attached to a completion channel.
pub struct CompletionQueue {
    cq: NonNull<ibv_cq>,
    capacity: u32,
    ctx: Arc<Context>,
    channel: Option<Arc<CompletionChannel>>,
}

// SAFETY: CQ verbs (poll, req_notify, destroy) are thread-safe in libibverbs providers.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Creates a CQ with room for at least `cqe` completions. With a `channel`, armed
    /// completions ([`CompletionQueue::req_notify`]) raise events on it.
    pub fn new(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompletionChannel>>,
        comp_vector: i32,
    ) -> Result<Arc<CompletionQueue>> {
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.ch.as_ptr());
        let cqe_i = i32::try_from(cqe.max(1)).unwrap_or(i32::MAX);
        // SAFETY: valid context; `ch` is NULL or a channel of the same context kept alive by
        // the Arc we store.
        let cq = unsafe { ibv_create_cq(ctx.as_ptr(), cqe_i, std::ptr::null_mut(), ch, comp_vector) };
        let Some(cq) = NonNull::new(cq) else {
            return Err(fail(
                "ibv_create_cq",
                format_args!(
                    "{} cqe={cqe} channel={} vector={comp_vector}",
                    ctx.name(),
                    channel.is_some()
                ),
                last_errno(),
                CallKind::Control,
            ));
        };
        // SAFETY: freshly created, valid CQ; `cqe` holds the granted size.
        let capacity = unsafe { (*cq.as_ptr()).cqe }.max(0) as u32;
        Ok(Arc::new(CompletionQueue {
            cq,
            capacity,
            ctx: ctx.clone(),
            channel: channel.cloned(),
        }))
    }

    /// Granted number of entries (at least what was asked for).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The identity events on a shared channel report for this CQ.
    pub fn id(&self) -> CqId {
        CqId(self.cq.as_ptr() as usize)
    }

    /// The completion channel, if any.
    pub fn channel(&self) -> Option<&Arc<CompletionChannel>> {
        self.channel.as_ref()
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    /// Polls up to `wcs.len()` completions into `wcs` (no allocation) and returns how many
    /// were written. Check [`WorkCompletion::status`] of each.
    #[inline]
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let n = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        // SAFETY: valid CQ; WorkCompletion is repr(transparent) over ibv_wc and `wcs` has
        // room for `n` entries.
        let rc = unsafe { ibv_poll_cq(self.cq.as_ptr(), n, wcs.as_mut_ptr().cast::<ibv_wc>()) };
        if rc < 0 {
            return Err(self.poll_failed(rc));
        }
        Ok(rc as usize)
    }

    /// Polls up to `max` (at most `N`) completions into `batch` and returns those polled.
    #[inline]
    pub fn poll_into<'b, const N: usize>(
        &self,
        max: usize,
        batch: &'b mut WcBatch<N>,
    ) -> Result<&'b [WorkCompletion]> {
        let n = max.min(N).min(i32::MAX as usize);
        // SAFETY: valid CQ; WorkCompletion is repr(transparent) over ibv_wc and the batch has
        // room for `n` entries, which ibv_poll_cq only writes.
        let rc = unsafe { ibv_poll_cq(self.cq.as_ptr(), n as i32, batch.0.as_mut_ptr().cast::<ibv_wc>()) };
        if rc < 0 {
            return Err(self.poll_failed(rc));
        }
        let got = (rc as usize).min(n);
        // SAFETY: ibv_poll_cq initialised the first `rc` entries (rc <= n).
        Ok(unsafe { std::slice::from_raw_parts(batch.0.as_ptr().cast::<WorkCompletion>(), got) })
    }

    #[cold]
    fn poll_failed(&self, rc: i32) -> Error {
        ucs::error!(
            "ibv_poll_cq({}) failed: returned {rc} -> {}",
            self.ctx.name(),
            Status::IoError.name()
        );
        Error::from(Status::IoError)
    }

    /// Arms the CQ: the next completion (the next solicited one with `solicited_only`)
    /// raises one event on the channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(crate::error::invalid(
                "CompletionQueue::req_notify",
                format_args!("the CQ has no completion channel; create it with one"),
                Status::InvalidParam,
            ));
        }
        // SAFETY: valid CQ.
        let rc = unsafe { ibv_req_notify_cq(self.cq.as_ptr(), solicited_only as i32) };
        if rc != 0 {
            return Err(fail(
                "ibv_req_notify_cq",
                format_args!("{}", self.ctx.name()),
                rc,
                CallKind::Control,
            ));
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: QPs/SRQs using this CQ hold an Arc to it, so none is alive; every channel
        // event was acknowledged in get_event, so destroy cannot block; destroyed once.
        let rc = unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            fail(
                "ibv_destroy_cq",
                format_args!("{}", self.ctx.name()),
                rc,
                CallKind::Control,
            );
        }
    }
}
