//! An endpoint's queue of operations waiting for its lanes, with the bytes they hold counted:
//! a peer that stops reading makes the queue grow as the application keeps sending, and past
//! `RUCX_EP_SEND_QUEUE_LIMIT` the endpoint fails with `ExceedsLimit` (error mode None included:
//! nothing else would notice).

use std::collections::VecDeque;

use crate::proto::op::SendOp;

/// Queued operations in order, and the bytes of data they hold.
#[derive(Default)]
pub(crate) struct SendQueue {
    ops: VecDeque<SendOp>,
    bytes: usize,
}

impl SendQueue {
    pub fn push_back(&mut self, op: SendOp) {
        self.bytes += op.queued_len();
        self.ops.push_back(op);
    }

    /// Puts back an operation taken with [`SendQueue::pop_front`] (it may have progressed).
    pub fn push_front(&mut self, op: SendOp) {
        self.bytes += op.queued_len();
        self.ops.push_front(op);
    }

    pub fn pop_front(&mut self) -> Option<SendOp> {
        let op = self.ops.pop_front()?;
        self.bytes -= op.queued_len();
        Some(op)
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Takes every operation, in order.
    pub fn take_all(&mut self) -> Vec<SendOp> {
        self.bytes = 0;
        self.ops.drain(..).collect()
    }

    /// Bytes of data the queued operations hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn shrink_to_fit(&mut self) {
        self.ops.shrink_to_fit();
    }
}
