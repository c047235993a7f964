//! Reliability over an unreliable datagram service, per endpoint and independent of verbs
//! (the model is UCX's `ud` transport):
//!
//! - **PSNs**: every AM gets a 16-bit packet sequence number, compared circularly.
//! - **Cumulative ACKs**: every outgoing packet carries `ack_psn`, the last PSN delivered in
//!   order; explicit ACKs answer an ACK request, a duplicate or an out-of-order packet at once,
//!   and unacknowledged deliveries at the next timer tick. Packets sent while the receive
//!   side has a hole (an out-of-order packet was dropped, until the next in-order delivery),
//!   and the first one after a duplicate, carry `FLAG_GAP`; only such packets count as
//!   duplicate ACKs. Every data packet repeats the peer's last `ack_psn`, and counting those
//!   would make a stream in one direction resend the other direction's packets (e.g. the
//!   flow-control replies of a one-way stream).
//! - **Send window** with AIMD congestion control: at most `cwnd` packets unacknowledged;
//!   `cwnd` grows by one per ACK that acknowledges something new and halves on every resend,
//!   within `MIN_WINDOW..=max_window`. Sent packets stay in the window (the caller's buffer
//!   handle `S`) until acknowledged.
//! - **Resend**: go-back-N from the oldest unacknowledged packet, started by the resend timer
//!   (exponential backoff, reset by ACK progress) or by three duplicate ACKs. The receiver
//!   drops out-of-order packets, as UCX does, so delivery is in order and exactly once.
//! - **Peer timeout**: no ACK progress for `peer_timeout` while something is outstanding
//!   declares the peer dead.
//!
//! The caller provides the clock (`Nanos`) and moves packets; see the simulation in the tests.

use super::window::Window;
use super::wire::{FLAG_ACK_REQ, FLAG_GAP};

/// A packet sequence number (wraps around).
pub type Psn = u16;
/// Nanoseconds of a monotonic clock chosen by the caller.
pub type Nanos = u64;

/// PSN of the first AM of a connection.
pub const INITIAL_PSN: Psn = 1;
/// Smallest congestion window.
pub const MIN_WINDOW: u16 = 2;
/// Largest allowed `max_window`: far below half the PSN space, so circular comparison of any
/// two PSNs in flight is unambiguous.
pub const MAX_WINDOW_LIMIT: u16 = 16384;
/// During a resend, every this many resent packets asks for an ACK.
pub const RESENDS_PER_ACK: u32 = 4;
/// Duplicate ACKs that start a resend before the timer does.
pub const DUP_ACK_THRESHOLD: u32 = 3;

/// `a` comes before `b` (circularly).
#[inline]
pub fn psn_lt(a: Psn, b: Psn) -> bool {
    (a.wrapping_sub(b) as i16) < 0
}

/// `a` comes before or is `b` (circularly).
#[inline]
pub fn psn_le(a: Psn, b: Psn) -> bool {
    (a.wrapping_sub(b) as i16) <= 0
}

/// Timing and window parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelConfig {
    /// Upper bound of the congestion window (2..=[`MAX_WINDOW_LIMIT`]).
    pub max_window: u16,
    /// First resend timeout; also what ACK progress resets it to.
    pub initial_rto: Nanos,
    /// Largest resend timeout after backoff.
    pub max_rto: Nanos,
    /// Resend timeout multiplier after each resend without progress (>= 1).
    pub backoff: f64,
    /// No ACK progress for this long while something is outstanding: the peer is dead.
    pub peer_timeout: Nanos,
}

impl RelConfig {
    /// The values clamped into their valid ranges.
    pub fn sanitized(mut self) -> RelConfig {
        self.max_window = self.max_window.clamp(MIN_WINDOW, MAX_WINDOW_LIMIT);
        self.initial_rto = self.initial_rto.max(1);
        self.max_rto = self.max_rto.max(self.initial_rto);
        if self.backoff.is_nan() || self.backoff < 1.0 {
            self.backoff = 1.0;
        }
        self
    }
}

