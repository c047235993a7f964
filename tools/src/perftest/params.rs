//! Test parameters of `rucx-perftest`: UCX `ucx_perftest`'s test table, defaults and per-test
//! options, plus the text form in which a client hands its parameters to the server.

use std::fmt::Write as _;

use ucs::{Error, Result, Status};

/// Which layer a test exercises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Uct,
    Ucp,
}

/// The operation a test measures (`ucx_perf_cmd_t`); `u8` so it can be a const generic.
pub mod cmd {
    pub const AM: u8 = 0;
    pub const PUT: u8 = 1;
    pub const GET: u8 = 2;
    pub const ADD: u8 = 3;
    pub const FADD: u8 = 4;
    pub const SWAP: u8 = 5;
    pub const CSWAP: u8 = 6;
    /// The UCP tests (run by `ucp_bench`).
    pub const UCP: u8 = 7;
}

/// Data layouts of the sender (`uct_perf_data_layout_t`); `u8` for const generics.
pub mod layout {
    pub const SHORT: u8 = 0;
    pub const SHORT_IOV: u8 = 1;
    pub const BCOPY: u8 = 2;
    pub const ZCOPY: u8 = 3;

    /// The name UCX prints in the "Data layout" line.
    pub fn name(l: u8) -> &'static str {
        match l {
            SHORT => "short",
            SHORT_IOV => "short iov",
            BCOPY => "bcopy",
            ZCOPY => "zcopy",
            _ => "(undefined)",
        }
    }
}

/// Communication pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestType {
    PingPong,
    StreamUni,
}

/// One entry of the test table.
pub struct TestDesc {
    pub name: &'static str,
    pub api: Api,
    pub cmd: u8,
    pub ty: TestType,
    pub desc: &'static str,
    /// Column title: "latency" (RTT/2 or per-op) or "overhead" (per-send time).
    pub overhead_lat: &'static str,
    /// Default `-O`.
    pub window: u32,
}

const fn t(
    name: &'static str,
    api: Api,
    cmd: u8,
    ty: TestType,
    desc: &'static str,
    overhead_lat: &'static str,
    window: u32,
) -> TestDesc {
    TestDesc {
        name,
        api,
        cmd,
        ty,
        desc,
        overhead_lat,
        window,
    }
}

use Api::{Ucp, Uct};
use TestType::{PingPong as PP, StreamUni as SU};

/// UCX 1.13's test table, same order, names, descriptions and default windows.
#[rustfmt::skip]
pub static TESTS: &[TestDesc] = &[
    t("am_lat", Uct, cmd::AM, PP, "active message latency", "latency", 1),
    t("put_lat", Uct, cmd::PUT, PP, "put latency", "latency", 1),
    t("add_lat", Uct, cmd::ADD, PP, "atomic add latency", "latency", 1),
    t("get", Uct, cmd::GET, SU, "get latency / bandwidth / message rate", "latency", 1),
    t("fadd", Uct, cmd::FADD, SU, "atomic fetch-and-add latency / rate", "latency", 1),
    t("swap", Uct, cmd::SWAP, SU, "atomic swap latency / rate", "latency", 1),
    t("cswap", Uct, cmd::CSWAP, SU, "atomic compare-and-swap latency / rate", "latency", 1),
    t("am_bw", Uct, cmd::AM, SU, "active message bandwidth / message rate", "overhead", 1),
    t("put_bw", Uct, cmd::PUT, SU, "put bandwidth / message rate", "overhead", 1),
    t("add_mr", Uct, cmd::ADD, SU, "atomic add message rate", "overhead", 1),
    t("tag_lat", Ucp, cmd::UCP, PP, "tag match latency", "latency", 1),
    t("tag_bw", Ucp, cmd::UCP, SU, "tag match bandwidth", "overhead", 32),
    t("tag_sync_lat", Ucp, cmd::UCP, PP, "tag sync match latency", "latency", 1),
    t("tag_sync_bw", Ucp, cmd::UCP, SU, "tag sync match bandwidth", "overhead", 32),
    t("ucp_put_lat", Ucp, cmd::UCP, PP, "put latency", "latency", 1),
    t("ucp_put_bw", Ucp, cmd::UCP, SU, "put bandwidth", "overhead", 32),
    t("ucp_get", Ucp, cmd::UCP, SU, "get latency / bandwidth / message rate", "latency", 1),
    t("ucp_add", Ucp, cmd::UCP, SU, "atomic add bandwidth / message rate", "overhead", 1),
    t("ucp_fadd", Ucp, cmd::UCP, SU, "atomic fetch-and-add latency / bandwidth / rate", "latency", 1),
    t("ucp_swap", Ucp, cmd::UCP, SU, "atomic swap latency / bandwidth / rate", "latency", 1),
    t("ucp_cswap", Ucp, cmd::UCP, SU, "atomic compare-and-swap latency / bandwidth / rate", "latency", 1),
    t("stream_bw", Ucp, cmd::UCP, SU, "stream bandwidth", "overhead", 1),
    t("stream_lat", Ucp, cmd::UCP, PP, "stream latency", "latency", 1),
    t("ucp_am_lat", Ucp, cmd::UCP, PP, "am latency", "latency", 1),
    t("ucp_am_bw", Ucp, cmd::UCP, SU, "am bandwidth / message rate", "overhead", 32),
];

