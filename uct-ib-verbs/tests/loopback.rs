//! Real-verbs loopback tests for `uct-ib-verbs`: two QPs of one process on one device
//! (RC SEND/RECV, RDMA WRITE/READ, atomics, UD through an AH, SRQ + inline + completion
//! channel, error completions).
//!
//! Every test prints "skipped: no RDMA device" and passes when libibverbs finds no device.
//! On a machine without RDMA hardware run them in the Soft-RoCE VM:
//!   cargo test -p uct-ib --no-run            # build on the host, note the test binary
//!   testbed/rxe-vm.sh -- <target>/debug/deps/verbs_loopback-<hash> --test-threads=1
//! `RUCX_IB_DEVICE=rxe0` picks the device (default: the first one), `RUCX_IB_GID_INDEX=N`
//! the GID (default: `Context::select_gid`, RoCE v2 + IPv4 first).

use std::sync::Arc;
use std::time::{Duration, Instant};
use ucs::Status;
use uct_ib_verbs::*;

const PORT: u8 = 1;
const QKEY: u32 = 0x1111_1111;

struct Fixture {
    ctx: Arc<Context>,
    pd: Arc<ProtectionDomain>,
    port: PortAttr,
    gid: GidEntry,
    dev: DeviceAttr,
}

fn setup() -> Option<Fixture> {
    let list = DeviceList::new().expect("ibv_get_device_list");
    if list.is_empty() {
        println!("skipped: no RDMA device");
        return None;
    }
    let want = std::env::var("RUCX_IB_DEVICE").ok();
    let dev = match &want {
        Some(n) => list.find(n).unwrap_or_else(|| panic!("device {n} not found")),
        None => list.get(0).unwrap(),
    };
    let ctx = dev.open().expect("open device");
    drop(list); // an opened context outlives the device list
    let port = ctx.query_port(PORT).expect("query port");
    assert!(
        port.is_active(),
        "{} port {PORT} is not active: {:?}",
        ctx.name(),
        port.state
    );
    let gid = match std::env::var("RUCX_IB_GID_INDEX")
        .ok()
        .and_then(|v| v.parse::<u8>().ok())
    {
        Some(index) => GidEntry {
            index,
            gid: ctx.query_gid(PORT, index).expect("query gid"),
            gid_type: ctx.gid_type(PORT, index),
        },
        None => ctx.select_gid(PORT).expect("select gid"),
    };
    let dev = ctx.query_device().expect("query device");
    let pd = ProtectionDomain::new(&ctx).expect("alloc pd");
    Some(Fixture {
        ctx,
        pd,
        port,
        gid,
        dev,
    })
}

impl Fixture {
    fn cq(&self) -> Arc<CompletionQueue> {
        CompletionQueue::new(&self.ctx, 64, None, 0).expect("create cq")
    }

    fn ah_attr(&self) -> AhAttr {
        if self.port.is_roce() {
            AhAttr::roce(PORT, self.gid.gid, self.gid.index)
        } else {
            AhAttr::ib(PORT, self.port.lid)
        }
    }

    fn qp(&self, cq: &Arc<CompletionQueue>, t: QpType, srq: Option<&Arc<SharedReceiveQueue>>) -> QueuePair {
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: if srq.is_some() { 0 } else { 16 },
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        QueuePair::new(
            &self.pd,
            cq,
            cq,
            srq,
            &QpInitAttr {
                qp_type: t,
                caps,
                sq_sig_all: false,
            },
        )
        .expect("create qp")
    }

    fn rd_atomic(&self) -> u8 {
        self.dev
            .max_qp_init_rd_atom
            .min(self.dev.max_qp_rd_atom)
            .clamp(1, 16) as u8
    }

    /// RESET -> INIT -> RTR -> RTS towards `remote_qpn`, with UCX's parameters.
    fn connect_rc(&self, qp: &QueuePair, remote_qpn: u32) {
        qp.modify_to_init(&InitParams {
            port_num: PORT,
            pkey_index: 0,
            access: AccessFlags::ALL_REMOTE,
            qkey: 0,
        })
        .expect("to INIT");
        qp.modify_to_rtr(&RtrParams {
            path_mtu: self.port.active_mtu.unwrap_or(Mtu::Mtu1024),
            dest_qp_num: remote_qpn,
            rq_psn: 0,
            max_dest_rd_atomic: self.rd_atomic(),
            min_rnr_timer: rnr_timer_from_secs(1e-3),
            ah: self.ah_attr(),
        })
        .expect("to RTR");
        qp.modify_to_rts(&RtsParams {
            sq_psn: 0,
            timeout: qp_timeout_from_secs(1.0),
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: self.rd_atomic(),
        })
        .expect("to RTS");
        assert_eq!(qp.state().unwrap(), QpState::Rts);
    }

