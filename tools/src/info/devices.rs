//! `-d`: every component, memory domain, transport and device with its attributes, in the
//! layout of `ucx_info -d`. Interface attributes need an open interface, so each resource is
//! opened once on a private worker (as `ucx_info` does).

use std::fmt::Write as _;

use uct::{
    AsyncMode, AtomicCaps, AtomicOps, Context, Iface, IfaceAttr, IfaceFlags, IfaceParams, Md, OpCaps,
    ProgressFlags, TlResource, Worker,
};

use super::units::{linear_nsec, mbps, nsec, size};

/// A labelled line: `#` + label right-aligned to UCX's column + `: ` + value.
fn line(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "#{label:>21}: {value}");
}

/// Writes the report; `tl` keeps only that transport (`-t`).
/// Writes the report; `Err` names the transport `tl` when no module offers it (and what does).
/// A limit as `ucx_info` prints it (`<= 8K`), or `unlimited`.
fn upto(n: usize) -> String {
    match size(n) {
        s if s == "unlimited" => s,
        s => format!("<= {s}"),
    }
}

pub fn report(ctx: &Context, tl: Option<&str>, out: &mut String) -> Result<(), String> {
    if let Some(t) = tl {
        let all: Vec<&str> = ctx
            .components()
            .iter()
            .flat_map(|c| c.transport_names())
            .collect();
        if !all.contains(&t) {
            return Err(format!(
                "no transport {t:?} in the modules loaded (transports: {}; modules: rucx-info -m)",
                if all.is_empty() {
                    "none".to_string()
                } else {
                    all.join(", ")
                }
            ));
        }
    }
    let worker = match Worker::with_async_mode(AsyncMode::Poll) {
        Ok(w) => Some(w),
        Err(e) => {
            let _ = writeln!(
                out,
                "# < cannot create a worker: {e}; interface attributes omitted >"
            );
            None
        }
    };
    if ctx.components().is_empty() {
        let _ = writeln!(
            out,
            "# < no components: every module was denied or failed, see rucx-info -m >"
        );
    }
    for comp in ctx.components() {
        if tl.is_some_and(|t| !comp.transport_names().contains(&t)) {
            continue;
        }
        let md_names = match comp.md_resources() {
            Ok(n) => n,
            Err(e) => {
                let _ = writeln!(
                    out,
                    "#\n# Component: {}\n#   < cannot list memory domains: {e} >",
                    comp.name()
                );
                continue;
            }
        };
        if md_names.is_empty() {
            let _ = writeln!(
                out,
                "#\n# Component: {} (module {})\n#   < no memory domains >",
                comp.name(),
                comp.module()
            );
        }
        for name in md_names {
            let _ = writeln!(out, "#\n# Memory domain: {name}");
            let _ = writeln!(out, "#     Component: {} (module {})", comp.name(), comp.module());
            match comp.md_open(&name) {
                Ok(md) => md_report(&md, worker.as_ref(), tl, out),
                Err(e) => {
                    let _ = writeln!(out, "#   < failed to open memory domain: {e} >");
                }
            }
        }
    }
    Ok(())
}

fn md_report(md: &Md, worker: Option<&Worker>, tl: Option<&str>, out: &mut String) {
    let a = md.attr();
    if a.flags.contains(uct::MdFlags::REG) {
        line(
            out,
            "register",
            format_args!("{}, cost: {}", size(a.max_reg), linear_nsec(a.reg_cost, "N")),
        );
    } else {
        line(out, "register", "not supported");
    }
    line(out, "remote key", format_args!("{} bytes", a.rkey_packed_size));
    line(out, "md flags", format_args!("{:?}", a.flags));
    let resources = match md.tl_resources() {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(out, "#   < cannot query transports: {e} >");
            return;
        }
    };
    let resources: Vec<&TlResource> = resources
        .iter()
        .filter(|r| tl.is_none_or(|t| r.tl_name.as_str() == t))
        .collect();
    if resources.is_empty() {
        let _ = writeln!(out, "#   < no supported devices found >");
    }
    for r in resources {
        let _ = writeln!(out, "#\n#      Transport: {}", r.tl_name);
        let _ = writeln!(out, "#         Device: {}", r.dev_name);
        let _ = writeln!(out, "#           Type: {}", r.device_type().name());
        let Some(worker) = worker else { continue };
        // Only the attributes are read: no progress (as ucx_info).
        let params = IfaceParams::new(r.tl_name.as_str(), r.dev_name.as_str()).progress(ProgressFlags::EMPTY);
        match Iface::open(md, worker, params) {
            Ok(iface) => iface_report(iface.attr(), out),
            Err(e) => {
                let _ = writeln!(out, "#   < failed to open interface: {e} >");
            }
        }
    }
}

