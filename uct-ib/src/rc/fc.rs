//! Active-message flow control (UCX's rc FC): a credit window per endpoint, so a fast sender
//! never exhausts the receiver's shared receive queue (which would cause RNR NAK back-off).
//!
//! Every AM takes one credit. The AM sent when the window equals the soft threshold asks for a
//! grant to be piggybacked on the peer's next AM (`FC_SOFT_REQ`); the one sent at the hard
//! threshold asks for an immediate pure grant (`FC_HARD_REQ`). At zero credits sends return
//! `NoResource`. A grant restores the full window. Grants and pure grants themselves are not
//! flow-controlled.

use super::wire::{FC_GRANT, FC_HARD_REQ, FC_PURE_GRANT, FC_SOFT_REQ};

/// Window parameters of an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FcParams {
    pub enabled: bool,
    pub wnd: i32,
    pub soft: i32,
    pub hard: i32,
}

impl FcParams {
    /// A window of `wnd` credits with thresholds as fractions of it (hard < soft < 1).
    pub fn new(enabled: bool, wnd: u32, soft_frac: f64, hard_frac: f64) -> FcParams {
        let wnd = wnd.clamp(4, i16::MAX as u32) as i32;
        let soft = ((wnd as f64 * soft_frac) as i32).clamp(2, wnd - 1);
        let hard = ((wnd as f64 * hard_frac) as i32).clamp(1, soft - 1);
        FcParams {
            enabled,
            wnd,
            soft,
            hard,
        }
    }
}

/// What the receive side must do after an AM's flow-control flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RxAction {
    /// The window was restored: pending sends may go.
    pub granted: bool,
    /// Send a pure grant now.
    pub send_pure_grant: bool,
}

/// The flow-control state of one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FcState {
    /// Credits left.
    pub wnd: i32,
    /// The peer asked (softly) for a grant: piggyback one on the next AM.
    pub grant_owed: bool,
    /// The peer asked for a grant now and none could be sent yet.
    pub pure_grant_due: bool,
}

impl FcState {
    pub fn new(p: &FcParams) -> FcState {
        FcState {
            wnd: p.wnd,
            grant_owed: false,
            pure_grant_due: false,
        }
    }

    /// True when an AM may be sent.
    #[inline]
    pub fn can_send(&self, p: &FcParams) -> bool {
        !p.enabled | (self.wnd > 0)
    }

    /// The flags of the next AM (call [`FcState::sent`] once it is posted).
    #[inline]
    pub fn tx_flags(&self, p: &FcParams) -> u8 {
        // arithmetic on flags, no branches (every AM computes this); hard < soft, so at most
        // one request flag is set
        let on = p.enabled as u8;
        let hard = (on & (self.wnd == p.hard) as u8) * FC_HARD_REQ;
        let soft = (on & (self.wnd == p.soft) as u8) * FC_SOFT_REQ;
        hard | soft | (self.grant_owed as u8 * FC_GRANT)
    }

    /// An AM with `flags` was posted.
    #[inline]
    pub fn sent(&mut self, p: &FcParams, flags: u8) {
        if p.enabled {
            self.wnd -= 1;
        }
        if flags & FC_GRANT != 0 {
            self.grant_owed = false;
        }
    }

    /// A pure grant was posted.
    pub fn pure_grant_sent(&mut self) {
        self.pure_grant_due = false;
        self.grant_owed = false;
    }