    fn rc_pair(&self, cq: &Arc<CompletionQueue>) -> (QueuePair, QueuePair) {
        let a = self.qp(cq, QpType::Rc, None);
        let b = self.qp(cq, QpType::Rc, None);
        self.connect_rc(&a, b.qp_num());
        self.connect_rc(&b, a.qp_num());
        (a, b)
    }

    fn buf(&self, len: usize) -> RegisteredBuffer {
        RegisteredBuffer::new(&self.pd, len, AccessFlags::ALL_REMOTE).expect("register buffer")
    }
}

#[derive(Debug, Clone, Copy)]
struct Wc {
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    src_qp: u32,
    grh: bool,
}

/// Polls `cq` until `n` completions arrived (10 s limit), into a fixed array.
fn wait(cq: &CompletionQueue, n: usize) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::EMPTY; 8];
    let t0 = Instant::now();
    while out.len() < n {
        let got = cq.poll(&mut wcs).expect("poll");
        for w in &wcs[..got] {
            out.push(Wc {
                wr_id: w.wr_id(),
                status: w.status(),
                opcode: w.opcode(),
                byte_len: w.byte_len(),
                imm: w.imm_data(),
                src_qp: w.src_qp(),
                grh: w.has_grh(),
            });
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "timed out: {} of {n} completions: {out:?}",
            out.len()
        );
    }
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

#[test]
fn device_and_port_attributes() {
    let Some(f) = setup() else { return };
    println!(
        "{}: fw {} atomic_cap {:?} max_qp_wr {} max_sge {} max_qp_rd_atom {} max_cqe {} max_srq_wr {}",
        f.ctx.name(),
        f.dev.fw_ver,
        f.dev.atomic_cap,
        f.dev.max_qp_wr,
        f.dev.max_sge,
        f.dev.max_qp_rd_atom,
        f.dev.max_cqe,
        f.dev.max_srq_wr
    );
    println!(
        "port {PORT}: {:?} link {:?} mtu {:?}/{:?} width {:?}x speed {:?} Gb/s gid[{}] {} {:?}",
        f.port.state,
        f.port.link_layer,
        f.port.active_mtu,
        f.port.max_mtu,
        f.port.width_lanes(),
        f.port.lane_speed_gbps(),
        f.gid.index,
        f.gid.gid,
        f.gid.gid_type
    );
    assert!(f.dev.phys_port_cnt >= 1);
    assert!(f.port.active_mtu.is_some());
    assert!(f.port.gid_tbl_len > 0);
    assert!(!f.gid.gid.is_zero());
    assert_eq!(f.ctx.query_gid(PORT, f.gid.index).unwrap(), f.gid.gid);
    if f.port.is_roce() {
        assert!(f.gid.gid_type.is_some());
    }
    // an out-of-range port is an error, not a crash
    assert!(f.ctx.query_port(200).is_err());
    // what the provider grants when asked for big inline/queues (recorded in docs/ib.md)
    let cq = f.cq();
    for ask in [64u32, 256, 512, 513] {
        let caps = QpCaps {
            max_inline_data: ask,
            ..QpCaps::default()
        };
        match QueuePair::new(
            &f.pd,
            &cq,
            &cq,
            None,
            &QpInitAttr {
                qp_type: QpType::Rc,
                caps,
                sq_sig_all: false,
            },
        ) {
            Ok(qp) => println!("asked inline {ask}: granted {:?}", qp.caps()),
            Err(s) => println!("asked inline {ask}: {s:?}"),
        }
    }
}

