//! Command line of `rucx-perftest`: `ucx_perftest`'s options (getopt style: bundled flags,
//! attached values, the server host as the first non-option argument) and its help text.

use std::fmt::Write as _;

use ucs::{Result, Status};

use super::params::{num, Api, Params, TESTS};

/// Output flags (`TEST_FLAG_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrintFlags {
    pub results: bool,
    pub test: bool,
    pub numeric: bool,
    pub final_only: bool,
    pub csv: bool,
    pub extra_info: bool,
}

/// How this process takes part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// `-l`: one process, one worker, the endpoint connected to its own interface (as UCX).
    Loopback,
    /// `-L` (rucx extension): server and client in two threads of this process, each with its
    /// own worker, talking over a socket pair (for transports that cannot reach their own iface).
    LoopbackThreads,
    Server,
    Client(String),
}

/// Everything the command line says.
#[derive(Clone, Debug)]
pub struct Options {
    pub params: Params,
    pub print: PrintFlags,
    pub port: u16,
    pub ipv6: bool,
    pub role: Role,
}

/// What parsing produced.
pub enum Parsed {
    Run(Box<Options>),
    /// `-h`: usage printed, exit 0.
    Help,
}

/// Options that take an argument (UCX's getopt string minus MPI/UCP-only ones, plus `-V`/`-L`).
const WITH_ARG: &str = "pbctnsWOwDiHMrETdxAmR";
const FLAGS: &str = "6NfvIlLoVqhSCUeBz";

/// Parses `ucx_perftest`-style arguments (without the program name). Options may be bundled
/// (`-lf`) and values attached (`-n100`); the first non-option argument is the server host.
pub fn parse(args: &[String]) -> Result<Parsed> {
    let mut p = Params::default();
    let mut print = PrintFlags::default();
    let mut port = 13337u16;
    let mut ipv6 = false;
    let mut host: Option<String> = None;
    let mut threads_loopback = false;
    let mut i = 0;
    let mut only_positional = false;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if only_positional || !a.starts_with('-') || a.len() == 1 {
            host.get_or_insert_with(|| a.clone());
            continue;
        }
        if a == "--" {
            only_positional = true;
            continue;
        }
        for (pos, c) in a[1..].char_indices() {
            if WITH_ARG.contains(c) {
                let rest = &a[1 + pos + c.len_utf8()..];
                let val = if !rest.is_empty() {
                    rest.to_string()
                } else if i < args.len() {
                    i += 1;
                    args[i - 1].clone()
                } else {
                    ucs::error!("option requires an argument -- '{c}'");
                    return Err(Status::InvalidParam.into());
                };
                match c {
                    'p' => port = num(c, &val)?,
                    'c' => {
                        ucs::error!(
                            "-c (CPU affinity) is not supported; pin with `taskset -c <cpus>` instead"
                        );
                        return Err(Status::Unsupported.into());
                    }
                    'b' => {
                        ucs::error!("-b (batch files) is not supported by rucx-perftest");
                        return Err(Status::Unsupported.into());
                    }
                    'T' | 'r' | 'E' => {
                        ucs::error!("-{c} (a UCP option of ucx_perftest) is not supported by rucx-perftest");
                        return Err(Status::Unsupported.into());
                    }
                    _ => p.apply(c, &val)?,
                }
                break;
            } else if FLAGS.contains(c) {
                match c {
                    '6' => ipv6 = true,
                    'N' => print.numeric = true,
                    'f' => print.final_only = true,
                    'v' => print.csv = true,
                    'I' => print.extra_info = true,
                    'L' => threads_loopback = true,
                    'h' => return Ok(Parsed::Help),
                    'S' | 'C' | 'U' | 'e' | 'B' | 'z' => {
                        ucs::error!("-{c} (a UCP option of ucx_perftest) is not supported by rucx-perftest");
                        return Err(Status::Unsupported.into());
                    }
                    _ => p.apply(c, "")?,
                }
            } else {
                ucs::error!("invalid option -- '{c}' (see -h)");
                return Err(Status::InvalidParam.into());
            }
        }
    }
    let role = match (host, p.loopback || threads_loopback) {
        (Some(_), true) => {
            ucs::error!(
                "conflicting arguments: server hostname argument is not allowed in loopback (-l) mode"
            );
            return Err(Status::InvalidParam.into());
        }
        (Some(h), false) => Role::Client(h),
        (None, true) if threads_loopback => {
            p.loopback = false;
            Role::LoopbackThreads
        }
        (None, true) => Role::Loopback,
        (None, false) => Role::Server,
    };
    Ok(Parsed::Run(Box::new(Options {
        params: p,
        print,
        port,
        ipv6,
        role,
    })))
}

