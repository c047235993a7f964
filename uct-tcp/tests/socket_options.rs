//! Socket options of real connections on `lo`, read back from the kernel with `ss`
//! (iproute2, installed by scripts/install-deps.sh): with `RUCX_TCP_CONGESTION=auto` both ends
//! of a loopback connection use reno, whatever the system's default is. A binary of its own:
//! every established connection of the process is checked, and raw sockets of other tests
//! would have the system's default.

use std::process::Command;

use rucx_testkit::tcp::{self, procfs};
use rucx_testkit::{modules, Connect, Setup, Workers};

const ID: u8 = 3;

/// tcp on `lo`, linked in.
fn lo() -> Setup {
    tcp::lo(&modules::builtin(uct_tcp::module()))
}

/// The congestion control of each established TCP connection of this process, by inode.
fn congestion_of_ours() -> Vec<(String, String)> {
    let ours = procfs::own_socket_inodes();
    let out = Command::new("ss")
        .args(["-tienOH", "state", "established"])
        .output()
        .expect("ss (iproute2) runs");
    assert!(out.status.success(), "ss failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(ino) = words.iter().find_map(|w| w.strip_prefix("ino:")) else {
            continue;
        };
        if !ino.parse().is_ok_and(|n: u64| ours.contains(&n)) {
            continue;
        }
        // `ss -i` names the algorithm as a word of its own right after the timer/uid fields,
        // before "wscale:..." (e.g. "... sk:1 cgroup:/ <-> ts sack reno wscale:7,7 ...").
        let cc = words
            .iter()
            .position(|w| w.starts_with("wscale:"))
            .and_then(|i| words.get(i.checked_sub(1)?))
            .map(|w| w.to_string())
            .unwrap_or_else(|| panic!("no algorithm in {line:?}"));
        found.push((ino.to_string(), cc));
    }
    found
}

#[test]
fn loopback_connections_use_reno_on_both_ends() {
    for model in [Connect::ToEp, Connect::ToIface] {
        let p = lo().layout(model, Workers::Separate).pair();
        let rec = p.record_am(ID);
        p.retry("am_short", || p.ep().am_short(ID, 1, b"x")).unwrap();
        p.wait_for("am_short", || rec.borrow().len() == 1);
        let conns = congestion_of_ours();
        // Both ends of the connection live in this process.
        assert!(conns.len() >= 2, "{model:?}: connections found: {conns:?}");
        for (ino, cc) in &conns {
            assert_eq!(cc, "reno", "{model:?}: socket {ino}: {conns:?}");
        }
    }
}
