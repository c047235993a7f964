//! The UCP conformance suite: every test once per target (a transport chosen with `RUCX_TLS`
//! set in code). Names read `<module>::<test>::<target>`; `cargo test --test ucp tcp` runs the
//! tcp target. The verbs targets skip on a host without RDMA (they run in the soft-RoCE VM).

mod am;
mod am_handler;
mod atomic;
mod copies;
mod datatype;
mod features;
mod harness;
mod hostile;
mod keepalive;
mod lent;
mod lifecycle;
mod rma;
mod rndv;
mod selection;
mod sockaddr;
mod sockaddr_queued;
mod stale_keys;
mod stream;
mod tag;
mod wakeup;
mod wireup;
mod wrong_worker;