/// What to put into the header of a packet about to go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub psn: Psn,
    pub ack_psn: Psn,
    /// [`FLAG_ACK_REQ`] or 0.
    pub flags: u8,
}

/// The acknowledgement to stamp into an outgoing packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub psn: Psn,
    /// [`FLAG_GAP`] or 0.
    pub flags: u8,
}

/// A packet to send again (its buffer handle and the new header fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resend<S> {
    pub skb: S,
    pub stamp: Stamp,
}

/// What a received ACK did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// Nothing new (old or duplicate ACK).
    Nothing,
    /// This many packets were acknowledged.
    Advanced(usize),
    /// Duplicate ACKs started a resend: call [`Reliability::next_resend`].
    FastResend,
    /// The ACK covers PSNs never sent: ignored.
    Bogus,
}

/// What to do with a received AM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxVerdict {
    /// The next in order: deliver it.
    Deliver,
    /// Already delivered: drop (an ACK is due).
    Duplicate,
    /// A gap before it: drop (an ACK is due; the sender will resend).
    OutOfOrder,
}

/// What the timer check found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerOutcome {
    /// Deliveries are unacknowledged: send an explicit ACK.
    pub send_ack: bool,
    /// The resend timer expired: a resend started (call [`Reliability::next_resend`]; a
    /// connection request still waiting for its reply should be sent again too).
    pub resend: bool,
    /// No ACK progress for `peer_timeout`: the peer is dead.
    pub timeout: bool,
}

/// The reliability state of one endpoint (both directions). `S` is the caller's handle of a
/// sent packet's buffer.
pub struct Reliability<S> {
    cfg: RelConfig,
    // ---- send side. Invariant: window[i] has PSN acked_psn + 1 + i.
    next_psn: Psn,
    acked_psn: Psn,
    cwnd: u16,
    window: Window<S>,
    /// Go-back-N cursor: the next PSN to resend.
    resend_next: Option<Psn>,
    resends_since_req: u32,
    dup_acks: u32,
    /// ACK progress since the last timer check.
    progressed: bool,
    /// A connection request waits for its reply (timed like outstanding data).
    connecting: bool,
    // ---- timers
    deadline: Option<Nanos>,
    last_progress: Option<Nanos>,
    rto: Nanos,
    // ---- receive side
    rx_next: Psn,
    ack_sent: Psn,
    ack_now: bool,
    /// A duplicate arrived: the next acknowledgement says so.
    dup_seen: bool,
    /// An out-of-order packet was dropped and nothing was delivered since: every
    /// acknowledgement says so.
    hole: bool,
}

impl<S: Copy + Default> Reliability<S> {
    pub fn new(cfg: RelConfig) -> Reliability<S> {
        let cfg = cfg.sanitized();
        Reliability {
            cfg,
            next_psn: INITIAL_PSN,
            acked_psn: INITIAL_PSN.wrapping_sub(1),
            cwnd: MIN_WINDOW,
            window: Window::with_capacity(16, S::default()),
            resend_next: None,
            resends_since_req: 0,
            dup_acks: 0,
            progressed: false,
            connecting: false,
            deadline: None,
            last_progress: None,
            rto: cfg.initial_rto,
            rx_next: INITIAL_PSN,
            ack_sent: INITIAL_PSN.wrapping_sub(1),
            ack_now: false,
            dup_seen: false,
            hole: false,
        }
    }

    pub fn config(&self) -> &RelConfig {
        &self.cfg
    }

    // ------------------------------------------------------------------ send side

    /// A new packet may go out: the window has room and no resend is under way (new packets
    /// would only be dropped as out of order behind the gap).
    #[inline]
    pub fn can_send(&self) -> bool {
        self.window.len() < self.cwnd as usize && self.resend_next.is_none()
    }

