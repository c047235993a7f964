//! RMA and atomics of an ofi endpoint: `fi_writemsg` / `fi_readmsg` from the caller's I/O
//! vector, and fetching atomics through the slot's send buffer.
#![allow(unsafe_code)]

use super::*;

impl OfiEp {
    pub(super) fn rma(&self, write: bool, iov: &[Iov], raddr: u64, rkey: u64, comp: Comp) -> Result<Outcome> {
        let what = if write { "fi_writemsg" } else { "fi_readmsg" };
        let rk = remote_key(rkey)?;
        self.ready()?;
        if total_len(iov) == 0 {
            // nothing to move (some providers never complete an empty transfer)
            return Ok(Outcome::Done);
        }
        if iov.len() > self.s.rma_iov || total_len(iov) > self.s.max_rma {
            return Err(too_big(what, total_len(iov), self.s.max_rma));
        }
        let target = rk.target(raddr, total_len(iov))?;
        let mut descs = Vec::with_capacity(iov.len());
        self.descs(iov, &mut descs)?;
        let vecs: Vec<ffi::iovec> = iov
            .iter()
            .filter(|v| !v.is_empty())
            .map(|v| iovec_of(v.addr(), v.len()))
            .collect();
        let s = &self.s;
        self.with_slot(
            what,
            |_| self.plain(comp),
            // SAFETY: the host keeps zcopy buffers valid until `comp` completes (the uct zcopy
            // contract); the context is the slot's, reserved until the completion.
            |i| unsafe {
                self.st
                    .tx
                    .rma(write, &vecs, &mut descs, self.st.dest, target, rk.key, s.ctx(i))
            },
        )?;
        Ok(Outcome::InProgress)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn fetch(
        &self,
        size: AtomicSize,
        op: AtomicOp,
        value: u64,
        compare: Option<u64>,
        result: Option<ResultPtr>,
        raddr: u64,
        rkey: u64,
        comp: Comp,
    ) -> Result<()> {
        let caps = match size {
            AtomicSize::U32 => self.s.atomics.a32,
            AtomicSize::U64 => self.s.atomics.a64,
        };
        let ok = if result.is_some() {
            caps.fop_flags.contains(op.flag())
        } else {
            caps.op_flags.contains(op.flag())
        };
        if !ok {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "ofi {}: the provider has no {op:?} atomic of this size",
                    self.s.md.name
                ),
            ));
        }
        let rk = remote_key(rkey)?;
        let wide = size == AtomicSize::U64;
        let target = rk.target(raddr, if wide { 8 } else { 4 })?;
        let dt = if wide { atomic::U64 } else { atomic::U32 };
        let s = &self.s;
        self.with_slot(
            "fi_fetch_atomic",
            |_| Op::Fetch {
                ep: self.st.clone(),
                comp,
                result,
                wide,
            },
            |i| {
                let off = i * s.seg;
                // SAFETY: slot i's buffer is ours until its operation completes; none is in flight.
                let b = unsafe { s.tx_bufs.bytes_mut(off, 24) };
                b[..8].copy_from_slice(&value.to_le_bytes());
                b[8..16].copy_from_slice(&compare.unwrap_or(0).to_le_bytes());
                b[16..].fill(0);
                let base = s.tx_bufs.addr(off);
                let (operand, cmp) = if s.atomic_by_value {
                    (
                        std::ptr::without_provenance(value as usize),
                        compare.map(|c| std::ptr::without_provenance(c as usize)),
                    )
                } else {
                    (
                        base as *const u8,
                        compare.map(|_| base.wrapping_add(8) as *const u8),
                    )
                };
                // SAFETY: operand, compare and result live in slot i's buffer (registered when
                // the provider needs it), reserved with the context until the completion; or
                // operand and compare are the values, for the provider that reads them so.
                unsafe {
                    self.st.tx.fetch_atomic(
                        operand,
                        cmp,
                        base.wrapping_add(16),
                        s.tx_desc(),
                        self.st.dest,
                        target,
                        rk.key,
                        dt,
                        fi_op(op),
                        s.ctx(i),
                    )
                }
            },
        )
    }
}