#[test]
fn rc_send_recv_with_gather_and_imm() {
    let Some(f) = setup() else { return };
    let cq = f.cq();
    let (a, b) = f.rc_pair(&cq);
    let src = f.buf(8192);
    let dst = f.buf(8192);
    let (p1, p2) = (pattern(1000, 1), pattern(3000, 2));
    src.write(0, &p1).unwrap();
    src.write(4096, &p2).unwrap();
    let rsge = [dst.sge(0, 8192).unwrap()];
    b.post_recv(&RecvRequest {
        wr_id: 77,
        sges: &rsge,
    })
    .unwrap();
    let ssge = [src.sge(0, 1000).unwrap(), src.sge(4096, 3000).unwrap()];
    a.post_send(&SendRequest {
        wr_id: 11,
        sges: &ssge,
        op: SendOp::SendWithImm(0xabcd_0123),
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
    let wcs = wait(&cq, 2);
    let send = wcs.iter().find(|w| w.wr_id == 11).expect("send completion");
    let recv = wcs.iter().find(|w| w.wr_id == 77).expect("recv completion");
    assert_eq!((send.status, send.opcode), (WcStatus::Success, WcOpcode::Send));
    assert_eq!(
        (recv.status, recv.opcode, recv.byte_len),
        (WcStatus::Success, WcOpcode::Recv, 4000)
    );
    assert_eq!(recv.imm, Some(0xabcd_0123));
    let mut got = vec![0u8; 4000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got[..1000], &p1[..]);
    assert_eq!(&got[1000..], &p2[..]);
}

/// A chain of SENDs posted by one `ibv_post_send` (`SendBatch`, rc_verbs' doorbell batching)
/// arrives whole and in order; a chain the provider refuses is reported with how many of its
/// requests were not posted, and the batch is empty either way.
#[test]
fn rc_send_batch_chain_in_order_and_refused_chain() {
    let Some(f) = setup() else { return };
    let cq = f.cq();
    let (a, b) = f.rc_pair(&cq);
    const N: usize = 6;
    const SLOT: usize = 4096;
    let src = f.buf(N * SLOT);
    let dst = f.buf(N * SLOT);
    let lens = [1000u32, 17, 1024, 1025, 300, 4000];
    let mut batch = SendBatch::default();
    for (i, &len) in lens.iter().enumerate() {
        src.write(i * SLOT, &pattern(len as usize, i as u8)).unwrap();
        let rsge = [dst.sge(i * SLOT, SLOT as u32).unwrap()];
        b.post_recv(&RecvRequest {
            wr_id: 100 + i as u64,
            sges: &rsge,
        })
        .unwrap();
        let flags = if i == N - 1 {
            SendFlags::SIGNALED
        } else {
            SendFlags::NONE
        };
        let sge = src.sge(i * SLOT, len).unwrap();
        assert!(batch.push(i as u64, sge, SendOp::Send, flags));
    }
    assert_eq!(batch.len(), N);
    batch.post(&a).expect("post a chain");
    assert!(batch.is_empty());
    let wcs = wait(&cq, N + 1);
    let recvs: Vec<&Wc> = wcs.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
    assert_eq!(recvs.len(), N);
    for (i, w) in recvs.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (100 + i as u64, WcStatus::Success, lens[i]),
            "receive {i}: in order, whole"
        );
        let mut got = vec![0u8; lens[i] as usize];
        dst.read(i * SLOT, &mut got).unwrap();
        assert_eq!(got, pattern(lens[i] as usize, i as u8), "message {i}");
    }
    let send = wcs
        .iter()
        .find(|w| w.opcode == WcOpcode::Send)
        .expect("send completion");
    assert_eq!((send.wr_id, send.status), (N as u64 - 1, WcStatus::Success));

    // a QP still in RESET refuses the chain
    let reset = f.qp(&cq, QpType::Rc, None);
    for i in 0..3 {
        assert!(batch.push(i, src.sge(0, 8).unwrap(), SendOp::Send, SendFlags::NONE));
    }
    let err = batch.post(&reset).expect_err("a QP in RESET refuses sends");
    assert!(err.status.is_err(), "{err:?}");
    assert!((1..=3).contains(&err.unposted), "{err:?}");
    assert!(batch.is_empty());
}

