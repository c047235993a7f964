//! Shared helpers of the tcp integration tests (`tests/tcp_*.rs`): opening tcp/lo interfaces
//! (and finding their listening ports), progressing workers until a condition holds, stamped
//! messages, a raw-socket peer speaking `docs/wire-tcp.md`, and child-process roles.
//!
//! Every test starts with [`tcp_context`], which skips the test (prints `skipped: tcp transport
//! not available`) only while no tcp module is built in or loadable; once one exists, every test
//! runs and can fail.
#![allow(dead_code)]

pub mod gen;
pub mod peer;
pub mod procfs;
pub mod wire;

use std::cell::RefCell;
use std::process::Child;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uct::{AsyncMode, Context, Ep, EpKey, Iface, IfaceParams, Md, ProgressFlags, Status, ThreadMode, Worker};

/// Transport and device every test uses.
pub const TL: &str = "tcp";
pub const DEV: &str = "lo";

/// Generous wait for one step of a test (no timing is asserted; this only bounds hangs).
pub const STEP: Duration = Duration::from_secs(20);

/// The default rucx context, or `None` (after printing why) when no tcp module exists yet.
/// A tcp module that exists but does not offer `tcp/lo` is a failure, not a skip.
pub fn tcp_context() -> Option<Context> {
    let ctx = rucx::context();
    if ctx.find_resource(TL, DEV).is_ok() {
        return Some(ctx);
    }
    let has_tcp = ctx.components().iter().any(|c| c.transport_names().contains(&TL));
    if !has_tcp {
        eprintln!("skipped: tcp transport not available (no module offers transport \"tcp\")");
        return None;
    }
    panic!(
        "the tcp transport is present but offers no device \"lo\" (find_resource(\"tcp\", \"lo\") failed)"
    );
}

/// The memory domain that serves tcp/lo.
pub fn tcp_md(ctx: &Context) -> Md {
    ctx.find_resource(TL, DEV).expect("tcp/lo resource").0
}

/// Serializes interface opening in this process so the new listening socket can be told apart
/// from the others in `/proc` (tests of one binary run in parallel threads).
static OPEN_LOCK: Mutex<()> = Mutex::new(());

/// A listening socket on 127.0.0.1 (for raw peers), created under the same lock as interfaces
/// so that [`Node::open`] never mistakes it for an interface's.
pub fn bind_listener() -> std::io::Result<std::net::TcpListener> {
    let _g = OPEN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
}

/// Error reports an interface's error handler received.
pub type ErrLog = Rc<RefCell<Vec<(EpKey, Status)>>>;

/// A worker with one tcp/lo interface (progress enabled) and its error log.
pub struct Node {
    pub worker: Worker,
    pub iface: Iface,
    /// The interface's listening TCP port (found through `/proc`, independent of the address
    /// format).
    pub port: u16,
    pub dev_addr: Vec<u8>,
    pub iface_addr: Vec<u8>,
    pub errors: ErrLog,
}

impl Node {
    /// Opens tcp/lo on a new worker (poll mode: everything happens in `progress`).
    pub fn open(ctx: &Context) -> Node {
        Self::open_on(&tcp_md(ctx), DEV)
    }

    /// Opens transport tcp on `dev` of `md`.
    pub fn open_on(md: &Md, dev: &str) -> Node {
        let worker = Worker::new(AsyncMode::Poll, ThreadMode::Single).expect("worker");
        let errors: ErrLog = Rc::default();
        let log = errors.clone();
        let params = IfaceParams::new(TL, dev).err_handler(move |k, s| log.borrow_mut().push((k, s)));
        let (iface, port) = {
            let _g = OPEN_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let before = procfs::own_listening();
            let iface = Iface::open(md, &worker, params).expect("open tcp interface");
            let after = procfs::own_listening();
            let new: Vec<_> = after.iter().filter(|a| !before.contains(a)).collect();
            let port = match new.as_slice() {
                [] => panic!("opening a tcp interface created no listening socket in /proc/net/tcp*"),
                [one] => one.port(),
                many => many.iter().find(|a| a.is_ipv4()).unwrap_or(&many[0]).port(),
            };
            (iface, port)
        };
        iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
        let dev_addr = iface.device_address().expect("device address");
        let iface_addr = iface.address().expect("iface address");
        Node {
            worker,
            iface,
            port,
            dev_addr,
            iface_addr,
            errors,
        }
    }

    /// An endpoint connected to `other`'s interface.
    pub fn connect(&self, other: &Node) -> Ep {
        self.connect_to(&other.dev_addr, &other.iface_addr)
    }

    /// An endpoint connected to the interface with these addresses.
    pub fn connect_to(&self, dev: &[u8], iface: &[u8]) -> Ep {
        assert!(
            self.iface.is_reachable(dev, iface),
            "peer address not reachable from tcp/lo"
        );
        self.iface
            .ep_create_connected(dev, iface)
            .expect("ep_create_connected")
    }

    /// Statuses reported for `key`.
    pub fn errors_for(&self, key: EpKey) -> Vec<Status> {
        self.errors
            .borrow()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, s)| *s)
            .collect()
    }
}