    /// Packets sent and not yet acknowledged.
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.window.len()
    }

    pub fn cwnd(&self) -> u16 {
        self.cwnd
    }

    /// PSN of the last packet sent (`INITIAL_PSN - 1` before the first).
    #[inline]
    pub fn last_sent(&self) -> Psn {
        self.next_psn.wrapping_sub(1)
    }

    pub fn acked_psn(&self) -> Psn {
        self.acked_psn
    }

    /// Whether the packet `psn` (already sent) has been acknowledged.
    #[inline]
    pub fn is_acked(&self, psn: Psn) -> bool {
        psn_le(psn, self.acked_psn)
    }

    /// True while a resend is under way.
    pub fn resending(&self) -> bool {
        self.resend_next.is_some()
    }

    /// Marks that a connection request waits for its reply (it is timed like data).
    pub fn set_connecting(&mut self, on: bool) {
        self.connecting = on;
        if !on {
            self.progressed = true;
        }
    }

    pub fn is_connecting(&self) -> bool {
        self.connecting
    }

    /// Gives the next PSN to a new packet whose buffer is `skb` (call only when
    /// [`can_send`](Self::can_send)); the packet stays in the window until acknowledged.
    /// Asks for an ACK a quarter into the window and just before it fills, as UCX does.
    #[inline]
    pub fn send(&mut self, skb: S) -> Stamp {
        debug_assert!(self.can_send());
        let psn = self.next_psn;
        self.next_psn = psn.wrapping_add(1);
        self.window.push_back(skb);
        let off = psn.wrapping_sub(self.acked_psn);
        let req = if off == self.cwnd / 4 || off.wrapping_add(1) == self.cwnd {
            FLAG_ACK_REQ
        } else {
            0
        };
        let ack = self.take_ack();
        Stamp {
            psn,
            ack_psn: ack.psn,
            flags: req | ack.flags,
        }
    }

    /// Processes a cumulative ACK; `freed` gets every packet it acknowledges, oldest first.
    /// `gap`: the packet carried `FLAG_GAP` (only then is an unchanged ACK a duplicate).
    #[inline]
    pub fn on_ack(&mut self, ack: Psn, gap: bool, mut freed: impl FnMut(Psn, S)) -> AckOutcome {
        if psn_le(ack, self.acked_psn) {
            if gap && ack == self.acked_psn && !self.window.is_empty() {
                self.dup_acks += 1;
                if self.dup_acks == DUP_ACK_THRESHOLD && self.resend_next.is_none() {
                    self.start_resend();
                    return AckOutcome::FastResend;
                }
            }
            return AckOutcome::Nothing;
        }
        if psn_lt(self.last_sent(), ack) {
            return AckOutcome::Bogus;
        }
        let mut n = 0;
        while psn_lt(self.acked_psn, ack) {
            self.acked_psn = self.acked_psn.wrapping_add(1);
            let skb = self
                .window
                .pop_front()
                .expect("window holds every unacknowledged PSN");
            freed(self.acked_psn, skb);
            n += 1;
        }
        self.cwnd = (self.cwnd + 1).min(self.cfg.max_window);
        self.dup_acks = 0;
        self.progressed = true;
        if let Some(c) = self.resend_next {
            if psn_le(c, ack) {
                let next = ack.wrapping_add(1);
                self.resend_next = if next == self.next_psn { None } else { Some(next) };
            }
        }
        AckOutcome::Advanced(n)
    }

    /// Starts a go-back-N resend from the oldest unacknowledged packet and halves `cwnd`.
    fn start_resend(&mut self) {
        self.cwnd = (self.cwnd / 2).max(MIN_WINDOW);
        self.resends_since_req = 0;
        if !self.window.is_empty() {
            self.resend_next = Some(self.acked_psn.wrapping_add(1));
        }
    }

    /// The next packet to send again, while a resend is under way and the window allows
    /// (at most `cwnd` packets past the last acknowledged one). Loop until `None`.
    pub fn next_resend(&mut self) -> Option<Resend<S>> {
        let c = self.resend_next?;
        let off = c.wrapping_sub(self.acked_psn);
        if off > self.cwnd {
            return None; // wait for ACKs
        }
        let Some(&skb) = self.window.get(off as usize - 1) else {
            self.resend_next = None;
            return None;
        };
        let next = c.wrapping_add(1);
        self.resend_next = if next == self.next_psn { None } else { Some(next) };
        self.resends_since_req += 1;
        let ask = self.resends_since_req >= RESENDS_PER_ACK || self.resend_next.is_none() || off == self.cwnd;
        if ask {
            self.resends_since_req = 0;
        }
        let req = if ask { FLAG_ACK_REQ } else { 0 };
        let ack = self.take_ack();
        Some(Resend {
            skb,
            stamp: Stamp {
                psn: c,
                ack_psn: ack.psn,
                flags: req | ack.flags,
            },
        })
    }

    /// Removes every unacknowledged packet (the endpoint failed or is being destroyed).
    pub fn drain(&mut self, mut f: impl FnMut(Psn, S)) {
        while let Some(skb) = self.window.pop_front() {
            self.acked_psn = self.acked_psn.wrapping_add(1);
            f(self.acked_psn, skb);
        }
        self.resend_next = None;
        self.connecting = false;
    }

    // ------------------------------------------------------------------ timers

    /// Something is timed: unacknowledged packets, a connection request, or deliveries not
    /// yet acknowledged.
    pub fn has_timed_work(&self) -> bool {
        !self.window.is_empty() || self.connecting || self.rx_unacked()
    }

    /// Runs the timers at time `now` (call periodically, e.g. every timer tick).
    pub fn on_timer(&mut self, now: Nanos) -> TimerOutcome {
        let mut out = TimerOutcome {
            send_ack: self.rx_unacked(),
            ..Default::default()
        };
        if self.window.is_empty() && !self.connecting {
            self.deadline = None;
            self.last_progress = None;
            self.progressed = false;
            self.rto = self.cfg.initial_rto;
            return out;
        }
        if self.progressed || self.last_progress.is_none() {
            if self.progressed {
                self.rto = self.cfg.initial_rto;
            }
            self.progressed = false;
            self.last_progress = Some(now);
            self.deadline = Some(now.saturating_add(self.rto));
            return out;
        }
        let since = now.saturating_sub(self.last_progress.unwrap_or(now));
        if since >= self.cfg.peer_timeout {
            out.timeout = true;
            return out;
        }
        if self.deadline.is_some_and(|d| now >= d) {
            self.start_resend();
            self.rto = ((self.rto as f64 * self.cfg.backoff) as Nanos).min(self.cfg.max_rto);
            self.deadline = Some(now.saturating_add(self.rto));
            out.resend = true;
        }
        out
    }

    /// The current resend timeout (for tests and diagnostics).
    pub fn rto(&self) -> Nanos {
        self.rto
    }

    // ------------------------------------------------------------------ receive side

    /// Classifies a received AM with sequence number `psn` (and whether it asked for an ACK).
    #[inline]
    pub fn on_receive(&mut self, psn: Psn, ack_req: bool) -> RxVerdict {
        if psn == self.rx_next {
            self.rx_next = psn.wrapping_add(1);
            self.hole = false;
            if ack_req {
                self.ack_now = true;
            }
            RxVerdict::Deliver
        } else if psn_lt(psn, self.rx_next) {
            self.ack_now = true;
            self.dup_seen = true;
            RxVerdict::Duplicate
        } else {
            self.ack_now = true;
            self.hole = true;
            RxVerdict::OutOfOrder
        }
    }

    /// A control packet asked for an ACK.
    pub fn request_ack(&mut self) {
        self.ack_now = true;
    }

    /// An explicit ACK should go out now.
    #[inline]
    pub fn needs_ack_now(&self) -> bool {
        self.ack_now
    }

    /// Deliveries the peer has not been told about.
    #[inline]
    pub fn rx_unacked(&self) -> bool {
        self.rx_next.wrapping_sub(1) != self.ack_sent
    }

    /// The acknowledgement for a packet about to go out (records that the peer is being
    /// told, and of a gap if one was seen).
    #[inline]
    pub fn take_ack(&mut self) -> Ack {
        self.ack_now = false;
        self.ack_sent = self.rx_next.wrapping_sub(1);
        let flags = if std::mem::take(&mut self.dup_seen) || self.hole {
            FLAG_GAP
        } else {
            0
        };
        Ack {
            psn: self.ack_sent,
            flags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn cfg() -> RelConfig {
        RelConfig {
            max_window: 64,
            initial_rto: 10 * MS,
            max_rto: 200 * MS,
            backoff: 2.0,
            peer_timeout: 2000 * MS,
        }
    }

    #[test]
    fn circular_compare() {
        assert!(psn_lt(1, 2) && !psn_lt(2, 1) && !psn_lt(5, 5));
        assert!(psn_le(5, 5) && psn_le(65535, 0) && psn_lt(65530, 3));
        assert!(!psn_lt(3, 65530));
        assert!(psn_lt(0, 32767) && psn_lt(40000, 7000));
    }

    #[test]
    fn window_grows_per_ack_and_halves_on_resend_within_bounds() {
        let mut r = Reliability::<u32>::new(cfg());
        assert_eq!(r.cwnd(), MIN_WINDOW);
        let s1 = r.send(1);
        assert_eq!((s1.psn, s1.ack_psn), (INITIAL_PSN, 0));
        assert_eq!(
            s1.flags, FLAG_ACK_REQ,
            "cwnd 2: the first packet asks (psn + 1 == max)"
        );
        r.send(2);
        assert!(!r.can_send(), "window of 2 is full");
        let mut freed = vec![];
        assert_eq!(
            r.on_ack(2, true, |p, s| freed.push((p, s))),
            AckOutcome::Advanced(2)
        );
        assert_eq!(freed, vec![(1, 1), (2, 2)]);
        assert_eq!(r.cwnd(), 3);
        // grow to the maximum, one per ACK that acknowledges something new
        for i in 0..200u32 {
            let p = r.send(i).psn;
            r.on_ack(p, true, |_, _| {});
        }
        assert_eq!(r.cwnd(), 64);
        // timeouts halve down to the minimum
        let mut t = 0;
        r.send(9);
        r.on_timer(t); // arms the timer
        let mut seen = vec![];
        for _ in 0..10 {
            t += 300 * MS;
            if r.on_timer(t).resend {
                seen.push(r.cwnd());
                while r.next_resend().is_some() {}
            }
        }
        assert_eq!(&seen[..6], &[32, 16, 8, 4, 2, 2]);
    }

    #[test]
    fn ack_request_points_and_piggybacked_acks() {
        let mut r = Reliability::<u32>::new(RelConfig {
            max_window: 16,
            ..cfg()
        });
        for i in 0..14 {
            let p = r.send(i).psn;
            r.on_ack(p, true, |_, _| {});
        }
        assert_eq!(r.cwnd(), 16);
        let flags: Vec<u8> = (0..16).map(|i| r.send(i).flags).collect();
        let asked: Vec<usize> = flags
            .iter()
            .enumerate()
            .filter(|(_, f)| **f != 0)
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(
            asked,
            vec![4, 15],
            "a quarter in and one before the window is full"
        );
        // the receive side stamps its progress into outgoing packets
        assert_eq!(r.on_receive(1, false), RxVerdict::Deliver);
        assert_eq!(r.on_receive(2, false), RxVerdict::Deliver);
        assert!(r.rx_unacked() && !r.needs_ack_now());
        assert_eq!(r.take_ack(), Ack { psn: 2, flags: 0 });
        assert!(!r.rx_unacked());
    }

    #[test]
    fn receive_side_drops_duplicates_and_gaps() {
        let mut r = Reliability::<u32>::new(cfg());
        assert_eq!(r.on_receive(1, false), RxVerdict::Deliver);
        assert!(!r.needs_ack_now());
        assert_eq!(r.on_receive(1, false), RxVerdict::Duplicate);
        assert!(r.needs_ack_now());
        assert_eq!(
            r.take_ack(),
            Ack {
                psn: 1,
                flags: FLAG_GAP
            },
            "a duplicate is reported"
        );
        assert!(!r.needs_ack_now());
        assert_eq!(r.take_ack(), Ack { psn: 1, flags: 0 }, "once");
        assert_eq!(r.on_receive(3, false), RxVerdict::OutOfOrder);
        assert!(r.needs_ack_now());
        assert_eq!(
            r.take_ack(),
            Ack {
                psn: 1,
                flags: FLAG_GAP
            }
        );
        assert_eq!(
            r.take_ack(),
            Ack {
                psn: 1,
                flags: FLAG_GAP
            },
            "until the hole is filled"
        );
        assert_eq!(r.on_receive(2, true), RxVerdict::Deliver);
        assert_eq!(r.on_receive(3, false), RxVerdict::Deliver);
        assert_eq!(r.take_ack(), Ack { psn: 3, flags: 0 });
    }

    #[test]
    fn bogus_and_old_acks_are_ignored_duplicates_trigger_fast_resend() {
        let mut r = Reliability::<u32>::new(cfg());
        r.send(10);
        assert_eq!(r.on_ack(5, true, |_, _| panic!()), AckOutcome::Bogus);
        assert_eq!(r.on_ack(1, true, |_, _| {}), AckOutcome::Advanced(1));
        for i in 0..3 {
            r.send(i);
        }
        assert_eq!(r.on_ack(1, true, |_, _| {}), AckOutcome::Nothing);
        assert_eq!(
            r.on_ack(0, true, |_, _| {}),
            AckOutcome::Nothing,
            "older than acked: not a duplicate"
        );
        assert_eq!(r.on_ack(1, true, |_, _| {}), AckOutcome::Nothing);
        assert_eq!(r.on_ack(1, true, |_, _| {}), AckOutcome::FastResend);
        assert!(!r.can_send(), "no new packets while resending");
        let resent: Vec<Psn> = std::iter::from_fn(|| r.next_resend())
            .map(|x| x.stamp.psn)
            .collect();
        assert_eq!(resent, vec![2, 3], "cwnd halved to 2: two in flight, then wait");
        r.on_ack(2, true, |_, _| {});
        assert_eq!(
            r.next_resend().map(|x| (x.stamp.psn, x.skb, x.stamp.flags)),
            Some((4, 2, FLAG_ACK_REQ))
        );
        assert!(r.next_resend().is_none() && !r.resending());
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets_on_progress() {
        let mut r = Reliability::<u32>::new(RelConfig {
            peer_timeout: u64::MAX / 2,
            ..cfg()
        });
        r.send(0);
        let mut t = 0;
        r.on_timer(t);
        let mut rtos = vec![];
        for _ in 0..8 {
            t += 1000 * MS;
            let o = r.on_timer(t);
            assert!(o.resend && !o.timeout);
            while r.next_resend().is_some() {}
            rtos.push(r.rto() / MS);
        }
        assert_eq!(rtos, vec![20, 40, 80, 160, 200, 200, 200, 200]);
        r.on_ack(1, true, |_, _| {});
        r.send(1);
        r.on_timer(t);
        assert_eq!(r.rto(), 10 * MS);
        // nothing outstanding: the timer is idle
        r.on_ack(2, true, |_, _| {});
        assert_eq!(r.on_timer(t + 100 * MS), TimerOutcome::default());
    }

    #[test]
    fn peer_timeout_without_ack_progress() {
        let mut r = Reliability::<u32>::new(cfg());
        r.send(0);
        let mut t = 5 * MS;
        r.on_timer(t);
        let start = t;
        loop {
            t += 10 * MS;
            let o = r.on_timer(t);
            while r.next_resend().is_some() {}
            if o.timeout {
                break;
            }
            assert!(t - start < 3000 * MS);
        }
        assert!((2000 * MS..2010 * MS).contains(&(t - start)), "{}", t - start);
        // a connection request is timed the same way
        let mut c = Reliability::<u32>::new(cfg());
        c.set_connecting(true);
        assert!(c.has_timed_work());
        c.on_timer(0);
        assert!(c.on_timer(15 * MS).resend);
        assert!(c.on_timer(2500 * MS).timeout);
    }
}