/// `put_zcopy`-style limit lines for one operation family.
fn op_lines(
    out: &mut String,
    op: &str,
    caps: &OpCaps,
    flags: IfaceFlags,
    [short, bcopy, zcopy]: [IfaceFlags; 3],
) {
    if flags.contains(short) {
        line(
            out,
            &format!("{op}_short"),
            format_args!("{}", upto(caps.max_short)),
        );
    }
    if flags.contains(bcopy) {
        line(
            out,
            &format!("{op}_bcopy"),
            format_args!("{}", upto(caps.max_bcopy)),
        );
    }
    if flags.contains(zcopy) {
        let min = if caps.min_zcopy > 0 {
            format!("{} .. ", size(caps.min_zcopy))
        } else {
            String::new()
        };
        line(
            out,
            &format!("{op}_zcopy"),
            format_args!("{min}{}, up to {} iov", upto(caps.max_zcopy), caps.max_iov),
        );
    }
}

const ATOMIC_NAMES: [(&str, &str, AtomicOps); 6] = [
    ("atomic_add", "atomic_fadd", AtomicOps::ADD),
    ("atomic_and", "atomic_fand", AtomicOps::AND),
    ("atomic_or", "atomic_for", AtomicOps::OR),
    ("atomic_xor", "atomic_fxor", AtomicOps::XOR),
    ("", "atomic_swap", AtomicOps::SWAP),
    ("", "atomic_cswap", AtomicOps::CSWAP),
];

/// `atomic_add: 32, 64 bit`-style lines.
fn atomic_lines(out: &mut String, a32: &AtomicCaps, a64: &AtomicCaps) {
    let widths = |f32: AtomicOps, f64: AtomicOps, op: AtomicOps| -> Option<String> {
        let w: Vec<&str> = [(f32, "32"), (f64, "64")]
            .iter()
            .filter(|(f, _)| f.contains(op))
            .map(|(_, w)| *w)
            .collect();
        (!w.is_empty()).then(|| format!("{} bit", w.join(", ")))
    };
    for (post, fetch, op) in ATOMIC_NAMES {
        if !post.is_empty() {
            if let Some(w) = widths(a32.op_flags, a64.op_flags, op) {
                line(out, post, w);
            }
        }
        if let Some(w) = widths(a32.fop_flags, a64.fop_flags, op) {
            line(out, fetch, w);
        }
    }
}