/// The help text (UCX's layout, limited to what rucx-perftest runs: every UCT test and the UCP
/// tests [`super::ucp_bench`] implements).
pub fn usage(program: &str) -> String {
    let d = Params::default();
    let mut s = String::new();
    let _ = writeln!(s, "  Usage: {program} [ server-hostname ] [ options ]\n");
    let _ = writeln!(s, "  Common options:");
    let _ = writeln!(s, "     -t <test>      test to run:");
    for t in TESTS
        .iter()
        .filter(|t| t.api == Api::Uct || super::ucp_bench::supported(t.name))
    {
        let api = if t.api == Api::Uct { "UCT" } else { "UCP" };
        let _ = writeln!(s, "    {:>13} - {api} {}", t.name, t.desc);
    }
    let _ = writeln!(
        s,
        "                    (UCP tests use the transports RUCX_TLS selects; -x and -d are for UCT)\n"
    );
    let _ = writeln!(
        s,
        "     -s <size>      list of scatter-gather sizes for single message ({})",
        d.sizes[0]
    );
    let _ = writeln!(s, "                    for example: \"-s 16,48,8192,8192,14\"");
    let _ = writeln!(s, "     -m <send mem type>[,<recv mem type>]");
    let _ = writeln!(
        s,
        "                    memory type of message for sender and receiver (host)"
    );
    let _ = writeln!(s, "                        host - system memory");
    let _ = writeln!(
        s,
        "     -n <iters>     number of iterations to run ({})",
        d.max_iter
    );
    let _ = writeln!(
        s,
        "     -w <iters>     number of warm-up iterations ({})",
        d.warmup_iter
    );
    let _ = writeln!(
        s,
        "     -O <count>     maximal number of uncompleted outstanding sends (0 = the test's default)"
    );
    let _ = writeln!(
        s,
        "     -i <offset>    distance between consecutive scatter-gather entries ({})",
        d.iov_stride
    );
    let _ = writeln!(s, "     -l             use loopback connection");
    let _ = writeln!(
        s,
        "                    in this case, the process will communicate with itself,"
    );
    let _ = writeln!(s, "                    so passing server hostname is not allowed");
    let _ = writeln!(
        s,
        "     -L             (rucx) loopback between two threads of this process, each with"
    );
    let _ = writeln!(
        s,
        "                    its own worker, over a socket pair (not for self)"
    );
    let _ = writeln!(
        s,
        "     -o             do not progress the responder in one-sided tests"
    );
    let _ = writeln!(
        s,
        "     -V             (rucx) validate the data: AM payloads, put and get buffers"
    );
    let _ = writeln!(
        s,
        "     -R <rank>      percentile rank of the percentile data in latency tests ({:.1})",
        d.percentile_rank
    );
    let _ = writeln!(s, "     -p <port>      TCP port to use for data exchange (13337)");
    let _ = writeln!(s, "     -6             Use IPv6 address for in data exchange");
    let _ = writeln!(s, "     -h             show this help message\n");
    let _ = writeln!(s, "  Output format:");
    let _ = writeln!(
        s,
        "     -N             use numeric formatting (thousands separator)"
    );
    let _ = writeln!(s, "     -f             print only final numbers");
    let _ = writeln!(s, "     -v             print CSV-formatted output");
    let _ = writeln!(
        s,
        "     -I             print extra information about the operation\n"
    );
    let _ = writeln!(s, "  UCT only:");
    let _ = writeln!(s, "     -d <device>    device to use for testing");
    let _ = writeln!(s, "     -x <tl>        transport to use for testing");
    let _ = writeln!(s, "     -D <layout>    data layout for sender side:");
    let _ = writeln!(
        s,
        "                        short    - short messages (default, cannot be used for get)"
    );
    let _ = writeln!(
        s,
        "                        shortiov - short io-vector messages (only for active messages)"
    );
    let _ = writeln!(
        s,
        "                        bcopy    - copy-out (cannot be used for atomics)"
    );
    let _ = writeln!(
        s,
        "                        zcopy    - zero-copy (cannot be used for atomics)"
    );
    let _ = writeln!(
        s,
        "                        contig   - contiguous buffers (UCP tests; the default there)"
    );
    let _ = writeln!(
        s,
        "                        iov      - scatter-gather list, one entry per -s size (UCP tag tests; AM send side)"
    );
    let _ = writeln!(
        s,
        "     -W <count>     flow control window size, for active messages ({})",
        d.fc_window
    );
    let _ = writeln!(
        s,
        "     -H <size>      active message header size ({}), included in message size",
        d.am_hdr_size
    );
    let _ = writeln!(
        s,
        "     -A <mode>      asynchronous progress mode (thread_spinlock)"
    );
    let _ = writeln!(
        s,
        "                        thread_spinlock - separate progress thread"
    );
    let _ = writeln!(
        s,
        "                        thread_mutex - same as thread_spinlock"
    );
    let _ = writeln!(
        s,
        "                        poll - (rucx) no thread; progress polls for events"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perftest::params::layout;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn opts(s: &str) -> Options {
        match parse(&args(s)).unwrap() {
            Parsed::Run(o) => *o,
            Parsed::Help => panic!("help"),
        }
    }

    #[test]
    fn parses_ucx_style_options() {
        let o = opts("-l -t am_bw -x self -d memory0 -s 8000 -D bcopy -n100 -w 5 -O 4 -W 63 -fv");
        let p = &o.params;
        assert_eq!(o.role, Role::Loopback);
        assert_eq!(p.desc().name, "am_bw");
        assert_eq!((p.tl.as_str(), p.dev.as_str()), ("self", "memory0"));
        assert_eq!(p.sizes, vec![8000]);
        assert_eq!(p.layout, layout::BCOPY);
        assert_eq!(
            (p.max_iter, p.warmup_iter, p.max_outstanding, p.fc_window),
            (100, 5, 4, 63)
        );
        assert!(o.print.final_only && o.print.csv);
    }

    #[test]
    fn host_makes_a_client_and_none_a_server() {
        assert_eq!(
            opts("-t am_lat -x tcp -d lo 10.0.0.1 -p 9").role,
            Role::Client("10.0.0.1".into())
        );
        assert_eq!(opts("").role, Role::Server);
        assert_eq!(opts("-p 9").port, 9);
        assert!(parse(&args("-l host")).is_err());
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&args("-t nope")).is_err());
        assert!(parse(&args("-n x")).is_err());
        assert!(parse(&args("-D fast")).is_err());
        assert!(parse(&args("-s 8,x")).is_err());
        assert!(parse(&args("-n")).is_err());
        assert!(parse(&args("-k")).is_err());
    }

    #[test]
    fn help_lists_every_test_that_runs() {
        let u = usage("rucx-perftest");
        let listed: Vec<&str> = u
            .lines()
            .filter_map(|l| l.split_once(" - UC").map(|(name, _)| name.trim()))
            .collect();
        // Every UCP test listed is implemented, and every implemented one is listed.
        for t in TESTS {
            let runs = t.api == Api::Uct || crate::perftest::ucp_bench::supported(t.name);
            assert_eq!(listed.contains(&t.name), runs, "{}:\n{u}", t.name);
        }
        assert_eq!(u.matches(" - UCP ").count(), 15, "{u}");
        assert!(u.contains("      tag_lat - UCP tag match latency"), "{u}");
        assert!(
            u.contains("    ucp_am_bw - UCP am bandwidth / message rate"),
            "{u}"
        );
        assert!(!u.contains("not implemented"), "{u}");
    }
}