/// The most flow-control window UCX allows (`UCT_PERF_TEST_MAX_FC_WINDOW`).
pub const MAX_FC_WINDOW: u32 = 127;
/// UCX's placeholder for "no transport/device given".
pub const NONE: &str = "<none>";

/// Asynchronous progress mode (`-A`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncKind {
    Thread,
    Poll,
}

/// Test parameters: what the client sends to the server (`ucx_perf_params_t` subset).
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub test: Option<usize>,
    pub tl: String,
    pub dev: String,
    pub sizes: Vec<usize>,
    pub iov_stride: usize,
    pub max_iter: u64,
    pub warmup_iter: u64,
    pub warmup_time: f64,
    pub report_interval: f64,
    /// 0 = the test's default window.
    pub max_outstanding: u32,
    pub layout: u8,
    pub fc_window: u32,
    pub am_hdr_size: usize,
    pub percentile_rank: f64,
    pub loopback: bool,
    pub one_sided: bool,
    pub validate: bool,
    pub async_mode: AsyncKind,
    /// UCP tests' `-D send[,recv]` datatypes: `iov` (scatter-gather, one entry per `-s`
    /// size) instead of `contig`.
    pub ucp_send_iov: bool,
    pub ucp_recv_iov: bool,
}

impl Default for Params {
    /// UCX's defaults (`init_test_params`).
    fn default() -> Params {
        Params {
            test: None,
            tl: NONE.into(),
            dev: NONE.into(),
            sizes: vec![8],
            iov_stride: 0,
            max_iter: 1_000_000,
            warmup_iter: 10_000,
            warmup_time: 0.1,
            report_interval: 1.0,
            max_outstanding: 0,
            layout: layout::SHORT,
            fc_window: MAX_FC_WINDOW,
            am_hdr_size: 8,
            percentile_rank: 50.0,
            loopback: false,
            one_sided: false,
            ucp_send_iov: false,
            ucp_recv_iov: false,
            validate: false,
            async_mode: AsyncKind::Thread,
        }
    }
}

