//! UCP across processes, with the `ucp_peer` example (client and server find each other by
//! IP address and port): many clients to one server, every size class both ways, and a server
//! killed mid-transfer and mid-rendezvous. Over tcp on loopback (`RUCX_TLS=tcp`); the size classes also over rc
//! and ud where the host has an RDMA device (the soft-RoCE VM: `testbed/rxe-vm.sh`).
//!
//! `cargo test -p rucx` builds the examples first; with a target filter build it yourself:
//! `cargo build -p rucx --example ucp_peer`.
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

const TCP: [(&str, &str); 2] = [("RUCX_TLS", "tcp"), ("RUCX_NET_DEVICES", "lo")];

/// A transport to run on: its name, its environment, whether it has zero-copy sends.
type Transport = (&'static str, Vec<(&'static str, &'static str)>, bool);

/// The transports to run on: tcp, and the verbs ones where an RDMA device exists.
fn transports() -> Vec<Transport> {
    let mut out = vec![("tcp", [&TCP[..], &CLASSES].concat(), true)];
    let rdma = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if rdma {
        out.push(("rc", [&[("RUCX_TLS", "rc")][..], &CLASSES].concat(), true));
        // ud's segment is about 1 KiB, and it has no zero-copy sends.
        out.push((
            "ud",
            vec![("RUCX_TLS", "ud"), ("RUCX_BCOPY_THRESH", "256")],
            false,
        ));
    } else {
        println!("no RDMA device: tcp only");
    }
    out
}

fn example() -> PathBuf {
    rucx_testkit::child::example("ucp_peer")
}

/// Thresholds that give tcp every protocol class (by default its inline limit is its segment,
/// and zero-copy is not estimated faster).
const CLASSES: [(&str, &str); 2] = [("RUCX_BCOPY_THRESH", "1k"), ("RUCX_ZCOPY_THRESH", "4k")];

fn spawn(args: &[&str]) -> Child {
    spawn_with(args, &TCP)
}

fn spawn_with(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(example());
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().expect("start ucp_peer")
}

/// Kills the process on drop (a failed assertion leaves none behind).
struct Proc(Option<Child>);

impl Proc {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }

    /// Waits for it, killing it after two minutes (a safety net: it has its own deadlines).
    fn finish(mut self) -> Output {
        let mut child = self.0.take().expect("running");
        let start = Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if start.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("collect output")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn check(out: &Output, what: &str) -> String {
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{what}\nstdout:\n{o}\nstderr:\n{e}");
    o
}

/// Reads lines of `out` until one starts with `prefix`; returns the rest of it.
fn line_starting(out: &mut BufReader<ChildStdout>, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).expect("read the child's output");
        assert!(n > 0, "the child ended before printing {prefix:?}");
        if let Some(rest) = line.trim_end().strip_prefix(prefix) {
            return rest.to_owned();
        }
    }
}

/// Starts a server; returns it, its address and the rest of its output.
fn server(args: &[&str], env: &[(&str, &str)]) -> (Proc, String, BufReader<ChildStdout>) {
    let mut p = Proc(Some(spawn_with(args, env)));
    let mut out = BufReader::new(p.child().stdout.take().expect("stdout"));
    let addr = line_starting(&mut out, "listening on ");
    (p, addr, out)
}

/// Collects what the server prints after its address, and its exit.
fn finish_server(p: Proc, mut out: BufReader<ChildStdout>, what: &str) -> String {
    let mut rest = String::new();
    let mut line = String::new();
    while out.read_line(&mut line).unwrap_or(0) > 0 {
        rest.push_str(&line);
        line.clear();
    }
    let o = p.finish();
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{what}\nstdout:\n{rest}\nstderr:\n{e}");
    rest
}

/// 8 client processes × 10 000 messages to one server: each arrives once.
#[test]
fn many_clients_to_one_server() {
    const CLIENTS: usize = 8;
    const COUNT: &str = "10000";
    let (srv, addr, out) = server(&["sink", "127.0.0.1:0", &CLIENTS.to_string(), COUNT], &TCP);
    let clients: Vec<Proc> = (0..CLIENTS)
        .map(|i| Proc(Some(spawn(&["send", &addr, &i.to_string(), COUNT]))))
        .collect();
    for (i, c) in clients.into_iter().enumerate() {
        let o = check(&c.finish(), &format!("client {i}"));
        assert!(o.contains(&format!("client {i}: sent {COUNT}")), "{o}");
    }
    let rest = finish_server(srv, out, "the server");
    assert!(
        rest.contains("received 8x10000: none lost, none duplicated"),
        "{rest}"
    );
}

