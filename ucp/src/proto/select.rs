//! Protocol selection as data: from what is sent (the operation, header and payload lengths,
//! whether the buffer can be lent to the transport, a forced choice) and the endpoint's
//! [`Limits`], the one protocol the send path executes (UCX's `ucp_proto_select`).
//! `Ep::am_protocol` and `RUCX_PROTO_INFO` ask the same function.

use crate::ep::Limits;
use crate::AmProto as Proto;

/// The operation a message belongs to: it decides the prefixes on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// An active message (with reply fields when `reply`).
    Am { reply: bool },
    /// A tag message.
    Tag,
    /// A synchronous tag message (acknowledged by the receiver when matched).
    TagSync,
    /// Stream bytes.
    Stream,
}

impl Op {
    /// Bytes before the user header of a message sent whole.
    pub fn single_prefix(self) -> usize {
        match self {
            Op::Am { reply } => crate::wire::single_prefix_len(reply),
            Op::Tag => crate::tag::wire::EAGER_LEN,
            Op::TagSync => crate::tag::wire::SYNC_LEN,
            Op::Stream => crate::stream::PREFIX_LEN,
        }
    }

    /// Bytes before the user header of the first of several messages.
    pub fn first_prefix(self) -> usize {
        match self {
            Op::Am { reply } => crate::wire::first_prefix_len(reply),
            Op::Tag | Op::TagSync => crate::tag::wire::FIRST_LEN,
            Op::Stream => crate::stream::PREFIX_LEN,
        }
    }

    /// Bytes before the data of a later message.
    pub fn middle_prefix(self) -> usize {
        match self {
            Op::Am { .. } | Op::Tag | Op::TagSync => crate::wire::MIDDLE_PREFIX_LEN,
            Op::Stream => crate::stream::PREFIX_LEN,
        }
    }

    /// Rendezvous exists for it (a stream has no message to announce).
    fn has_rndv(self) -> bool {
        self != Op::Stream
    }

    /// Zero-copy sends exist for it (a synchronous tag message's data waits for the
    /// acknowledgement in a queued copy; streams are copied).
    fn has_zcopy(self) -> bool {
        matches!(self, Op::Am { .. } | Op::Tag)
    }
}

/// A choice the caller forces ([`crate::AmFlags::EAGER`], [`crate::AmFlags::RNDV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Force {
    Auto,
    Eager,
    Rndv,
}

/// What is sent, as far as the choice depends on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Msg {
    pub op: Op,
    /// The application's header (active messages).
    pub header_len: usize,
    /// The payload.
    pub len: usize,
    /// The caller lends the buffer until completion (zero-copy possible).
    pub lent: bool,
    pub force: Force,
}

/// The protocol `m` takes on an endpoint with limits `l`, when the lane has room at once.
/// Rendezvous is chosen only where its announcement fits one transport message (with the
/// largest rkey the rendezvous lane packs): otherwise the send goes eagerly, or fails when
/// rendezvous was forced (the send path checks).
pub(crate) fn select(l: &Limits, m: &Msg) -> Proto {
    let wants_rndv = match m.force {
        Force::Rndv => true,
        Force::Eager => false,
        Force::Auto => m.header_len.saturating_add(m.len) >= l.rndv_thresh,
    };
    if m.op.has_rndv() && wants_rndv && rts_fits(l, m.header_len) {
        return Proto::Rndv;
    }
    let pn = m.op.single_prefix() + m.header_len;
    let total = pn.saturating_add(m.len);
    if m.lent
        && m.op.has_zcopy()
        && m.len > 0
        && m.len >= l.zcopy_thresh
        && total <= l.max_zcopy
        && pn <= l.max_zcopy_hdr
    {
        return Proto::Zcopy;
    }
    if total <= l.max_short {
        return Proto::Short;
    }
    if total <= l.max_bcopy {
        return Proto::Bcopy;
    }
    let first_room = l
        .max_bcopy
        .saturating_sub(m.op.first_prefix() + m.header_len)
        .max(1);
    let per = l.max_bcopy.saturating_sub(m.op.middle_prefix()).max(1);
    Proto::Fragments(1 + m.len.saturating_sub(first_room).div_ceil(per))
}