    /// An AM (or pure grant) with `flags` arrived from the peer.
    pub fn on_rx(&mut self, p: &FcParams, flags: u8) -> RxAction {
        let mut a = RxAction::default();
        if flags & FC_GRANT != 0 {
            self.wnd = p.wnd;
            a.granted = true;
        }
        if flags == FC_PURE_GRANT {
            return a;
        }
        if flags & FC_HARD_REQ != 0 {
            self.pure_grant_due = true;
            a.send_pure_grant = true;
        } else if flags & FC_SOFT_REQ != 0 {
            self.grant_owed = true;
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> FcParams {
        FcParams::new(true, 8, 0.5, 0.25)
    }

    #[test]
    fn thresholds() {
        assert_eq!(
            params(),
            FcParams {
                enabled: true,
                wnd: 8,
                soft: 4,
                hard: 2
            }
        );
        let d = FcParams::new(true, 512, 0.5, 0.25);
        assert_eq!((d.soft, d.hard), (256, 128));
        let tiny = FcParams::new(true, 1, 0.5, 0.25);
        assert!(tiny.wnd == 4 && tiny.hard < tiny.soft && tiny.soft < tiny.wnd);
    }

    /// A sender sends until blocked; the flags appear exactly at the thresholds.
    #[test]
    fn sender_requests_at_thresholds_and_blocks_at_zero() {
        let p = params();
        let mut s = FcState::new(&p);
        let mut flags = Vec::new();
        while s.can_send(&p) {
            let f = s.tx_flags(&p);
            flags.push(f);
            s.sent(&p, f);
        }
        assert_eq!(flags, vec![0, 0, 0, 0, FC_SOFT_REQ, 0, FC_HARD_REQ, 0]);
        assert_eq!(s.wnd, 0);
        let a = s.on_rx(&p, FC_PURE_GRANT);
        assert_eq!(
            a,
            RxAction {
                granted: true,
                send_pure_grant: false
            }
        );
        assert_eq!(s.wnd, 8);
    }

    /// The receiver piggybacks a grant after a soft request and sends a pure grant after a hard one.
    #[test]
    fn receiver_grants() {
        let p = params();
        let mut r = FcState::new(&p);
        assert_eq!(r.on_rx(&p, FC_SOFT_REQ), RxAction::default());
        assert!(r.grant_owed);
        let f = r.tx_flags(&p);
        assert_eq!(f, FC_GRANT);
        r.sent(&p, f);
        assert!(!r.grant_owed && r.wnd == 7);
        let a = r.on_rx(&p, FC_HARD_REQ);
        assert!(a.send_pure_grant && r.pure_grant_due);
        r.pure_grant_sent();
        assert!(!r.pure_grant_due && !r.grant_owed);
    }

    /// A whole conversation: the sender never exceeds the window and is never blocked for good.
    #[test]
    fn conversation_never_deadlocks() {
        let p = params();
        let (mut tx, mut rx) = (FcState::new(&p), FcState::new(&p));
        let mut in_flight: Vec<u8> = Vec::new();
        let mut delivered = 0;
        for round in 0..1000 {
            // sender: as much as allowed
            while tx.can_send(&p) {
                let f = tx.tx_flags(&p);
                tx.sent(&p, f);
                in_flight.push(f);
            }
            assert!(
                in_flight.len() <= p.wnd as usize + p.hard as usize,
                "round {round}"
            );
            // receiver: processes everything, answers hard requests with pure grants
            let mut grants = 0;
            for f in in_flight.drain(..) {
                delivered += 1;
                if rx.on_rx(&p, f).send_pure_grant {
                    rx.pure_grant_sent();
                    grants += 1;
                }
            }
            for _ in 0..grants {
                tx.on_rx(&p, FC_PURE_GRANT);
            }
        }
        assert!(delivered >= 1000 * 6);
    }

    #[test]
    fn disabled_never_blocks_but_still_piggybacks() {
        let p = FcParams::new(false, 8, 0.5, 0.25);
        let mut s = FcState::new(&p);
        for _ in 0..100 {
            assert!(s.can_send(&p));
            let f = s.tx_flags(&p);
            assert_eq!(f & (FC_SOFT_REQ | FC_HARD_REQ), 0);
            s.sent(&p, f);
        }
    }

    /// Every window position, with and without FC and an owed grant: the request flag at the
    /// thresholds only, the grant flag whenever one is owed.
    #[test]
    fn flags_of_every_state() {
        for enabled in [true, false] {
            let p = FcParams::new(enabled, 8, 0.5, 0.25);
            for wnd in -1..=9 {
                for grant_owed in [false, true] {
                    let s = FcState {
                        wnd,
                        grant_owed,
                        pure_grant_due: false,
                    };
                    let mut want = if grant_owed { FC_GRANT } else { 0 };
                    if enabled && wnd == p.hard {
                        want |= FC_HARD_REQ;
                    } else if enabled && wnd == p.soft {
                        want |= FC_SOFT_REQ;
                    }
                    assert_eq!(
                        s.tx_flags(&p),
                        want,
                        "enabled {enabled} wnd {wnd} owed {grant_owed}"
                    );
                    assert_eq!(s.can_send(&p), !enabled || wnd > 0);
                }
            }
        }
    }
}
