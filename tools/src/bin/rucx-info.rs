//! `rucx-info`: what this rucx installation offers (modeled on `ucx_info`).
//!
//! `-v` version, `-d` devices and their attributes, `-c` configuration, `-m` modules, `-e` UCP
//! endpoint lanes and protocols; several
//! may be combined. Uses the same context as applications (`rucx::context()`: built-in modules
//! plus plugins), so what it lists is what they get.
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::ExitCode;

use rucx_tools::info;

fn usage() -> String {
    "Usage: rucx-info [options]\n\
     \x20 -v         version and plugin ABI version\n\
     \x20 -d         memory domains, transports and devices with their attributes\n\
     \x20 -t <tl>    with -d: only transport <tl>\n\
     \x20 -c         configuration variables, current values and documentation\n\
     \x20 -m         modules found (built-in and plugins) and their status\n\
     \x20 -e         UCP: the lanes and protocols of a worker's endpoint to itself (RUCX_TLS,\n\
     \x20            RUCX_NET_DEVICES and the thresholds apply)\n\
     \x20 -p         with -e: to a second worker of this process instead\n\
     \x20 -h, --help this help\n\
     Environment: RUCX_MODULE_DIR (plugin directories), RUCX_MODULES (allow/deny list),\n\
     RUCX_LOG_LEVEL.\n"
        .into()
}

#[derive(Default)]
struct Opts {
    version: bool,
    devices: bool,
    config: bool,
    modules: bool,
    endpoint: bool,
    peer: bool,
    tl: Option<String>,
}

fn parse(argv: &[String]) -> Result<Option<Opts>, String> {
    let mut o = Opts::default();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        if arg == "--help" {
            return Ok(None);
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        for (i, c) in flags.char_indices() {
            match c {
                'v' => o.version = true,
                'd' => o.devices = true,
                'c' => o.config = true,
                'm' => o.modules = true,
                'e' => o.endpoint = true,
                'p' => o.peer = true,
                'h' => return Ok(None),
                't' => {
                    let rest = &flags[i + 1..];
                    let v = if rest.is_empty() {
                        it.next().cloned()
                    } else {
                        Some(rest.to_string())
                    };
                    o.tl = Some(v.ok_or("option -t needs a transport name")?);
                    break;
                }
                _ => return Err(format!("unknown option -{c}")),
            }
        }
    }
    if !(o.version || o.devices || o.config || o.modules || o.endpoint) {
        return Err("nothing to show: pick at least one of -v, -d, -c, -m, -e".into());
    }
    if o.peer && !o.endpoint {
        return Err("-p goes with -e".into());
    }
    Ok(Some(o))
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&argv) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rucx-info: {e}\n{}", usage());
            return ExitCode::from(2);
        }
    };
    ucs::log::init();
    rucx::ucp::config::register();
    let ctx = rucx::context();
    let mut out = String::new();
    if o.version {
        info::version(&ctx, &mut out);
    }
    if o.modules {
        info::modules::report(ctx.modules(), &mut out);
    }
    let mut failed = false;
    if o.devices {
        if let Err(e) = info::devices::report(&ctx, o.tl.as_deref(), &mut out) {
            eprintln!("rucx-info: {e}");
            failed = true;
        }
    }
    if o.endpoint {
        if let Err(e) = info::ucp::report(&ctx, o.peer, &mut out) {
            eprintln!("rucx-info: UCP endpoint: {e}");
            failed = true;
        }
    }
    if o.config {
        let invalid = info::config::report(&mut out);
        if invalid > 0 {
            eprintln!("rucx-info: {invalid} configuration variable(s) have invalid values (marked INVALID)");
            failed = true;
        }
    }
    // A closed pipe (`rucx-info -d | head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
