//! The command line: UCX's `ucp_client_server` options (`-a -l -p -c -i -s`) plus `--once`,
//! parsed by hand (getopt style: `-s64` or `-s 64`).

use std::net::{IpAddr, Ipv4Addr};

/// UCX's default port.
pub const DEFAULT_PORT: u16 = 13337;

/// The API the client sends with and the server receives with (`-c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `Ep::stream_send` / `Ep::stream_recv` with `wait_all`.
    Stream,
    /// `Ep::tag_send` / `Worker::tag_recv` with mask 0 (any tag).
    Tag,
    /// `Ep::am_send` / an AM handler (rendezvous fetched with `Worker::am_recv_data`).
    Am,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Stream => "stream",
            Api::Tag => "tag",
            Api::Am => "am",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Listen on this IP address.
    Server(IpAddr),
    /// Connect to the server at this host or IP address.
    Client(String),
}

#[derive(Clone, Debug)]
pub struct Args {
    pub role: Role,
    /// The server's port (0 on the server: any free one, printed).
    pub port: u16,
    pub api: Api,
    /// Messages per client (both sides must agree).
    pub iters: u64,
    /// Bytes per message (both sides must agree).
    pub size: usize,
    /// The server exits after its first client instead of waiting for the next.
    pub once: bool,
    /// The server drops a client that sends nothing for this long (it holds the only slot).
    pub idle: std::time::Duration,
}

pub enum Command {
    Run(Args),
    Help,
}

pub fn usage(prog: &str) -> String {
    format!(
        "Usage: {prog} [options]\n\
         A UCP client connects to a server by its IP address and port (Worker::connect_sockaddr,\n\
         no side channel) and sends it -i messages of -s bytes with the API of -c; the server\n\
         checks each one and prints what it got at the first, the last and every 2000th.\n\
         The server serves one client at a time (others are rejected) and then waits for the\n\
         next; a client that fails, sends wrong data or stays silent is dropped (reported on\n\
         stderr) and the next one is served. Both sides use error mode Peer: a failed peer or\n\
         a cut link is an error.\n\
         \n\
         Options:\n\
         \x20 -a <address>    act as the client of the server at <address> (without -a: the server)\n\
         \x20 -l <ip>         the server's listen address (default 0.0.0.0: any)\n\
         \x20 -p <port>       the server's port (default {DEFAULT_PORT}; 0 on the server: any, printed)\n\
         \x20 -c <api>        stream (default), tag or am\n\
         \x20 -i <n>          iterations: messages per client (default 1; both sides must agree)\n\
         \x20 -s <size>       message size in bytes (default 16; both sides must agree)\n\
         \x20 --once          the server exits after its first client (and fails with it)\n\
         \x20 --idle <secs>   the server drops a client silent for <secs> (default 10)\n\
         \x20 -h              this help\n\
         \n\
         Examples:\n\
         \x20 {prog} -c tag -i 10000                (server)\n\
         \x20 {prog} -a 127.0.0.1 -c tag -i 10000   (client)\n\
         \n\
         Exit status: 0 success, 1 failure (a peer failure, a rejection, a wrong message),\n\
         2 bad command line. RUCX_TLS, RUCX_NET_DEVICES and the other RUCX_* variables choose\n\
         what UCP may use (rucx-info -c lists them); RUCX_KEEPALIVE_INTERVAL is 1 s here\n\
         unless set.\n"
    )
}

fn value<'a>(
    opt: char,
    inline: &'a str,
    rest: &mut impl Iterator<Item = &'a String>,
) -> Result<&'a str, String> {
    if !inline.is_empty() {
        return Ok(inline);
    }
    rest.next()
        .map(String::as_str)
        .ok_or_else(|| format!("option -{opt} needs a value"))
}

