//! Opening an ofi interface: queue and buffer sizes from the configuration and the provider's
//! limits, the CQ (with an fd wait object when the caller will sleep), the RDM endpoint and AV
//! or the connected device's passive side, memory registration, and the first receives.
#![allow(unsafe_code)]

use super::*;

/// A short hash naming the fabric (provider and fabric name): peers on another fabric are
/// unreachable.
fn fabric_hash(prov: &str, fabric: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in prov.bytes().chain([0]).chain(fabric.bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h
}

/// This host, for shared-memory providers.
fn host_id() -> u64 {
    let id = std::fs::read_to_string("/etc/machine-id")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .unwrap_or_default();
    fabric_hash(id.trim(), "")
}

fn ioerr(dev: &str, what: &str, e: i32) -> Error {
    let msg = format!("ofi {dev}: {what} failed: {}", ffi::strerror(e as i64));
    ucs::error!("{msg}");
    Error::new(Status::IoError, msg)
}

impl OfiIface {
    pub(super) fn open(md: Rc<MdInner>, params: IfaceOpenParams) -> Result<OfiIface> {
        let cfg = OFI_CONFIG.with(&params.config);
        let info = md.info.get();
        let dev = md.name.clone();
        let max_msg = info.max_msg_size().max(64);
        let seg = (cfg.get_memunits("SEG_SIZE")?.bytes_or(8192) as usize).clamp(64, max_msg);
        let tx_size = if info.tx_size() == 0 {
            usize::MAX
        } else {
            info.tx_size()
        };
        let rx_size = if info.rx_size() == 0 {
            usize::MAX
        } else {
            info.rx_size()
        };
        let tx_len = (cfg.get_uint("TX_QUEUE_LEN")? as usize)
            .clamp(1, tx_size.max(1))
            .min(1 << 20);
        let rx_len = (cfg.get_uint("RX_QUEUE_LEN")? as usize)
            .clamp(1, rx_size.max(1))
            .min(1 << 20);
        let rx_batch = (cfg.get_uint("RX_MAX_BATCH")? as usize).clamp(1, (rx_len / 2).max(1));
        let want_fd = params.wakeup || cfg.get_bool("EVENT_FD")?;
        let peer_timeout = cfg
            .get_time("PEER_TIMEOUT")?
            .duration_or(std::time::Duration::from_secs(10));

        let cq_size = (tx_len + rx_len).next_power_of_two();
        let cq = match want_fd.then(|| Cq::open(&md.domain, cq_size, true)) {
            Some(Ok(cq)) => cq,
            _ => Cq::open(&md.domain, cq_size, false).map_err(|e| ioerr(&dev, "fi_cq_open", e))?,
        };
        let wait_fd = if want_fd { cq.wait_fd() } else { None };
        let (rx, av, msg, name) = if info.is_msg() {
            let (msg, srx, name) = Msg::open(&md, &cq, params.worker)?;
            (srx, None, Some(msg), name)
        } else {
            let av = Av::open(&md.domain, 64).map_err(|e| ioerr(&dev, "fi_av_open", e))?;
            let ep =
                Endpoint::open(&md.domain, &md.info, &cq, &av).map_err(|e| ioerr(&dev, "fi_endpoint", e))?;
            let name = ep.name().map_err(|e| ioerr(&dev, "fi_getname", e))?;
            (Rc::new(ep), Some(av), None, name)
        };
        // connected endpoints exist only once connected: ask the domain
        let valid = |kind, dt, op| {
            if msg.is_some() {
                md.domain.atomic_valid(kind, dt, op)
            } else {
                rx.atomic_valid(kind, dt, op)
            }
        };

        let tx_bufs = Buffers::new(tx_len * seg);
        let rx_bufs = Buffers::new(rx_len * seg);
        let contexts = Buffers::new((tx_len + rx_len) * CTX_LEN);
        let (tx_mr, rx_mr) = if md.mr_local() {
            // SAFETY: the buffers are fields of Shared declared after the regions, so they are
            // dropped (freed) after the regions are closed.
            unsafe {
                (
                    Some(md.register(tx_bufs.addr(0), tx_bufs.len())?),
                    Some(md.register(rx_bufs.addr(0), rx_bufs.len())?),
                )
            }
        } else {
            (None, None)
        };

        // shm does not refuse an access through the key of a deregistered region (a get reads
        // the released memory; a put or an atomic never completes), so it offers neither RMA
        // nor atomics: a remote access must never touch memory its owner released.
        let keys_checked = info.prov_name() != "shm";
        let rma = info.caps() & bits::RMA != 0 && keys_checked;
        let mut atomics = AtomicSupport::default();
        if info.caps() & bits::ATOMIC != 0 && keys_checked {
            for (dt, caps) in [(atomic::U32, &mut atomics.a32), (atomic::U64, &mut atomics.a64)] {
                for op in [AtomicOp::Add, AtomicOp::And, AtomicOp::Or, AtomicOp::Xor] {
                    // posts go out as fetching atomics (so flush can wait for them)
                    if valid(AtomicKind::Fetch, dt, fi_op(op)) {
                        caps.op_flags |= op.flag();
                        caps.fop_flags |= op.flag();
                    }
                }
                if valid(AtomicKind::Fetch, dt, atomic::WRITE) {
                    caps.fop_flags |= AtomicOp::Swap.flag();
                }
                if valid(AtomicKind::Compare, dt, atomic::CSWAP) {
                    caps.fop_flags |= AtomicOp::Cswap.flag();
                }
            }
        }
        let inject = info.inject_size().min(seg);
        let max_short = if inject >= wire::HDR_LEN + 8 {
            inject - wire::HDR_LEN
        } else {
            0
        };
        let mut dev_addr = [0u8; 16];
        dev_addr[..8].copy_from_slice(&fabric_hash(&info.prov_name(), &info.fabric_name()).to_le_bytes());
        // Shared memory and loopback fabrics reach only this host: every host has its own
        // 127.0.0.1 and ::1, so the fabric name alone would make two hosts look joined.
        let fabric = info.fabric_name();
        if info.prov_name() == "shm" || fabric.starts_with("127.") || fabric == "::1/128" {
            dev_addr[8..].copy_from_slice(&host_id().to_le_bytes());
        }
        let atomic_by_value = info.is_msg() && info.prov_name() == "verbs" && ffi::lib_version() <= (1, 17);
        if info.is_msg() && info.prov_name() == "verbs" && !atomic_by_value {
            // whether a later libfabric reads the operands through the pointers is unverified
            atomics = AtomicSupport::default();
        }
        let s = Rc::new(Shared {
            msg,
            rx,
            cq,
            av,
            peers: RefCell::new(std::collections::HashMap::new()),
            tx_mr,
            rx_mr,
            md: md.clone(),
            tx_bufs,
            rx_bufs,
            contexts,
            ops: RefCell::new((0..tx_len).map(|_| Op::Free).collect()),
            free: RefCell::new((0..tx_len as u32).rev().collect()),
            seg,
            tx_len,
            rx_len,
            rx_done: RefCell::new(Vec::with_capacity(rx_len)),
            rx_batch,
            max_short,
            max_rma: info.max_msg_size(),
            am_iov: info.iov_limit().saturating_sub(1).clamp(1, MAX_IOV),
            rma_iov: info.iov_limit().min(MAX_IOV),
            rma,
            atomics,
            atomic_by_value,
            name,
            dev_addr,
            am: params.am,
            err_handler: params.err_handler,
            arbiter: RefCell::new(VecDeque::new()),
            dispatching: Cell::new(0),
            outstanding: Cell::new(0),
            flush_waiters: RefCell::new(Vec::new()),
            short_buf: RefCell::new(vec![0u8; max_short + wire::HDR_LEN]),
            wait_fd,
            warned_cq: Cell::new(false),
            stalled: RefCell::new(Vec::new()),
            peer_timeout,
            ticks: Cell::new(0),
        });
        for j in 0..rx_len {
            s.post_recv(j).map_err(|e| ioerr(&dev, "fi_recv", e))?;
        }
        if let Some(m) = &s.msg {
            m.watch(&s);
        }
        Ok(OfiIface { s })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_hash_separates_providers_and_fabrics() {
        assert_ne!(
            fabric_hash("tcp;ofi_rxm", "127.0.0.0/8"),
            fabric_hash("shm", "shm")
        );
        assert_ne!(fabric_hash("ab", "c"), fabric_hash("a", "bc"));
        assert_eq!(fabric_hash("shm", "shm"), fabric_hash("shm", "shm"));
    }
}