impl Params {
    /// The selected test (call after [`Params::adjust`] succeeded).
    pub fn desc(&self) -> &'static TestDesc {
        &TESTS[self.test.expect("test selected")]
    }

    /// Total message size (sum of the scatter-gather list).
    pub fn message_size(&self) -> usize {
        // Saturating: sizes may come from a peer; an absurd total is then refused by the
        // capability checks instead of overflowing.
        self.sizes.iter().fold(0usize, |a, &s| a.saturating_add(s))
    }

    /// UCX's `adjust_test_params`: a test is required; `-O 0` means the test's default window.
    pub fn adjust(&mut self) -> Result<()> {
        let Some(i) = self.test else {
            ucs::error!("command line: missing test name (give one with -t, e.g. -t am_lat)");
            return Err(Status::InvalidParam.into());
        };
        if self.max_outstanding == 0 {
            self.max_outstanding = TESTS[i].window;
        }
        Ok(())
    }

    /// UCX's `check_params`: UCT tests need `-d` and `-x`; UCP tests must be implemented here.
    pub fn check(&self) -> Result<()> {
        if self.desc().api == Api::Ucp {
            if !super::ucp_bench::supported(self.desc().name) {
                ucs::error!(
                    test = self.desc().name,
                    "this UCP test is not implemented by rucx-perftest yet"
                );
                return Err(Status::Unsupported.into());
            }
            let name = self.desc().name;
            let tag = name.starts_with("tag_");
            let am = name.starts_with("ucp_am_");
            if (self.ucp_send_iov && !(tag || am)) || (self.ucp_recv_iov && !tag) {
                ucs::error!(
                    test = name,
                    "-D iov: rucx-perftest sends iov with the tag and active-message tests and \
                     receives iov with the tag tests only; use -D contig (the default)"
                );
                return Err(Status::Unsupported.into());
            }
            // Transports come from RUCX_TLS, as UCX's from UCX_TLS.
            return Ok(());
        }
        if self.dev == NONE {
            ucs::error!("A device must be specified with -d flag for UCT test");
            return Err(Status::InvalidParam.into());
        }
        if self.tl == NONE {
            ucs::error!("A transport must be specified with -x flag for UCT test");
            return Err(Status::InvalidParam.into());
        }
        Ok(())
    }

    /// Applies one test option (UCX's `parse_test_params`).
    pub fn apply(&mut self, opt: char, arg: &str) -> Result<()> {
        match opt {
            'd' => self.dev = arg.into(),
            'x' => self.tl = arg.into(),
            't' => match TESTS.iter().position(|t| t.name == arg) {
                Some(i) => self.test = Some(i),
                None => return bad("Invalid option argument for -t (see -h for the test list)"),
            },
            'D' => {
                // UCP tests take a send and an optional receive datatype (`contig|iov`).
                let mut dts = arg.split(',');
                let first = dts.next().unwrap_or_default();
                if matches!(first, "contig" | "iov") {
                    let second = dts.next().unwrap_or(first);
                    if !matches!(second, "contig" | "iov") || dts.next().is_some() {
                        return bad("Invalid option argument for -D (contig|iov[,contig|iov])");
                    }
                    self.ucp_send_iov = first == "iov";
                    self.ucp_recv_iov = second == "iov";
                    return Ok(());
                }
                self.layout = match arg {
                    "short" => layout::SHORT,
                    "shortiov" => layout::SHORT_IOV,
                    "bcopy" => layout::BCOPY,
                    "zcopy" => layout::ZCOPY,
                    _ => {
                        return bad("Invalid option argument for -D (short|shortiov|bcopy|zcopy, or \
                             contig|iov for UCP tests)")
                    }
                }
            }
            'i' => self.iov_stride = num(opt, arg)?,
            'l' => self.loopback = true,
            'n' => self.max_iter = num(opt, arg)?,
            's' => self.sizes = sizes(arg)?,
            'H' => self.am_hdr_size = num(opt, arg)?,
            'W' => self.fc_window = num(opt, arg)?,
            'O' => self.max_outstanding = num(opt, arg)?,
            'w' => self.warmup_iter = num(opt, arg)?,
            'o' => self.one_sided = true,
            'V' => self.validate = true,
            'q' => {}
            'R' => match arg.parse::<f64>() {
                Ok(r) if (0.0..=100.0).contains(&r) => self.percentile_rank = r,
                _ => return bad("Invalid option argument for -R (a percentile rank 0..100)"),
            },
            'A' => {
                self.async_mode = match arg {
                    "thread" | "thread_spinlock" | "thread_mutex" => AsyncKind::Thread,
                    "poll" => AsyncKind::Poll,
                    _ => return bad("Invalid option argument for -A (thread_spinlock|thread_mutex|poll)"),
                }
            }
            'm' => {
                if arg.split(',').any(|m| m != "host") {
                    return bad("unsupported memory type: only \"host\" memory is available");
                }
            }
            'M' => {
                if arg != "single" {
                    return bad("UCT tests run single-threaded: -M single only");
                }
            }
            _ => return Err(Status::InvalidParam.into()),
        }
        Ok(())
    }

    /// Serializes for the out-of-band exchange: `key=value` lines, version first.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::from("rucx-perftest-params 1\n");
        let sizes: Vec<String> = self.sizes.iter().map(|v| v.to_string()).collect();
        let test = self.test.map_or("", |i| TESTS[i].name);
        let _ = write!(
            s,
            "test={test}\ntl={}\ndev={}\nsizes={}\nstride={}\niters={}\nwarmup={}\nwarmup_time={}\n\
             report_interval={}\noutstanding={}\nlayout={}\nfc_window={}\nam_hdr={}\nrank={}\n\
             one_sided={}\nvalidate={}\nasync={}\nsend_dt={}\nrecv_dt={}\n",
            self.tl,
            self.dev,
            sizes.join(","),
            self.iov_stride,
            self.max_iter,
            self.warmup_iter,
            self.warmup_time,
            self.report_interval,
            self.max_outstanding,
            self.layout,
            self.fc_window,
            self.am_hdr_size,
            self.percentile_rank,
            self.one_sided as u8,
            self.validate as u8,
            if self.async_mode == AsyncKind::Poll {
                "poll"
            } else {
                "thread"
            },
            if self.ucp_send_iov { "iov" } else { "contig" },
            if self.ucp_recv_iov { "iov" } else { "contig" },
        );
        s.into_bytes()
    }

    /// Parses what [`Params::encode`] produced; anything malformed is `InvalidParam`.
    pub fn decode(data: &[u8]) -> Result<Params> {
        let text = std::str::from_utf8(data).map_err(|_| proto("parameters are not UTF-8"))?;
        let mut lines = text.lines();
        if lines.next() != Some("rucx-perftest-params 1") {
            return Err(proto("not a rucx-perftest client, or another version"));
        }
        let mut p = Params::default();
        for line in lines {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| proto("malformed parameter line"))?;
            let r: Result<()> = (|| {
                match k {
                    "test" => {
                        p.test = Some(
                            TESTS
                                .iter()
                                .position(|t| t.name == v)
                                .ok_or(Status::InvalidParam)?,
                        )
                    }
                    "tl" => p.tl = v.into(),
                    "dev" => p.dev = v.into(),
                    "sizes" => p.sizes = sizes(v)?,
                    "stride" => p.iov_stride = v.parse().map_err(|_| Status::InvalidParam)?,
                    "iters" => p.max_iter = v.parse().map_err(|_| Status::InvalidParam)?,
                    "warmup" => p.warmup_iter = v.parse().map_err(|_| Status::InvalidParam)?,
                    "warmup_time" => p.warmup_time = v.parse().map_err(|_| Status::InvalidParam)?,
                    "report_interval" => p.report_interval = v.parse().map_err(|_| Status::InvalidParam)?,
                    "outstanding" => p.max_outstanding = v.parse().map_err(|_| Status::InvalidParam)?,
                    "layout" => p.layout = v.parse().map_err(|_| Status::InvalidParam)?,
                    "fc_window" => p.fc_window = v.parse().map_err(|_| Status::InvalidParam)?,
                    "am_hdr" => p.am_hdr_size = v.parse().map_err(|_| Status::InvalidParam)?,
                    "rank" => p.percentile_rank = v.parse().map_err(|_| Status::InvalidParam)?,
                    "one_sided" => p.one_sided = v == "1",
                    "validate" => p.validate = v == "1",
                    "send_dt" => p.ucp_send_iov = v == "iov",
                    "recv_dt" => p.ucp_recv_iov = v == "iov",
                    "async" => {
                        p.async_mode = if v == "poll" {
                            AsyncKind::Poll
                        } else {
                            AsyncKind::Thread
                        }
                    }
                    _ => {} // newer keys are ignored
                }
                Ok(())
            })();
            r.map_err(|_| proto("bad parameter value"))?;
        }
        if p.layout > layout::ZCOPY || p.sizes.is_empty() {
            return Err(proto("bad layout or size list"));
        }
        Ok(p)
    }
}