/// Parses the arguments (without the program name).
pub fn parse(argv: &[String]) -> Result<Command, String> {
    let mut server_ip = None;
    let mut client = None;
    let mut port = None;
    let mut api = Api::Stream;
    let mut iters = 1u64;
    let mut size = 16usize;
    let mut once = false;
    let mut idle = None;
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--once" => {
                once = true;
                continue;
            }
            "--idle" => {
                let v = it.next().ok_or("option --idle needs a value")?;
                let secs: u64 = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("--idle {v}: expected seconds, at least 1"))?;
                idle = Some(std::time::Duration::from_secs(secs));
                continue;
            }
            "--help" => return Ok(Command::Help),
            a if a.starts_with("--") => return Err(format!("unknown option {a}")),
            _ => {}
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        let opt = flags.chars().next().expect("not empty");
        let inline = &flags[opt.len_utf8()..];
        if opt == 'h' {
            return Ok(Command::Help);
        }
        if !matches!(opt, 'a' | 'l' | 'p' | 'c' | 'i' | 's') {
            return Err(format!("unknown option -{opt}"));
        }
        let v = value(opt, inline, &mut it)?;
        match opt {
            'a' => client = Some(v.to_owned()),
            'l' => {
                server_ip = Some(
                    v.parse::<IpAddr>()
                        .map_err(|_| format!("-l {v}: expected an IPv4 or IPv6 address"))?,
                )
            }
            'p' => {
                port = Some(
                    v.parse::<u16>()
                        .map_err(|_| format!("-p {v}: expected a TCP port number (0-65535)"))?,
                )
            }
            'c' => {
                api = match v {
                    "stream" => Api::Stream,
                    "tag" => Api::Tag,
                    "am" => Api::Am,
                    _ => return Err(format!("-c {v}: expected stream, tag or am")),
                }
            }
            'i' => {
                iters = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("-i {v}: expected a number of iterations, at least 1"))?
            }
            _ => {
                size = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("-s {v}: expected a size in bytes, at least 1"))?
            }
        }
    }
    let role = match (client, server_ip) {
        (Some(_), Some(_)) => return Err("-a (client) and -l (server) exclude each other".into()),
        (Some(host), None) => {
            if once || idle.is_some() {
                return Err("--once and --idle are the server's options".into());
            }
            if port == Some(0) {
                return Err("-p 0: the client needs the server's port".into());
            }
            Role::Client(host)
        }
        (None, ip) => Role::Server(ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))),
    };
    Ok(Command::Run(Args {
        role,
        port: port.unwrap_or(DEFAULT_PORT),
        api,
        iters,
        size,
        once,
        idle: idle.unwrap_or(std::time::Duration::from_secs(10)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Args, String> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match parse(&v)? {
            Command::Run(a) => Ok(a),
            Command::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults_and_values() {
        let a = run(&[]).unwrap();
        assert_eq!(a.role, Role::Server(IpAddr::V4(Ipv4Addr::UNSPECIFIED)));
        assert_eq!(
            (a.port, a.api, a.iters, a.size, a.once),
            (DEFAULT_PORT, Api::Stream, 1, 16, false)
        );
        let a = run(&["-a", "192.0.2.1", "-p1234", "-c", "am", "-i", "5", "-s64"]).unwrap();
        assert_eq!(a.role, Role::Client("192.0.2.1".into()));
        assert_eq!((a.port, a.api, a.iters, a.size), (1234, Api::Am, 5, 64));
        assert!(run(&["-l", "::1", "-p", "0", "--once"]).unwrap().once);
    }

    #[test]
    fn bad_input() {
        for bad in [
            &["-c", "rma"][..],
            &["-a", "h", "-l", "127.0.0.1"],
            &["-a", "h", "-p", "0"],
            &["-a", "h", "--once"],
            &["-s", "0"],
            &["-i", "x"],
            &["-l", "host"],
            &["-x"],
            &["-p"],
        ] {
            assert!(run(bad).is_err(), "{bad:?}");
        }
    }
}