/// Hex form of an address, for passing to child processes.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Inverse of [`hex`].
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Progresses `workers` until `done()` holds; panics naming `what` after `limit`.
pub fn progress_until(workers: &[&Worker], limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    let mut idle = 0u32;
    while !done() {
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        let n: u32 = workers.iter().map(|w| w.progress()).sum();
        idle = if n == 0 { idle + 1 } else { 0 };
        if idle > 200 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Progresses `workers` for `d` (to let things settle; nothing is asserted about time).
pub fn progress_for(workers: &[&Worker], d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        let n: u32 = workers.iter().map(|w| w.progress()).sum();
        if n == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Retries `op` while it answers `NoResource`, progressing `workers` in between.
pub fn retry<T>(workers: &[&Worker], what: &str, mut op: impl FnMut() -> uct::Result<T>) -> uct::Result<T> {
    let start = Instant::now();
    loop {
        match op() {
            Err(Status::NoResource) => {
                if start.elapsed() > STEP {
                    panic!("{what}: still NoResource after {STEP:?}");
                }
                for w in workers {
                    w.progress();
                }
            }
            other => return other,
        }
    }
}

/// Counts progress rounds of the main thread, so a helper thread can wait until the transport
/// had several chances to read what it sent.
#[derive(Clone, Default)]
pub struct Ticks(Arc<AtomicU64>);

impl Ticks {
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Waits (in the helper thread) until the main thread progressed `n` more rounds.
    pub fn wait_rounds(&self, n: u64) {
        let target = self.now() + n;
        let start = Instant::now();
        while self.now() < target && start.elapsed() < STEP {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Runs `f` in a helper thread while this thread progresses `workers`; returns `f`'s result.
/// Panics if `f` is not done after `limit`.
pub fn drive<T: Send + 'static>(
    workers: &[&Worker],
    limit: Duration,
    f: impl FnOnce(Ticks) -> T + Send + 'static,
) -> T {
    drive_with(workers, limit, f, || {})
}

/// [`drive`], also calling `step` on this thread after each progress round (to send from here
/// while the helper thread works).
pub fn drive_with<T: Send + 'static>(
    workers: &[&Worker],
    limit: Duration,
    f: impl FnOnce(Ticks) -> T + Send + 'static,
    mut step: impl FnMut(),
) -> T {
    let ticks = Ticks::default();
    let t2 = ticks.clone();
    let h = std::thread::spawn(move || f(t2));
    let start = Instant::now();
    while !h.is_finished() {
        assert!(
            start.elapsed() < limit,
            "helper thread still running after {limit:?}"
        );
        let n: u32 = workers.iter().map(|w| w.progress()).sum();
        ticks.0.fetch_add(1, Ordering::Relaxed);
        step();
        if n == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    match h.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Ends the whole test process if a test hangs past `limit` (a safety net: the tests have their
/// own deadlines; children notice the parent's exit through their stdin and quit).
pub struct Watchdog(Arc<AtomicBool>);

impl Watchdog {
    pub fn new(name: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !d.load(Ordering::Relaxed) {
                if start.elapsed() > limit {
                    eprintln!("WATCHDOG: test {name} still running after {limit:?}: ending the test process");
                    std::process::exit(1);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this test binary again as a child process running only the (ignored) test `test`,
/// with `env` added; stdin, stdout and stderr are pipes (the child notices our exit through
/// its stdin).
pub fn spawn_self(test: &str, env: &[(&str, &str)]) -> ChildGuard {
    let exe = std::env::current_exe().expect("path of the test executable");
    let mut cmd = std::process::Command::new(exe);
    cmd.args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    ChildGuard(cmd.spawn().expect("start a child copy of the test binary"))
}

/// Collects a child's stdout lines in the background; `lines` lets a test wait for one.
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Lines {
    pub fn new(out: impl std::io::Read + Send + 'static) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// Lines that arrived so far (non-blocking).
    pub fn poll(&mut self) {
        while let Ok(l) = self.rx.try_recv() {
            self.seen.push(l);
        }
    }

    /// The rest of the first line (seen or arriving within `limit`) that contains `prefix`
    /// (the test harness of a child may print its own text in front), progressing `workers`
    /// meanwhile (a peer may be waiting for them).
    pub fn wait(&mut self, prefix: &str, limit: Duration, workers: &[&Worker]) -> Option<String> {
        let start = Instant::now();
        let mut closed = false;
        loop {
            if let Some(l) = self
                .seen
                .iter()
                .find_map(|l| l.find(prefix).map(|i| &l[i + prefix.len()..]))
            {
                return Some(l.trim().to_string());
            }
            if closed || start.elapsed() > limit {
                return None;
            }
            match self.rx.try_recv() {
                Ok(l) => self.seen.push(l),
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    if workers.iter().map(|w| w.progress()).sum::<u32>() == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                // The child closed stdout: only what was seen counts.
                Err(std::sync::mpsc::TryRecvError::Disconnected) => closed = true,
            }
        }
    }
}

/// Waits for a child to exit (killing it after `limit`); returns (exit code or -1, stdout,
/// stderr).
pub fn finish_child(mut c: ChildGuard, limit: Duration) -> (i32, String, String) {
    let start = Instant::now();
    while c.0.try_wait().ok().flatten().is_none() {
        if start.elapsed() > limit {
            let _ = c.0.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    if let Some(mut o) = c.0.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = c.0.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let code = c.0.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
    (code, out, err)
}
