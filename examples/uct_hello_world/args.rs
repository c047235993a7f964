//! Command line of the example (UCX's `uct_hello_world` options plus `-l` and `-T`), parsed by
//! hand: a dozen getopt-style flags do not justify a dependency.

use std::time::Duration;

/// Transport and device used when `-t`/`-d` are not given (tcp on loopback works between two
/// processes and with `-l`).
pub const DEFAULT_TRANSPORT: (&str, &str) = ("tcp", "lo");

/// Default out-of-band TCP port (UCX's).
pub const DEFAULT_PORT: u16 = 13337;

/// The active-message flavour the client sends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Short,
    Bcopy,
    Zcopy,
}

impl Flavour {
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Short => "am_short",
            Flavour::Bcopy => "am_bcopy",
            Flavour::Zcopy => "am_zcopy",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Args {
    pub dev: String,
    pub tl: String,
    /// Server host to connect to; `None` = act as the server.
    pub server: Option<String>,
    pub port: u16,
    pub size: usize,
    pub flavour: Flavour,
    /// Server and client in this process, on this thread.
    pub loopback: bool,
    /// Longest wait for any one step (connection, addresses, message, acknowledgement).
    pub timeout: Duration,
}

/// What the command line asks for.
pub enum Command {
    Run(Args),
    Help,
}

pub fn usage(prog: &str) -> String {
    let (tl, dev) = DEFAULT_TRANSPORT;
    format!(
        "Usage: {prog} [options]\n\
         Sends one active message from a client to a server over a uct transport. The server\n\
         serves one client, then exits; every step gives up after -T seconds.\n\
         \n\
         \x20 -d <device>     device (default {dev})\n\
         \x20 -t <transport>  transport (default {tl}); list them with `rucx-info -d`\n\
         \x20 -n <host>       server to connect to; without it, act as the server\n\
         \x20 -p <port>       out-of-band TCP port (default {DEFAULT_PORT})\n\
         \x20 -s <size>       message size in bytes (default 16; am_short needs at least 8)\n\
         \x20 -i              send with am_short (default)\n\
         \x20 -b              send with am_bcopy\n\
         \x20 -z              send with am_zcopy (registered memory)\n\
         \x20 -l              run server and client in this process (loopback)\n\
         \x20 -T <seconds>    give up on any step after this long (default 30)\n\
         \x20 -h              this help\n\
         \n\
         Examples:\n\
         \x20 {prog} -l -b                       (both sides in this process)\n\
         \x20 {prog} -t tcp -d lo                (server)\n\
         \x20 {prog} -t tcp -d lo -n 127.0.0.1   (client)\n\
         \n\
         Exit status: 0 message delivered intact, 1 failure, 2 bad command line,\n\
         77 the transport lacks the requested feature.\n"
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

fn number<T: std::str::FromStr>(opt: char, s: &str, what: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("-{opt} {s}: expected {what}"))
}

/// Parses getopt-style arguments (without the program name): flags may be grouped (`-lb`) and
/// values attached (`-s64`) or separate (`-s 64`).
pub fn parse(argv: &[String]) -> Result<Command, String> {
    let mut a = Args {
        dev: DEFAULT_TRANSPORT.1.into(),
        tl: DEFAULT_TRANSPORT.0.into(),
        server: None,
        port: DEFAULT_PORT,
        size: 16,
        flavour: Flavour::Short,
        loopback: false,
        timeout: Duration::from_secs(30),
    };
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        if arg == "--help" {
            return Ok(Command::Help);
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        for (i, opt) in flags.char_indices() {
            let inline = &flags[i + opt.len_utf8()..];
            match opt {
                'h' => return Ok(Command::Help),
                'i' => a.flavour = Flavour::Short,
                'b' => a.flavour = Flavour::Bcopy,
                'z' => a.flavour = Flavour::Zcopy,
                'l' => a.loopback = true,
                'd' | 't' | 'n' | 'p' | 's' | 'T' => {
                    let v = value(opt, inline, &mut it)?;
                    match opt {
                        'd' => a.dev = v.into(),
                        't' => a.tl = v.into(),
                        'n' => a.server = Some(v.into()),
                        'p' => a.port = number(opt, v, "a TCP port number (1-65535)")?,
                        's' => a.size = number(opt, v, "a size in bytes")?,
                        _ => {
                            let secs: f64 = number(opt, v, "seconds")?;
                            if !(secs > 0.0 && secs <= 86_400.0) {
                                return Err(format!("-T {v}: expected 0 < seconds <= 86400"));
                            }
                            a.timeout = Duration::from_secs_f64(secs);
                        }
                    }
                    break; // the rest of this word was the value
                }
                _ => return Err(format!("unknown option -{opt}")),
            }
        }
    }
    if a.size == 0 {
        return Err("-s 0: the message needs at least 1 byte".into());
    }
    if a.loopback && a.server.is_some() {
        return Err("-l runs both sides here: drop -n".into());
    }
    if !a.loopback && a.server.is_none() && a.port == 0 {
        return Err("-p 0: a server needs a fixed port for its client".into());
    }
    Ok(Command::Run(a))
}