#[test]
fn rc_rdma_write_and_read() {
    let Some(f) = setup() else { return };
    let cq = f.cq();
    let (a, b) = f.rc_pair(&cq);
    let local = f.buf(16384);
    let remote = f.buf(16384);
    let data = pattern(10000, 3);
    local.write(0, &data).unwrap();
    let sge = [local.sge(0, 10000).unwrap()];
    a.post_send(&SendRequest {
        wr_id: 1,
        sges: &sge,
        op: SendOp::RdmaWrite {
            remote_addr: remote.addr() + 100,
            rkey: remote.rkey(),
        },
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
    let w = wait(&cq, 1)[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let mut got = vec![0u8; 10000];
    remote.read(100, &mut got).unwrap();
    assert_eq!(got, data);

    // READ it back from the other side into a different offset of `local`
    let sge = [local.sge(12000, 4000).unwrap()];
    b.post_send(&SendRequest {
        wr_id: 2,
        sges: &sge,
        op: SendOp::RdmaRead {
            remote_addr: local.addr(),
            rkey: local.rkey(),
        },
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
    let w = wait(&cq, 1)[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (2, WcStatus::Success, WcOpcode::RdmaRead)
    );
    let mut got = vec![0u8; 4000];
    local.read(12000, &mut got).unwrap();
    assert_eq!(got, &data[..4000]);
}

#[test]
fn rc_atomic_fetch_add_and_compare_swap() {
    let Some(f) = setup() else { return };
    if f.dev.atomic_cap == AtomicCap::None {
        println!("skipped: {} has no atomics", f.ctx.name());
        return;
    }
    let cq = f.cq();
    let (a, _b) = f.rc_pair(&cq);
    let remote = f.buf(4096);
    let result = f.buf(4096);
    remote.write_u64(64, 5).unwrap();
    let res = [result.sge(0, 8).unwrap()];
    let raddr = remote.addr() + 64;
    let post = |wr_id, op| {
        a.post_send(&SendRequest {
            wr_id,
            sges: &res,
            op,
            flags: SendFlags::SIGNALED,
            ud: None,
        })
        .unwrap();
        let w = wait(&cq, 1)[0];
        assert_eq!((w.wr_id, w.status), (wr_id, WcStatus::Success), "{op:?}");
        w.opcode
    };
    assert_eq!(
        post(
            1,
            SendOp::FetchAdd {
                remote_addr: raddr,
                rkey: remote.rkey(),
                add: 10
            }
        ),
        WcOpcode::FetchAdd
    );
    assert_eq!(result.read_u64(0).unwrap(), 5, "fetch-add returns the old value");
    assert_eq!(remote.read_u64(64).unwrap(), 15);

    let cs = |compare, swap| SendOp::CompareSwap {
        remote_addr: raddr,
        rkey: remote.rkey(),
        compare,
        swap,
    };
    assert_eq!(post(2, cs(15, 99)), WcOpcode::CompSwap);
    assert_eq!(result.read_u64(0).unwrap(), 15);
    assert_eq!(remote.read_u64(64).unwrap(), 99, "equal compare swaps");
    post(3, cs(1234, 7));
    assert_eq!(result.read_u64(0).unwrap(), 99);
    assert_eq!(
        remote.read_u64(64).unwrap(),
        99,
        "unequal compare leaves memory alone"
    );
}

#[test]
fn ud_send_through_address_handle() {
    let Some(f) = setup() else { return };
    let cq = f.cq();
    let u1 = f.qp(&cq, QpType::Ud, None);
    let u2 = f.qp(&cq, QpType::Ud, None);
    for q in [&u1, &u2] {
        q.modify_to_init(&InitParams {
            port_num: PORT,
            pkey_index: 0,
            access: AccessFlags::NONE,
            qkey: QKEY,
        })
        .unwrap();
        q.modify_ud_to_rts(0).unwrap();
        assert_eq!(q.state().unwrap(), QpState::Rts);
    }
    // a connected-QP transition on a UD QP is refused up front
    assert!(u1
        .modify_to_rts(&RtsParams {
            sq_psn: 0,
            timeout: 1,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0
        })
        .is_err());
    let ah = AddressHandle::new(&f.pd, &f.ah_attr()).expect("create ah");
    let buf = f.buf(8192);
    let msg = pattern(512, 9);
    buf.write(0, &msg).unwrap();
    let rsge = [buf.sge(4096, (GRH_LEN + 1024) as u32).unwrap()];
    u2.post_recv(&RecvRequest {
        wr_id: 5,
        sges: &rsge,
    })
    .unwrap();
    let ssge = [buf.sge(0, 512).unwrap()];
    let dest = UdDest {
        ah: &ah,
        remote_qpn: u2.qp_num(),
        remote_qkey: QKEY,
    };
    // a UD send without a destination is refused before reaching the provider
    assert!(u1
        .post_send(&SendRequest {
            wr_id: 6,
            sges: &ssge,
            op: SendOp::Send,
            flags: SendFlags::SIGNALED,
            ud: None
        })
        .is_err());
    u1.post_send(&SendRequest {
        wr_id: 6,
        sges: &ssge,
        op: SendOp::Send,
        flags: SendFlags::SIGNALED,
        ud: Some(dest),
    })
    .unwrap();
    let wcs = wait(&cq, 2);
    let recv = wcs.iter().find(|w| w.wr_id == 5).expect("recv completion");
    assert_eq!(
        wcs.iter().find(|w| w.wr_id == 6).unwrap().status,
        WcStatus::Success
    );
    assert_eq!(recv.status, WcStatus::Success);
    assert_eq!(recv.byte_len as usize, GRH_LEN + 512);
    assert_eq!(recv.src_qp, u1.qp_num());
    assert!(recv.grh);
    let mut got = vec![0u8; 512];
    buf.read(4096 + GRH_LEN, &mut got).unwrap();
    assert_eq!(got, msg);

    // the UD inline post of ud_verbs' packets: the bytes arrive, the slice is free at once
    u2.post_recv(&RecvRequest {
        wr_id: 7,
        sges: &rsge,
    })
    .unwrap();
    let mut small = pattern(20, 3);
    u1.post_ud_send_inline(8, &small, SendFlags::SIGNALED, dest)
        .unwrap();
    small.fill(0); // inline: the provider copied it during the call
    let wcs = wait(&cq, 2);
    let recv = wcs.iter().find(|w| w.wr_id == 7).expect("inline recv completion");
    assert_eq!(recv.status, WcStatus::Success);
    assert_eq!(recv.byte_len as usize, GRH_LEN + 20);
    let mut got = vec![0u8; 20];
    buf.read(4096 + GRH_LEN, &mut got).unwrap();
    assert_eq!(got, pattern(20, 3));
    // refused up front: more than the QP's inline limit, and a connected QP
    let too_big = vec![0u8; u1.caps().max_inline_data as usize + 1];
    assert_eq!(
        u1.post_ud_send_inline(9, &too_big, SendFlags::SIGNALED, dest)
            .err()
            .map(|e| e.status()),
        Some(Status::ExceedsLimit)
    );
    let rc = f.qp(&cq, QpType::Rc, None);
    assert_eq!(
        rc.post_ud_send_inline(10, &small, SendFlags::SIGNALED, dest)
            .err()
            .map(|e| e.status()),
        Some(Status::InvalidParam)
    );
}

#[test]
fn srq_inline_send_and_completion_channel() {
    let Some(f) = setup() else { return };
    let ch = CompletionChannel::new(&f.ctx).unwrap();
    ch.set_nonblocking(true).unwrap();
    let tx_cq = f.cq();
    let rx_cq = CompletionQueue::new(&f.ctx, 64, Some(&ch), 0).unwrap();
    assert!(
        tx_cq.req_notify(false).is_err(),
        "a CQ without channel cannot be armed"
    );
    let srq = SharedReceiveQueue::new(&f.pd, 64, 1, 0).unwrap();
    let a = QueuePair::new(
        &f.pd,
        &tx_cq,
        &tx_cq,
        None,
        &QpInitAttr {
            qp_type: QpType::Rc,
            caps: QpCaps {
                max_recv_wr: 4,
                ..QpCaps::default()
            },
            sq_sig_all: false,
        },
    )
    .unwrap();
    let b = QueuePair::new(
        &f.pd,
        &tx_cq,
        &rx_cq,
        Some(&srq),
        &QpInitAttr {
            qp_type: QpType::Rc,
            caps: QpCaps::default(),
            sq_sig_all: false,
        },
    )
    .unwrap();
    f.connect_rc(&a, b.qp_num());
    f.connect_rc(&b, a.qp_num());
    assert!(
        b.post_recv(&RecvRequest { wr_id: 0, sges: &[] }).is_err(),
        "SRQ QPs take receives on the SRQ"
    );

    let rx = f.buf(16 * 256);
    let sges: Vec<[Sge; 1]> = (0..16).map(|i| [rx.sge(i * 256, 256).unwrap()]).collect();
    let reqs: Vec<RecvRequest> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvRequest {
            wr_id: 100 + i as u64,
            sges: s,
        })
        .collect();
    srq.post_recv_batch(&reqs).unwrap();

    assert_eq!(ch.get_event().unwrap(), None, "nothing armed, nothing pending");
    rx_cq.req_notify(false).unwrap();
    let max_inline = a.caps().max_inline_data as usize;
    assert!(max_inline >= 8, "granted inline {max_inline}");
    let hdr = [0xa5u8; 8];
    let payload = pattern(max_inline - 8, 4);
    a.post_send_inline(
        1,
        &[&hdr, &payload],
        SendOp::Send,
        SendFlags::SIGNALED | SendFlags::SOLICITED,
        None,
    )
    .unwrap();
    let too_big = vec![0u8; max_inline + 1];
    assert!(a
        .post_send_inline(2, &[&too_big], SendOp::Send, SendFlags::SIGNALED, None)
        .is_err());

    let t0 = Instant::now();
    let id = loop {
        if let Some(id) = ch.get_event().unwrap() {
            break id;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no completion event");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(id, rx_cq.id());
    let recv = wait(&rx_cq, 1)[0];
    assert_eq!(
        (recv.wr_id, recv.status, recv.byte_len as usize),
        (100, WcStatus::Success, max_inline)
    );
    let mut got = vec![0u8; max_inline];
    rx.read(0, &mut got).unwrap();
    assert_eq!(&got[..8], &hdr);
    assert_eq!(&got[8..], &payload[..]);
    assert_eq!(wait(&tx_cq, 1)[0].wr_id, 1);
}

#[test]
fn bad_rkey_fails_the_qp_and_flushes() {
    let Some(f) = setup() else { return };
    let cq = f.cq();
    let (a, b) = f.rc_pair(&cq);
    let local = f.buf(4096);
    let remote = f.buf(4096);
    let sge = [local.sge(0, 64).unwrap()];
    let bad = SendOp::RdmaWrite {
        remote_addr: remote.addr(),
        rkey: remote.rkey() ^ 0x5a5a_0000,
    };
    a.post_send(&SendRequest {
        wr_id: 1,
        sges: &sge,
        op: bad,
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
    let w = wait(&cq, 1)[0];
    assert_eq!(w.wr_id, 1);
    assert_ne!(w.status, WcStatus::Success);
    println!(
        "bad rkey completion: {:?} -> {:?}",
        w.status,
        w.status.to_status()
    );
    // the requester QP is in error now; later WRs are flushed
    let ok = SendOp::RdmaWrite {
        remote_addr: remote.addr(),
        rkey: remote.rkey(),
    };
    match a.post_send(&SendRequest {
        wr_id: 2,
        sges: &sge,
        op: ok,
        flags: SendFlags::SIGNALED,
        ud: None,
    }) {
        Ok(()) => assert_eq!(wait(&cq, 1)[0].status, WcStatus::WrFlushErr),
        Err(s) => println!("post on an errored QP refused: {s:?}"),
    }
    assert_eq!(a.state().unwrap(), QpState::Error);
    // posted receives on a QP moved to ERROR come back flushed (how transports cancel)
    let rsge = [local.sge(1024, 64).unwrap()];
    b.post_recv(&RecvRequest {
        wr_id: 9,
        sges: &rsge,
    })
    .unwrap();
    b.modify_to_error().unwrap();
    let w = wait(&cq, 1)[0];
    assert_eq!((w.wr_id, w.status), (9, WcStatus::WrFlushErr));
    assert_eq!(w.status.to_status(), ucs::Status::Canceled);
}

#[test]
fn parents_outlive_children_whatever_the_drop_order() {
    let Some(f) = setup() else { return };
    let cq = f.cq();
    let qp = f.qp(&cq, QpType::Rc, None);
    let mr = f.buf(4096);
    let Fixture { ctx, pd, .. } = f;
    // drop every handle to the parents first: the children keep them alive
    drop(cq);
    drop(pd);
    drop(ctx);
    assert!(qp.qp_num() != 0);
    qp.modify_to_init(&InitParams {
        port_num: PORT,
        pkey_index: 0,
        access: AccessFlags::ALL_REMOTE,
        qkey: 0,
    })
    .unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);
    drop(qp);
    drop(mr);
}
