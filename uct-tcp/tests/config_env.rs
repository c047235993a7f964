//! `RUCX_TCP_*` / `RUCX_NET_DEVICES` from the environment, and configuration set in code
//! winning over it. One test function: it changes the process environment, which the other
//! tests (other binaries) must not see. What values mean is checked in `config.rs`, set in
//! code.

use rucx_testkit::{modules, worker};
use uct::*;

fn open_lo(c: &Context, config: &[(&str, &str)]) -> Result<Iface> {
    let (md, _) = c.find_resource("tcp", "lo")?;
    let params = config
        .iter()
        .fold(IfaceParams::new("tcp", "lo"), |p, (k, v)| p.config(k, v));
    Iface::open(&md, &worker(), params)
}

fn ctx_with(name: &str, value: &str) -> Context {
    Context::builder()
        .builtin(uct_tcp::module())
        .plugins(false)
        .config(name, value)
        .build()
}

#[test]
fn configuration_from_the_environment() {
    let c = modules::builtin(uct_tcp::module());
    let mut unnamed = Vec::new();
    // Invalid values are refused with InvalidParam, naming the variable; a valid value set in
    // code for the interface wins over them.
    for (var, val, fix) in [
        ("RUCX_TCP_RX_SEG_SIZE", "4k", "64k"),
        ("RUCX_TCP_TX_SEG_SIZE", "lots", "8k"),
        ("RUCX_TCP_PORT_RANGE", "9-3", "0"),
        ("RUCX_TCP_MAX_IOV", "0", "6"),
        ("RUCX_TCP_KEEPCNT", "many", "auto"),
        ("RUCX_TCP_MAX_POLL", "0", "16"),
        ("RUCX_TCP_TX_COALESCE", "2g", "64k"),
        ("RUCX_TCP_DIRECT_READS", "sometimes", "auto"),
        ("RUCX_TCP_CONGESTION", "re no", "auto"),
        ("RUCX_TCP_CONGESTION", "a_name_too_long_for_the_kernel", "reno"),
    ] {
        std::env::set_var(var, val);
        let e = open_lo(&c, &[]).expect_err(&format!("{var}={val} accepted"));
        assert_eq!(e.status(), Status::InvalidParam, "{var}={val}: {e}");
        if !e.context().is_some_and(|c| c.contains(var)) {
            unnamed.push(format!("{var}={val}: {e:?}"));
        }
        let name = &var["RUCX_".len()..];
        open_lo(&c, &[(name, fix)]).unwrap_or_else(|e| panic!("{name}={fix} set in code: {e}"));
        std::env::remove_var(var);
    }
    // Sizes shape the attributes; code beats the environment, name by name.
    std::env::set_var("RUCX_TCP_TX_SEG_SIZE", "1k");
    std::env::set_var("RUCX_TCP_RX_SEG_SIZE", "2k");
    std::env::set_var("RUCX_TCP_MAX_IOV", "3");
    let i = open_lo(&c, &[]).unwrap();
    assert_eq!(
        (i.attr().am.max_short, i.attr().am.max_zcopy, i.attr().am.max_iov),
        (1024, 2048, 3)
    );
    let i = open_lo(&c, &[("TCP_MAX_IOV", "5"), ("TCP_RX_SEG_SIZE", "4k")]).unwrap();
    assert_eq!(
        (i.attr().am.max_short, i.attr().am.max_zcopy, i.attr().am.max_iov),
        (1024, 4096, 5)
    );
    // The context's settings beat the environment too, and the interface's beat the context's.
    let ci = ctx_with("TCP_MAX_IOV", "4");
    assert_eq!(open_lo(&ci, &[]).unwrap().attr().am.max_iov, 4);
    assert_eq!(
        open_lo(&ci, &[("TCP_MAX_IOV", "2")]).unwrap().attr().am.max_iov,
        2
    );
    drop(i);
    for v in ["RUCX_TCP_TX_SEG_SIZE", "RUCX_TCP_RX_SEG_SIZE", "RUCX_TCP_MAX_IOV"] {
        std::env::remove_var(v);
    }
    // Device selection; the context's setting beats the environment.
    std::env::set_var("RUCX_NET_DEVICES", "^lo");
    assert!(c.find_resource("tcp", "lo").is_err(), "lo excluded");
    assert!(
        ctx_with("NET_DEVICES", "lo").find_resource("tcp", "lo").is_ok(),
        "NET_DEVICES=lo set on the context"
    );
    std::env::set_var("RUCX_NET_DEVICES", "lo");
    assert!(c.find_resource("tcp", "lo").is_ok());
    assert!(
        ctx_with("NET_DEVICES", "^lo").find_resource("tcp", "lo").is_err(),
        "NET_DEVICES=^lo set on the context"
    );
    std::env::remove_var("RUCX_NET_DEVICES");
    assert!(
        unnamed.is_empty(),
        "errors that do not name the variable: {unnamed:#?}"
    );
}
