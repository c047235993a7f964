//! The local mode: this program runs itself twice, as a server (on a free port) and as its
//! client over loopback, relays their output line by line and checks how each ended.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::args::{Args, Fail};
use crate::wake::DEADLINE;

type Res<T> = Result<T, String>;

fn start(exe: &std::path::Path, args: &[String]) -> Res<Child> {
    Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", exe.display()))
}

/// Prints each line of `r` with `prefix`.
fn relay(r: impl BufRead + Send + 'static, prefix: &'static str) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in r.lines().map_while(Result::ok) {
            println!("{prefix}{line}");
        }
    })
}

/// Waits for `child`, killing it once `deadline` passed (a safety net only).
fn finish(child: &mut Child, deadline: Instant) -> Res<ExitStatus> {
    loop {
        if let Some(s) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            return Ok(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().map_err(|e| format!("wait: {e}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn ended(who: &str, s: ExitStatus, killed: bool) -> Res<()> {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal(), killed) {
        (Some(0), _, false) => Ok(()),
        (_, Some(9), true) => Ok(()),
        _ if killed => Err(format!("the {who} was to kill itself, but ended with {s}")),
        _ => Err(format!("the {who} ended with {s}")),
    }
}

pub fn run(a: &Args) -> Res<()> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    println!(
        "local mode: a server and a client process over loopback ({}{})",
        a.wake.describe(),
        a.fail.map_or(String::new(), |f| format!(", -e {}", f.name()))
    );
    let mut sargs = vec!["--server".to_owned(), "-p".into(), "0".into()];
    sargs.extend(a.shared_flags());
    let mut server = start(&exe, &sargs)?;
    let mut out = BufReader::new(server.stdout.take().expect("piped"));
    let mut first = String::new();
    let _ = out.read_line(&mut first);
    let port = first
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .and_then(|p| p.parse::<u16>().ok());
    let Some(port) = port else {
        let _ = server.kill();
        let _ = server.wait();
        return Err(format!("the server did not say its port: {first:?}"));
    };
    println!("server: {}", first.trim_end());
    let relay_s = relay(out, "server: ");
    let mut cargs = vec!["-n".to_owned(), "127.0.0.1".into(), "-p".into(), port.to_string()];
    cargs.extend(a.shared_flags());
    let mut client = match start(&exe, &cargs) {
        Ok(c) => c,
        Err(e) => {
            let _ = server.kill();
            let _ = server.wait();
            return Err(e);
        }
    };
    let relay_c = relay(BufReader::new(client.stdout.take().expect("piped")), "client: ");
    let deadline = Instant::now() + 2 * DEADLINE;
    let c = finish(&mut client, deadline)?;
    let s = finish(&mut server, deadline)?;
    let _ = (relay_c.join(), relay_s.join());
    let client_dies = matches!(a.fail, Some(Fail::Recv | Fail::Keepalive));
    let server_dies = a.fail == Some(Fail::Send);
    ended("client", c, client_dies).and(ended("server", s, server_dies))
}