/// A rendezvous announcement with a `header_len`-byte header fits one transport message.
pub(crate) fn rts_fits(l: &Limits, header_len: usize) -> bool {
    crate::rndv::wire::RTS_LEN + l.rkey_max + header_len <= l.max_bcopy
}

/// The header fits a first fragment with room for data.
pub(crate) fn header_fits(l: &Limits, op: Op, header_len: usize) -> bool {
    op.first_prefix() + header_len < l.max_bcopy
}

/// One line per range of payload sizes with the protocol [`select`] gives it, for `op` with a
/// `header_len`-byte header, the buffer lent or not (`RUCX_PROTO_INFO`, `rucx-info -e`).
pub(crate) fn describe(l: &Limits, api: &str, op: Op, header_len: usize, lent: bool) -> String {
    let at = |len: usize| {
        select(
            l,
            &Msg {
                op,
                header_len,
                len,
                lent,
                force: Force::Auto,
            },
        )
    };
    // Where the choice can change: every limit and threshold, as a payload length.
    let pn = op.single_prefix() + header_len;
    let mut edges: Vec<usize> = [
        l.max_short.checked_sub(pn).map(|v| v + 1),
        l.max_bcopy.checked_sub(pn).map(|v| v + 1),
        l.max_zcopy.checked_sub(pn).map(|v| v + 1),
        Some(l.zcopy_thresh.max(1)),
        l.rndv_thresh.checked_sub(header_len),
        Some(1),
    ]
    .into_iter()
    .flatten()
    .filter(|&e| e > 0 && e < usize::MAX / 2)
    .collect();
    edges.push(0);
    edges.sort_unstable();
    edges.dedup();
    let kind = |p: Proto| match p {
        Proto::Fragments(_) => "eager bcopy, in fragments".to_owned(),
        p => p.to_string(),
    };
    let mut out = String::new();
    let mut i = 0;
    while i < edges.len() {
        let from = edges[i];
        let k = kind(at(from));
        let mut j = i + 1;
        while j < edges.len() && kind(at(edges[j])) == k {
            j += 1;
        }
        let to = edges
            .get(j)
            .map_or("..".to_owned(), |&e| format!("..= {}", e - 1));
        let what = match at(from) {
            Proto::Fragments(_) => format!("{k} of {} B", l.max_bcopy.saturating_sub(op.middle_prefix())),
            _ => k,
        };
        out += &format!("  {api:<14} {from:>9} {to:<13} {what}\n");
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_short: 100,
            max_bcopy: 1000,
            max_zcopy: 4000,
            max_zcopy_hdr: 64,
            zcopy_thresh: 500,
            rndv_thresh: 10_000,
            rkey_max: 32,
        }
    }

    fn msg(op: Op, header_len: usize, len: usize, lent: bool) -> Msg {
        Msg {
            op,
            header_len,
            len,
            lent,
            force: Force::Auto,
        }
    }

    #[test]
    fn every_boundary_of_an_active_message() {
        let l = limits();
        let am = Op::Am { reply: false };
        let pn = am.single_prefix() + 4;
        assert_eq!(select(&l, &msg(am, 4, 100 - pn, false)), Proto::Short);
        assert_eq!(select(&l, &msg(am, 4, 101 - pn, false)), Proto::Bcopy);
        assert_eq!(select(&l, &msg(am, 4, 1000 - pn, false)), Proto::Bcopy);
        assert_eq!(select(&l, &msg(am, 4, 1001 - pn, false)), Proto::Fragments(2));
        // Lent from the zcopy threshold up to the zcopy limit.
        assert_eq!(select(&l, &msg(am, 4, 499, true)), Proto::Bcopy);
        assert_eq!(select(&l, &msg(am, 4, 500, true)), Proto::Zcopy);
        assert_eq!(select(&l, &msg(am, 4, 4000 - pn, true)), Proto::Zcopy);
        assert!(matches!(
            select(&l, &msg(am, 4, 4001 - pn, true)),
            Proto::Fragments(_)
        ));
        // Rendezvous counts the header in the threshold.
        assert_eq!(select(&l, &msg(am, 4, 9995, false)), Proto::Fragments(11));
        assert_eq!(select(&l, &msg(am, 4, 9996, false)), Proto::Rndv);
    }

    #[test]
    fn fragments_count_each_prefix() {
        let l = limits();
        for (op, h) in [
            (Op::Am { reply: true }, 10),
            (Op::Tag, 0),
            (Op::TagSync, 0),
            (Op::Stream, 0),
        ] {
            let first = l.max_bcopy - op.first_prefix() - h;
            let per = l.max_bcopy - op.middle_prefix();
            let base = msg(op, h, 0, false);
            let at = |len| select(&l, &Msg { len, ..base });
            let whole = l.max_bcopy - op.single_prefix() - h;
            assert_eq!(at(whole), Proto::Bcopy, "{op:?}");
            assert_eq!(at(whole + 1), Proto::Fragments(2), "{op:?}");
            assert_eq!(at(first + per), Proto::Fragments(2), "{op:?}");
            assert_eq!(at(first + per + 1), Proto::Fragments(3), "{op:?}");
        }
    }

    #[test]
    fn forced_choices_and_what_each_operation_has() {
        let l = limits();
        let am = Op::Am { reply: false };
        let forced = |op, len, force| {
            select(
                &l,
                &Msg {
                    force,
                    ..msg(op, 0, len, true)
                },
            )
        };
        assert_eq!(forced(am, 3, Force::Rndv), Proto::Rndv);
        assert_eq!(forced(am, 50_000, Force::Eager), Proto::Fragments(52));
        // An announcement that cannot fit: eager, and the send path refuses a forced one.
        let big = l.max_bcopy - crate::rndv::wire::RTS_LEN - l.rkey_max + 1;
        assert!(!rts_fits(&l, big));
        assert_ne!(
            select(
                &l,
                &Msg {
                    force: Force::Rndv,
                    ..msg(am, big, 3, false)
                }
            ),
            Proto::Rndv
        );
        // Streams never use rendezvous or zero-copy, synchronous tag sends no zero-copy.
        assert!(matches!(
            forced(Op::Stream, 50_000, Force::Auto),
            Proto::Fragments(_)
        ));
        assert_eq!(forced(Op::Stream, 600, Force::Auto), Proto::Bcopy);
        assert_eq!(forced(Op::TagSync, 600, Force::Auto), Proto::Bcopy);
        assert_eq!(forced(Op::Tag, 600, Force::Auto), Proto::Zcopy);
        assert_eq!(forced(Op::Tag, 10_000, Force::Auto), Proto::Rndv);
    }

    #[test]
    fn the_description_is_the_selection() {
        let l = limits();
        let d = describe(&l, "am_send", Op::Am { reply: false }, 0, false);
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 4, "{d}");
        assert!(
            lines[0].contains("0 ..= 92") && lines[0].ends_with("eager short"),
            "{d}"
        );
        assert!(
            lines[1].contains("93 ..= 992") && lines[1].ends_with("eager bcopy"),
            "{d}"
        );
        assert!(
            lines[2].contains("993 ..= 9999") && lines[2].contains("fragments of 976 B"),
            "{d}"
        );
        assert!(
            lines[3].contains("10000 ..") && lines[3].ends_with("rendezvous"),
            "{d}"
        );
        let d = describe(&l, "tag_send_owned", Op::Tag, 0, true);
        assert!(d.contains("500 ..= 3992") && d.contains("eager zcopy"), "{d}");
    }
}