fn proto(what: &str) -> Error {
    ucs::error!("out-of-band parameters from the client: {what}; use the same rucx-perftest on both sides");
    Status::InvalidParam.into()
}

fn bad<T>(msg: &str) -> Result<T> {
    ucs::error!("{msg}");
    Err(Status::InvalidParam.into())
}

pub fn num<T: std::str::FromStr>(opt: char, arg: &str) -> Result<T> {
    arg.trim().parse().map_err(|_| {
        ucs::error!("Invalid option argument for -{opt}: {arg:?} is not a non-negative number");
        Error::from(Status::InvalidParam)
    })
}

fn sizes(arg: &str) -> Result<Vec<usize>> {
    arg.split(',')
        .enumerate()
        .map(|(i, s)| {
            s.trim().parse().map_err(|_| {
                ucs::error!("Invalid option substring argument at position {i} of -s {arg:?}");
                Error::from(Status::InvalidParam)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(opts: &[(char, &str)]) -> Params {
        let mut p = Params::default();
        for &(o, v) in opts {
            p.apply(o, v).unwrap();
        }
        p
    }

    #[test]
    fn applies_ucx_test_options() {
        let p = params(&[
            ('t', "am_bw"),
            ('s', "8000"),
            ('D', "bcopy"),
            ('n', "100"),
            ('W', "63"),
        ]);
        assert_eq!(p.desc().name, "am_bw");
        assert_eq!(
            (p.sizes.clone(), p.layout, p.max_iter, p.fc_window),
            (vec![8000], layout::BCOPY, 100, 63)
        );
        let mut p = Params::default();
        assert!(p.apply('t', "nope").is_err());
        assert!(p.apply('n', "x").is_err());
        assert!(p.apply('D', "fast").is_err());
        assert!(p.apply('s', "8,x").is_err());
        assert!(p.apply('R', "101").is_err());
    }

    /// UCP tests take UCX's `-D contig|iov[,contig|iov]` (send, receive): iov for tag tests
    /// both ways, for active messages on the send side; elsewhere `Unsupported`. The choice
    /// travels to the server.
    #[test]
    fn ucp_datatypes() {
        let p = params(&[('t', "tag_lat"), ('D', "contig"), ('s', "8,64")]);
        assert!(!p.ucp_send_iov && !p.ucp_recv_iov);
        assert_eq!(p.layout, layout::SHORT, "contig leaves the uct layout alone");
        p.check().unwrap();
        for dt in ["iov", "contig,iov", "iov,contig"] {
            let p = params(&[('t', "tag_bw"), ('D', dt)]);
            p.check().unwrap();
            let back = Params::decode(&p.encode()).unwrap();
            assert_eq!(
                (back.ucp_send_iov, back.ucp_recv_iov),
                (p.ucp_send_iov, p.ucp_recv_iov)
            );
        }
        let p = params(&[('t', "ucp_am_bw"), ('D', "iov,contig")]);
        p.check().unwrap();
        for (t, dt) in [
            ("ucp_am_bw", "contig,iov"),
            ("stream_bw", "iov"),
            ("ucp_put_bw", "iov"),
        ] {
            let p = params(&[('t', t), ('D', dt)]);
            assert_eq!(p.check().unwrap_err(), Status::Unsupported, "-t {t} -D {dt}");
        }
        let mut p = Params::default();
        assert!(p.apply('D', "contig,zcopy").is_err());
        assert!(p.apply('D', "iov,iov,iov").is_err());
    }

    #[test]
    fn default_window_comes_from_the_test() {
        let mut p = params(&[('t', "am_bw")]);
        p.adjust().unwrap();
        assert_eq!(p.max_outstanding, 1);
        assert!(Params::default().adjust().is_err());
    }

    #[test]
    fn params_round_trip_through_the_wire_text() {
        let mut p = params(&[
            ('t', "put_bw"),
            ('x', "tcp"),
            ('d', "lo"),
            ('s', "64,128"),
            ('D', "zcopy"),
            ('n', "7"),
            ('V', ""),
            ('R', "99"),
        ]);
        p.adjust().unwrap();
        let q = Params::decode(&p.encode()).unwrap();
        assert_eq!(p, q);
        assert!(Params::decode(b"garbage").is_err());
        assert!(Params::decode(b"rucx-perftest-params 1\niters=x\n").is_err());
    }

    /// The server's path for what a client sent (`serve`: decode, adjust, header, check) over
    /// random, truncated and mutated parameter texts: never a panic; what decodes is sane and
    /// re-encodes to a text that decodes to the same parameters.
    #[test]
    fn decode_survives_random_and_mutated_peer_input() {
        let mut p = params(&[
            ('t', "am_bw"),
            ('x', "tcp"),
            ('d', "lo"),
            ('s', "8,16,64"),
            ('D', "zcopy"),
        ]);
        p.adjust().unwrap();
        let valid = p.encode();
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n.max(1) as u64) as usize
        };
        const ALPHABET: &[u8] = b"=\n,.-+0123456789eEinfaNxtsl_\xff\r ";
        let (mut ok, mut bad) = (0, 0);
        for i in 0..3000 {
            let mut v = if i % 5 == 0 {
                (0..next(80)).map(|_| ALPHABET[next(ALPHABET.len())]).collect()
            } else {
                valid.clone()
            };
            for _ in 0..next(4) {
                if !v.is_empty() {
                    let j = next(v.len());
                    v[j] = ALPHABET[next(ALPHABET.len())];
                }
            }
            if next(3) == 0 {
                v.truncate(next(v.len() + 1));
            }
            let Ok(mut q) = Params::decode(&v) else {
                bad += 1;
                continue;
            };
            ok += 1;
            assert!(q.layout <= layout::ZCOPY && !q.sizes.is_empty());
            if q.test.is_some() {
                let again = Params::decode(&q.encode()).expect("re-encoded parameters decode");
                assert_eq!(again.encode(), q.encode());
            }
            if q.adjust().is_ok() {
                // `message_size()` saturates, so even absurd sizes print a header.
                {
                    let fl = super::super::cli::PrintFlags {
                        test: true,
                        results: true,
                        ..Default::default()
                    };
                    let _ = super::super::report::header(&q, fl);
                }
                let _ = q.check();
            }
        }
        assert!(
            ok > 100 && bad > 100,
            "{ok} accepted, {bad} refused: the inputs miss a side"
        );
    }
}