fn names(pairs: &[(IfaceFlags, &str)], flags: IfaceFlags) -> String {
    let v: Vec<&str> = pairs
        .iter()
        .filter(|(f, _)| flags.contains(*f))
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// The attributes of one interface.
pub fn iface_report(a: &IfaceAttr, out: &mut String) {
    let f = a.flags;
    let _ = writeln!(out, "#\n#      capabilities:");
    line(
        out,
        "bandwidth",
        format_args!(
            "{}/ppn + {} MB/sec",
            mbps(a.bandwidth.shared),
            mbps(a.bandwidth.dedicated)
        ),
    );
    line(out, "latency", linear_nsec(a.latency, "N(eps)"));
    line(out, "overhead", format_args!("{} nsec", nsec(a.overhead)));
    use IfaceFlags as F;
    op_lines(out, "put", &a.put, f, [F::PUT_SHORT, F::PUT_BCOPY, F::PUT_ZCOPY]);
    op_lines(out, "get", &a.get, f, [F::GET_SHORT, F::GET_BCOPY, F::GET_ZCOPY]);
    op_lines(out, "am", &a.am, f, [F::AM_SHORT, F::AM_BCOPY, F::AM_ZCOPY]);
    if f.contains(F::AM_ZCOPY) {
        line(out, "am header", format_args!("{}", upto(a.am.max_hdr)));
    }
    atomic_lines(out, &a.atomic32, &a.atomic64);
    let conn = names(
        &[
            (F::CONNECT_TO_EP, "to ep"),
            (F::CONNECT_TO_IFACE, "to iface"),
            (F::CONNECT_TO_SOCKADDR, "to sockaddr"),
        ],
        f,
    );
    line(out, "connection", conn);
    line(out, "device priority", a.priority);
    if a.max_num_eps > 0 {
        line(out, "max eps", size(a.max_num_eps));
    }
    line(out, "device address", format_args!("{} bytes", a.device_addr_len));
    if f.contains(F::CONNECT_TO_IFACE) {
        line(out, "iface address", format_args!("{} bytes", a.iface_addr_len));
    }
    if f.contains(F::CONNECT_TO_EP) {
        line(out, "ep address", format_args!("{} bytes", a.ep_addr_len));
    }
    let errh = names(
        &[
            (F::ERRHANDLE_PEER_FAILURE, "peer failure"),
            (F::EP_CHECK, "ep_check"),
            (F::EP_KEEPALIVE, "keepalive"),
            (F::ERRHANDLE_SHORT_BUF, "short buf"),
            (F::ERRHANDLE_BCOPY_BUF, "bcopy buf"),
            (F::ERRHANDLE_ZCOPY_BUF, "zcopy buf"),
            (F::ERRHANDLE_AM_ID, "am id"),
            (F::ERRHANDLE_REMOTE_MEM, "remote mem"),
            (F::ERRHANDLE_BCOPY_LEN, "bcopy len"),
        ],
        f,
    );
    line(out, "error handling", errh);
    line(out, "flags", format_args!("{f:?}"));
    line(out, "event flags", format_args!("{:?}", a.event_flags));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iface_lines_follow_the_flags() {
        let a = IfaceAttr {
            flags: IfaceFlags::AM_SHORT
                | IfaceFlags::AM_ZCOPY
                | IfaceFlags::CONNECT_TO_EP
                | IfaceFlags::EP_CHECK,
            am: OpCaps {
                max_short: 8192,
                max_zcopy: 65536,
                max_hdr: 8037,
                max_iov: 6,
                ..Default::default()
            },
            atomic64: AtomicCaps {
                op_flags: AtomicOps::ADD,
                fop_flags: AtomicOps::ADD | AtomicOps::CSWAP,
            },
            latency: uct::LinearFunc { c: 10.96e-6, m: 0.0 },
            ep_addr_len: 10,
            ..Default::default()
        };
        let mut s = String::new();
        iface_report(&a, &mut s);
        assert!(s.contains("#             am_short: <= 8K\n"), "{s}");
        assert!(s.contains("am_zcopy: <= 64K, up to 6 iov"), "{s}");
        assert!(s.contains("am header: <= 8037"), "{s}");
        assert!(!s.contains("am_bcopy"), "{s}");
        assert!(
            s.contains("atomic_add: 64 bit") && s.contains("atomic_cswap: 64 bit"),
            "{s}"
        );
        assert!(!s.contains("atomic_swap"), "{s}");
        assert!(
            s.contains("connection: to ep\n") && s.contains("ep address: 10 bytes"),
            "{s}"
        );
        assert!(!s.contains("iface address"), "{s}");
        assert!(
            s.contains("latency: 10960 nsec") && s.contains("error handling: ep_check\n"),
            "{s}"
        );
    }
}
