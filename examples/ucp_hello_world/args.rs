//! The command line: UCX's `ucp_hello_world` options (`-n -p -s -b -w -f -e`) plus the roles
//! (`--server`, `--local`), parsed by hand: a dozen getopt-style flags need no dependency.

/// UCX's default out-of-band port.
pub const DEFAULT_PORT: u16 = 13337;

pub use crate::wake::Wake;

/// Which peer failure `-e` emulates (the side that dies kills itself with SIGKILL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fail {
    /// The server dies once it has the client's address; the client notices while waiting
    /// for the server's message.
    Send,
    /// The client dies once its address was delivered; the server's send to it fails.
    Recv,
    /// The client dies once it has the server's message; the server, idle, notices by
    /// keepalive (or its transport).
    Keepalive,
}

impl Fail {
    pub fn name(self) -> &'static str {
        match self {
            Fail::Send => "send",
            Fail::Recv => "recv",
            Fail::Keepalive => "keepalive",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Server and client as two processes of this program, over loopback.
    Local,
    Server,
    Client(String),
}

#[derive(Clone, Debug)]
pub struct Args {
    pub role: Role,
    /// The side channel's port (0 on the server: any free port, printed).
    pub port: u16,
    /// Size of the server's message.
    pub size: usize,
    pub wake: Wake,
    pub fail: Option<Fail>,
}

impl Args {
    /// The options a server or client started by the local mode gets (everything but the role
    /// and the port).
    pub fn shared_flags(&self) -> Vec<String> {
        let mut v = vec![self.wake.flag().to_owned(), "-s".into(), self.size.to_string()];
        if let Some(f) = self.fail {
            v.extend(["-e".into(), f.name().into()]);
        }
        v
    }
}

pub enum Command {
    Run(Args),
    Help,
}

pub fn usage(prog: &str) -> String {
    format!(
        "Usage: {prog} [options]\n\
         A UCP client sends its worker address to a server with the tag API; the server\n\
         connects back and answers with a message (both worker addresses go over a TCP side\n\
         channel first). Then the client measures tag round trips of growing sizes.\n\
         \n\
         Roles (without -n and --server: --local):\n\
         \x20 --local         run the server and the client as two processes here, over loopback\n\
         \x20 --server        act as the server: wait for one client on the side-channel port\n\
         \x20 -n <host>       act as the client of the server on <host>\n\
         Options:\n\
         \x20 -p <port>       side-channel TCP port (default {DEFAULT_PORT}; 0 on the server: any, printed)\n\
         \x20 -s <size>       size of the server's message (default 16)\n\
         \x20 -b              busy polling: spin on progress (default)\n\
         \x20 -w              sleep in Worker::wait between events\n\
         \x20 -f              sleep in poll(2) on Worker::event_fd, armed by Worker::arm\n\
         \x20 -e <mode>       emulate a peer failure, with error mode Peer on both sides:\n\
         \x20                   send       the server dies once it has the client's address\n\
         \x20                   recv       the client dies once the server has its address\n\
         \x20                   keepalive  the client dies once it has the server's message\n\
         \x20 -h              this help\n\
         \n\
         Examples:\n\
         \x20 {prog}                         (both sides here, as two processes)\n\
         \x20 {prog} --server -w             (server)\n\
         \x20 {prog} -n 127.0.0.1 -w         (client)\n\
         \n\
         Exit status: 0 success (with -e: the surviving side detected the failure), 1 failure,\n\
         2 bad command line. RUCX_TLS, RUCX_NET_DEVICES and the other RUCX_* variables choose\n\
         what UCP may use (rucx-info -c lists them).\n"
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

fn set_role(r: Role, role: &mut Option<Role>) -> Result<(), String> {
    match role {
        Some(old) if *old != r => Err(format!("{r:?} and {old:?} exclude each other: give one role")),
        _ => {
            *role = Some(r);
            Ok(())
        }
    }
}

/// Parses getopt-style arguments (without the program name): flags may be grouped (`-wf`) and
/// values attached (`-s64`) or separate (`-s 64`).
pub fn parse(argv: &[String]) -> Result<Command, String> {
    let mut role = None;
    let mut port = None;
    let mut size = 16usize;
    let mut wake = Wake::Busy;
    let mut fail = None;
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--local" => set_role(Role::Local, &mut role)?,
            "--server" => set_role(Role::Server, &mut role)?,
            "--help" => return Ok(Command::Help),
            _ => {}
        }
        if arg.starts_with("--") {
            if !matches!(arg.as_str(), "--local" | "--server") {
                return Err(format!("unknown option {arg}"));
            }
            continue;
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        for (i, opt) in flags.char_indices() {
            let inline = &flags[i + opt.len_utf8()..];
            match opt {
                'h' => return Ok(Command::Help),
                'b' => wake = Wake::Busy,
                'w' => wake = Wake::Wait,
                'f' => wake = Wake::Fd,
                'n' | 'p' | 's' | 'e' => {
                    let v = value(opt, inline, &mut it)?;
                    match opt {
                        'n' => set_role(Role::Client(v.into()), &mut role)?,
                        'p' => {
                            port = Some(
                                v.parse()
                                    .map_err(|_| format!("-p {v}: expected a TCP port number (0-65535)"))?,
                            )
                        }
                        's' => {
                            size = v
                                .parse()
                                .map_err(|_| format!("-s {v}: expected a size in bytes"))?
                        }
                        _ => {
                            fail = Some(match v {
                                "send" => Fail::Send,
                                "recv" => Fail::Recv,
                                "keepalive" => Fail::Keepalive,
                                _ => return Err(format!("-e {v}: expected send, recv or keepalive")),
                            })
                        }
                    }
                    break; // the rest of this word was the value
                }
                _ => return Err(format!("unknown option -{opt}")),
            }
        }
    }
    if size == 0 {
        return Err("-s 0: the message needs at least 1 byte".into());
    }
    let role = role.unwrap_or(Role::Local);
    let port = match (&role, port) {
        (Role::Local, Some(_)) => return Err("-p: the local mode picks a free port itself".into()),
        (Role::Client(_), Some(0)) => return Err("-p 0: the client needs the server's port".into()),
        (_, p) => p.unwrap_or(DEFAULT_PORT),
    };
    Ok(Command::Run(Args {
        role,
        port,
        size,
        wake,
        fail,
    }))
}