/// Short, bcopy, zero-copy (where the transport has it), fragmented and rendezvous messages up
/// to 64 MiB, each way, checked on both sides.
#[test]
fn every_size_class_both_ways() {
    // The soft-RoCE VM emulates its CPU: 8 MiB there.
    let max: usize = if std::env::var_os("RXE_VM").is_some() {
        8 << 20
    } else {
        64 << 20
    };
    let max_arg = max.to_string();
    for (name, env, zcopy) in transports() {
        let (srv, addr, out) = server(&["echo", "127.0.0.1:0"], &env);
        let o = check(
            &Proc(Some(spawn_with(&["sizes", &addr, &max_arg], &env))).finish(),
            &format!("[{name}] the client"),
        );
        let protos = ["eager short\n", "eager bcopy\n", "fragments\n", "eager zcopy\n"];
        for proto in &protos[..if zcopy { 4 } else { 3 }] {
            assert!(o.contains(proto), "[{name}] no {proto:?} message:\n{o}");
        }
        // tcp's rendezvous threshold is a few MiB.
        if name == "tcp" {
            assert!(o.contains("rendezvous\n"), "[{name}] no rendezvous message:\n{o}");
        }
        assert!(o.contains(&format!("{max} bytes both ways")), "[{name}] {o}");
        assert!(o.contains("all sizes intact"), "[{name}] {o}");
        let n = o.lines().filter(|l| l.contains("bytes both ways")).count();
        let mut out = out;
        let echoed = line_starting(&mut out, "echoed ");
        assert_eq!(echoed, format!("{n} messages"), "[{name}]");
        // It serves until killed.
        drop(srv);
        println!("[{name}] {n} sizes both ways");
    }
}

/// The server dies (SIGKILL) while a client with error mode Peer sends (`flood_args`): the
/// client's pending requests fail, its error handler runs once, from progress, and the client
/// goes on to exit cleanly.
fn peer_killed(flood_args: &[&str]) {
    // The server stops reading after the first message: the client's sends back up.
    let (mut srv, addr, _out) = server(&["stall", "127.0.0.1:0"], &TCP);
    let mut args = vec!["flood", &addr];
    args.extend_from_slice(flood_args);
    let mut cli = Proc(Some(spawn(&args)));
    let mut cout = BufReader::new(cli.child().stdout.take().expect("stdout"));
    line_starting(&mut cout, "transferring");
    srv.child().kill().expect("kill the server");
    let _ = srv.child().wait();
    let report = line_starting(&mut cout, "sent ");
    let o = cli.finish();
    assert_eq!(o.status.code(), Some(0), "{report}\nstderr:\n{}", text(&o.stderr));
    assert!(report.ends_with("error handler called 1 time(s)"), "{report}");
    let failed: u64 = report
        .split(", ")
        .find_map(|f| f.strip_prefix("failed "))
        .and_then(|n| n.parse().ok())
        .expect("a failed count");
    assert!(failed > 0, "no request failed: {report}");
}

/// Killed mid-transfer: eager messages (fragments) queued behind a full connection.
#[test]
fn peer_killed_mid_transfer() {
    peer_killed(&[]);
}

/// Killed mid-rendezvous: announced messages wait for a fetch that never comes.
#[test]
fn peer_killed_mid_rendezvous() {
    peer_killed(&["rndv"]);
}

/// With `RUCX_TLS` unset, two processes of one host talk over shared memory: posix (or sysv)
/// carries active messages and cma the rendezvous fetches (`RUCX_PROTO_INFO` prints the
/// lanes); messages of every size arrive intact.
#[test]
fn default_selection_between_local_processes_is_shared_memory() {
    let env = [("RUCX_PROTO_INFO", "y"), ("RUCX_NET_DEVICES", "lo")];
    let (srv, addr, out) = server(&["echo", "127.0.0.1:0"], &env);
    let o = check(
        &Proc(Some(spawn_with(&["sizes", &addr, "1048576"], &env))).finish(),
        "the client",
    );
    let am = o
        .lines()
        .find(|l| l.starts_with("lane[") && l.contains(" am "))
        .unwrap_or_else(|| panic!("no AM lane printed:\n{o}"));
    assert!(
        am.contains("posix/memory -> posix/memory") || am.contains("sysv/memory -> sysv/memory"),
        "AM lane not on shared memory: {am}\n{o}"
    );
    assert!(
        o.lines().any(|l| l.starts_with("lane[")
            && l.contains("cma/memory -> cma/memory")
            && l.contains("rma_bw")),
        "no cma rendezvous lane:\n{o}"
    );
    assert!(o.contains("rendezvous") && o.contains("all sizes intact"), "{o}");
    let mut out = out;
    line_starting(&mut out, "echoed ");
    // It serves until killed.
    drop(srv);
}
