//! UCP's configuration: the `RUCX_*` variables of [`UCP_CONFIG`] (prefix `""`: `RUCX_TLS`,
//! `RUCX_RNDV_THRESH`, ...), read and checked into a [`UcpConfig`]; `RUCX_TLS` filtering
//! ([`TlsFilter`]); and network-device filtering ([`device_allowed`], over
//! `RUCX_NET_DEVICES` of [`ucs::config::NET_TABLE`], the variable tcp and ib read too).

mod limits;
mod tls;

use std::time::Duration;

use ucs::config::{
    AllowList, ConfigError, ConfigField, ConfigKind, ConfigReader, ConfigTable, MemUnits, Overrides,
    TimeValue, ValueSource,
};
use ucs::{Error, Result};

pub use limits::{ByteLimits, PassiveLimits, ReasmLimits, DEFAULT_REASM_TIMEOUT};
pub use tls::{alias_members, alias_names, Allowed, TlsFilter, TlsSpec};
pub use ucs::config::{device_allowed, device_matches, NET_TABLE};

/// Names of `RUCX_RNDV_SCHEME`, in [`RndvScheme`] order.
pub const RNDV_SCHEMES: &[&str] = &["auto", "get_zcopy", "put_zcopy", "am"];

/// Most lanes one operation may be spread over (the bound of `MAX_EAGER_LANES` and
/// `MAX_RNDV_LANES`; UCX's `UCP_MAX_LANES`).
pub const MAX_LANES_PER_OP: usize = 8;

/// `CM_TIMEOUT=auto`.
pub const DEFAULT_CM_TIMEOUT: Duration = Duration::from_secs(10);

/// `KEEPALIVE_INTERVAL=auto`.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// `SEG_SIZE=auto`.
pub const DEFAULT_SEG_SIZE: usize = 8192;

/// The UCP context's variables (`RUCX_<NAME>`).
pub static UCP_CONFIG: ConfigTable = ConfigTable {
    name: "ucp",
    prefix: "",
    fields: FIELDS,
};

const FIELDS: &[ConfigField] = &[
    ConfigField::new(
        "TLS",
        "all",
        ConfigKind::AllowList,
        "Transports to use: a comma list of names (tcp, self, rc_verbs, ud_verbs ...) or aliases \
             (rc: rc_verbs with ud_verbs for wireup only; ud; ib: rc and ud; sm/shm: shared memory), \
             name:aux for wireup only; ^list to leave them out; all.",
    ),
    ConfigField::new(
        "SHM_DEVICES",
        "all",
        ConfigKind::AllowList,
        "Shared-memory devices to use (the RUCX_NET_DEVICES of devices of type shm: posix's \
             memory, ofi's shm ...): names, globs, ^list to leave them out, or all.",
    ),
    ConfigField::new(
        "BCOPY_THRESH",
        "auto",
        ConfigKind::MemUnits,
        "Messages from this size up are copied into a transport buffer (bcopy) instead of \
             sent inline (short); auto: the largest size the lane sends inline.",
    ),
    ConfigField::new(
        "ZCOPY_THRESH",
        "auto",
        ConfigKind::MemUnits,
        "Messages from this size up are sent zero-copy from the (registered) user buffer; \
             auto: where that is estimated faster than copying; inf: never.",
    ),
    ConfigField::new(
        "RNDV_THRESH",
        "auto",
        ConfigKind::MemUnits,
        "Messages from this size up use rendezvous (the data moves once the receiver is \
             ready); auto: estimated from the lanes, see RNDV_PERF_DIFF; inf: never.",
    ),
    ConfigField::new(
        "RNDV_SCHEME",
        "auto",
        ConfigKind::Enum(RNDV_SCHEMES),
        "How rendezvous moves the data: get_zcopy (the receiver reads it where a lane can), am \
             (fragments on the AM lane); auto: get_zcopy, else am. put_zcopy: Unsupported.",
    ),
    ConfigField::new(
        "RNDV_PERF_DIFF",
        "1",
        ConfigKind::Float,
        "Percent by which rendezvous may be estimated slower than eager zcopy where the auto \
             RNDV_THRESH switches to it (it spares the sender's CPU); 0 up to, not including, 100.",
    ),
    ConfigField::new(
        "MAX_EAGER_LANES",
        "1",
        ConfigKind::Uint,
        "Most lanes (devices) one eager message's fragments are spread over (1..8).",
    ),
    ConfigField::new(
        "MAX_RNDV_LANES",
        "2",
        ConfigKind::Uint,
        "Most lanes (devices) one rendezvous transfer is split over (1..8).",
    ),
    ConfigField::new(
        "SEG_SIZE",
        "8k",
        ConfigKind::MemUnits,
        "Size of the buffers a worker allocates for its own use (staged headers, fragments \
             of received messages); 256 up to 1g.",
    ),
    ConfigField::new(
        "NUM_EPS",
        "auto",
        ConfigKind::AutoUint,
        "Endpoints a worker is expected to have; only scores lanes (some transports' latency \
             grows with it). auto: the application's estimate, else 1.",
    ),
    ConfigField::new(
        "NUM_PPN",
        "auto",
        ConfigKind::AutoUint,
        "Processes expected per node; only scores lanes (they share a device's bandwidth). \
             auto: the application's estimate, else 1.",
    ),
    ConfigField::new(
        "PROTO_INFO",
        "n",
        ConfigKind::Bool,
        "Print each new endpoint configuration: its lanes and the protocol used for each \
             message-size range.",
    ),
    ConfigField::new(
        "ADAPTIVE_PROGRESS",
        "y",
        ConfigKind::Bool,
        "Progress only the interfaces an endpoint uses; the others sleep on their event fd and \
             wake for incoming wireup (off: progress every interface on every call).",
    ),
    ConfigField::new(
        "ATOMIC_EMULATE",
        "n",
        ConfigKind::Bool,
        "Do every atomic op but 64-bit compare-and-swap in compare-and-swap rounds, as on a \
             lane that lacks the op (slower; for checking the emulation).",
    ),
    ConfigField::new(
        "CM_TIMEOUT",
        "10s",
        ConfigKind::Time,
        "How long a client's connect_sockaddr handshake may take, from the call until the \
             endpoint is connected (TCP connection, the server's address, its acceptance, \
             wireup); past it the connect fails with TimedOut.",
    ),
    ConfigField::new(
        "REASM_PEER_LIMIT",
        "256m",
        ConfigKind::MemUnits,
        "Most bytes the messages one peer worker is sending in fragments may hold here while \
             they arrive (their buffers, plus 256 per message); a peer that needs more has its \
             endpoints failed with ExceedsLimit. Messages into posted tag receives count only \
             the 256.",
    ),
    ConfigField::new(
        "REASM_WORKER_LIMIT",
        "1g",
        ConfigKind::MemUnits,
        "Most bytes all messages arriving in fragments may hold in one worker; past it the \
             peer whose message would exceed it has its endpoints failed with ExceedsLimit.",
    ),
    ConfigField::new(
        "REASM_TIMEOUT",
        "30s",
        ConfigKind::Time,
        "A message arriving in fragments that receives none for this long is dropped (a tag \
             receive it was filling completes with TimedOut). inf: never.",
    ),
    ConfigField::new(
        "TAG_UNEXP_PEER_LIMIT",
        "256m",
        ConfigKind::MemUnits,
        "Most bytes the tag messages from one peer worker that no receive matched yet may \
             hold here (rendezvous keys, fragmented messages' data, plus 256 per message); past \
             it the peer's endpoints fail with ExceedsLimit.",
    ),
    ConfigField::new(
        "TAG_UNEXP_WORKER_LIMIT",
        "1g",
        ConfigKind::MemUnits,
        "Most bytes all unexpected tag messages may hold in one worker. A plain eager message \
             (its header names no sender) counts only here and is dropped past it; any other \
             fails its sender's endpoints.",
    ),
    ConfigField::new(
        "RNDV_TIMEOUT",
        "30s",
        ConfigKind::Time,
        "A rendezvous receive fetching by RTR that receives no data from the sender for this \
             long completes with TimedOut, and the sender is told so. inf: never.",
    ),
    ConfigField::new(
        "STREAM_PEER_LIMIT",
        "256m",
        ConfigKind::MemUnits,
        "Most bytes of one peer worker's streams that arrived and were not read yet may hold \
             here (plus 256 per message); past it the peer's endpoints fail with ExceedsLimit.",
    ),
    ConfigField::new(
        "STREAM_WORKER_LIMIT",
        "1g",
        ConfigKind::MemUnits,
        "Most bytes all unread stream messages may hold in one worker; past it the peer whose \
             message would exceed it has its endpoints failed with ExceedsLimit.",
    ),
    ConfigField::new(
        "PASSIVE_PEER_LIMIT",
        "4096",
        ConfigKind::Uint,
        "Most endpoints one peer worker's wireup requests may make here that the application \
             has not adopted (by connecting toward that peer); later requests are refused, logged.",
    ),
    ConfigField::new(
        "PASSIVE_WORKER_LIMIT",
        "16384",
        ConfigKind::Uint,
        "Most endpoints all peers' wireup requests may make in one worker that the application \
             has not adopted; later requests are refused, logged, until some close.",
    ),
    ConfigField::new(
        "EP_SEND_QUEUE_LIMIT",
        "1g",
        ConfigKind::MemUnits,
        "Most bytes of data one endpoint's sends may hold while they wait for its lanes (a \
             peer that stops reading makes them wait); past it the endpoint fails with \
             ExceedsLimit, in every error mode.",
    ),
    ConfigField::new(
        "KEEPALIVE_INTERVAL",
        "20s",
        ConfigKind::Time,
        "How often endpoints in error mode Peer probe their peer; one that answers no probe \
             for three intervals fails with EndpointTimeout. inf: never.",
    ),
];

/// Makes [`UCP_CONFIG`] known to `ucs::config` (`rucx-info -c`, unknown-variable checks).
/// Idempotent and cheap; the context calls it before reading its configuration.
pub fn register() {
    ucs::config::register(&UCP_CONFIG);
}

/// A protocol threshold (`BCOPY_THRESH`, `ZCOPY_THRESH`, `RNDV_THRESH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threshold {
    /// Computed from the lanes.
    Auto,
    /// This many bytes; `inf` is `usize::MAX` (never switch).
    Bytes(usize),
}

impl Threshold {
    /// The threshold with `auto` replaced by `auto_value`.
    pub fn or_auto(self, auto_value: usize) -> usize {
        match self {
            Threshold::Auto => auto_value,
            Threshold::Bytes(b) => b,
        }
    }
}

/// `RUCX_RNDV_SCHEME`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RndvScheme {
    /// `get_zcopy` where a lane can, else `am` (the default).
    Auto,
    /// The receiver reads the data with `get_zcopy` where a lane can.
    GetZcopy,
    /// The sender writes the data with `put_zcopy` (not implemented: a context asking for
    /// it fails with `Unsupported`).
    PutZcopy,
    /// The data comes in active messages (no RMA).
    Am,
}

/// The checked UCP configuration of one context.
#[derive(Clone, Debug, PartialEq)]
pub struct UcpConfig {
    /// `RUCX_TLS` (parse with [`TlsFilter::parse`]; checked to parse by [`UcpConfig::read`]).
    pub tls: AllowList,
    /// `RUCX_TLS` as written, for messages.
    pub tls_spec: String,
    /// `RUCX_SHM_DEVICES`.
    pub shm_devices: AllowList,
    /// `RUCX_BCOPY_THRESH`: from this size messages are copied into a transport buffer
    /// (bcopy) instead of sent inline (short).
    pub bcopy_thresh: Threshold,
    /// `RUCX_ZCOPY_THRESH`: from this size messages go zero-copy from the user's buffer.
    pub zcopy_thresh: Threshold,
    /// `RUCX_RNDV_THRESH`: from this size messages go by rendezvous.
    pub rndv_thresh: Threshold,
    /// `RUCX_RNDV_SCHEME`: how rendezvous data moves.
    pub rndv_scheme: RndvScheme,
    /// Percent, `0.0..100.0`.
    pub rndv_perf_diff: f64,
    /// `1..=MAX_LANES_PER_OP`.
    pub max_eager_lanes: usize,
    /// `1..=MAX_LANES_PER_OP`.
    pub max_rndv_lanes: usize,
    /// Bytes, 256 up to 1 GiB.
    pub seg_size: usize,
    /// `None`: auto (the application's estimate, else 1); else at least 1.
    pub num_eps: Option<usize>,
    /// `None`: auto; else at least 1.
    pub num_ppn: Option<usize>,
    /// `RUCX_PROTO_INFO`: print each new endpoint configuration (lanes, protocol per size).
    pub proto_info: bool,
    /// Idle interfaces sleep on their event fd instead of being progressed.
    pub adaptive_progress: bool,
    /// Atomics by compare-and-swap rounds only.
    pub atomic_emulate: bool,
    /// `None`: keepalive off (`inf`).
    pub keepalive_interval: Option<Duration>,
    /// `connect_sockaddr`'s bound on the connection and the server's address.
    pub cm_timeout: Duration,
    /// `RUCX_REASM_*`: what messages arriving in fragments may hold, and for how long.
    pub reasm: ReasmLimits,
    /// `RUCX_TAG_UNEXP_*`: what unexpected tag messages may hold.
    pub tag_unexp: ByteLimits,
    /// `RUCX_RNDV_TIMEOUT`: how long a rendezvous receive may wait for the sender's data;
    /// `None`: for ever.
    pub rndv_timeout: Option<Duration>,
    /// `RUCX_STREAM_*`: what stream bytes not read yet may hold.
    pub stream_unread: ByteLimits,
    /// `RUCX_PASSIVE_*`: endpoints peers' wireup requests may make.
    pub passive: PassiveLimits,
    /// `RUCX_EP_SEND_QUEUE_LIMIT`: bytes one endpoint's queued sends may hold.
    pub send_queue_limit: usize,
}

/// An out-of-range value: the same message (and log line) as a value that does not parse,
/// saying whether it was set in code.
fn invalid(table: &ConfigTable, code: &Overrides, name: &str, expected: &str) -> Error {
    let (value, source) = table
        .with(code)
        .raw(name)
        .map(|r| (r.value, r.source))
        .unwrap_or_else(|_| (String::new(), ValueSource::Env));
    let e = ConfigError::Invalid {
        var: table.env_name(name),
        value,
        expected: expected.to_string(),
        source,
    };
    ucs::error!("{e}");
    Error::from(e)
}

/// Reads one table (UCP_CONFIG, or a copy under another prefix in tests) with code on top.
struct Reader<'a> {
    table: &'static ConfigTable,
    code: &'a Overrides,
}

impl Reader<'_> {
    fn t(&self) -> ConfigReader<'_> {
        self.table.with(self.code)
    }

    fn invalid(&self, name: &str, expected: &str) -> Error {
        invalid(self.table, self.code, name, expected)
    }
}

fn threshold(r: &Reader<'_>, name: &str) -> Result<Threshold> {
    Ok(match r.t().get_memunits(name)? {
        MemUnits::Auto => Threshold::Auto,
        MemUnits::Inf => Threshold::Bytes(usize::MAX),
        MemUnits::Bytes(b) => Threshold::Bytes(usize::try_from(b).unwrap_or(usize::MAX)),
    })
}

fn lanes(r: &Reader<'_>, name: &str) -> Result<usize> {
    let n = r.t().get_uint(name)?;
    if !(1..=MAX_LANES_PER_OP as u64).contains(&n) {
        return Err(r.invalid(name, &format!("a lane count from 1 to {MAX_LANES_PER_OP}")));
    }
    Ok(n as usize)
}

/// `auto` or a count of at least 1.
fn auto_count(r: &Reader<'_>, name: &str) -> Result<Option<usize>> {
    const EXPECTED: &str = "auto or a count of at least 1";
    let v = r.t().read(name).map_err(|e| {
        ucs::error!("{e}");
        Error::from(e)
    })?;
    let s = match v {
        ucs::config::ConfigValue::Str(s) => s,
        _ => return Err(r.invalid(name, EXPECTED)),
    };
    if s.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match ucs::config::parse_uint(&s) {
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        _ => Err(r.invalid(name, EXPECTED)),
    }
}

impl UcpConfig {
    /// Reads [`UCP_CONFIG`] with `code` (set in code, e.g. a context builder's `config()`)
    /// on top of the environment, and checks every variable: an invalid one gives
    /// `InvalidParam` naming the variable, the value and what is accepted (also logged once).
    pub fn read(code: &Overrides) -> Result<UcpConfig> {
        Self::read_table(&UCP_CONFIG, code)
    }

    fn read_table(table: &'static ConfigTable, code: &Overrides) -> Result<UcpConfig> {
        let r = &Reader { table, code };
        let t = r.t();
        let tls = t.get_allow_list("TLS")?;
        let tls_spec = t.get_str("TLS")?.trim().to_string();
        let shm_devices = t.get_allow_list("SHM_DEVICES")?;
        // An empty list, a glob or a device name in RUCX_TLS is a mistake worth stopping for.
        if let Err(expected) = TlsFilter::from_list(&tls) {
            return Err(r.invalid("TLS", &expected));
        }
        let bcopy_thresh = threshold(r, "BCOPY_THRESH")?;
        let zcopy_thresh = threshold(r, "ZCOPY_THRESH")?;
        let rndv_thresh = threshold(r, "RNDV_THRESH")?;
        let rndv_scheme = match t.get_enum("RNDV_SCHEME")? {
            1 => RndvScheme::GetZcopy,
            2 => RndvScheme::PutZcopy,
            3 => RndvScheme::Am,
            _ => RndvScheme::Auto,
        };
        let rndv_perf_diff = t.get_f64("RNDV_PERF_DIFF")?;
        if !(rndv_perf_diff.is_finite() && (0.0..100.0).contains(&rndv_perf_diff)) {
            return Err(r.invalid("RNDV_PERF_DIFF", "a percentage from 0 up to (not including) 100"));
        }
        let max_eager_lanes = lanes(r, "MAX_EAGER_LANES")?;
        let max_rndv_lanes = lanes(r, "MAX_RNDV_LANES")?;
        let seg_size = match t.get_memunits("SEG_SIZE")? {
            MemUnits::Auto => DEFAULT_SEG_SIZE as u64,
            MemUnits::Inf => u64::MAX,
            MemUnits::Bytes(b) => b,
        };
        if !(256..=1 << 30).contains(&seg_size) {
            return Err(r.invalid("SEG_SIZE", "a size from 256 to 1g"));
        }
        let num_eps = auto_count(r, "NUM_EPS")?;
        let num_ppn = auto_count(r, "NUM_PPN")?;
        let proto_info = t.get_bool("PROTO_INFO")?;
        let atomic_emulate = t.get_bool("ATOMIC_EMULATE")?;
        let adaptive_progress = t.get_bool("ADAPTIVE_PROGRESS")?;
        let cm_timeout = match t.get_time("CM_TIMEOUT")? {
            TimeValue::Dur(d) if !d.is_zero() => d,
            TimeValue::Auto => DEFAULT_CM_TIMEOUT,
            _ => return Err(r.invalid("CM_TIMEOUT", "a positive time like 10s")),
        };
        let keepalive_interval = match t.get_time("KEEPALIVE_INTERVAL")? {
            TimeValue::Inf => None,
            TimeValue::Auto => Some(DEFAULT_KEEPALIVE_INTERVAL),
            TimeValue::Dur(d) if d.is_zero() => {
                return Err(r.invalid(
                    "KEEPALIVE_INTERVAL",
                    "a positive time like 20s, or inf to turn keepalive off",
                ))
            }
            TimeValue::Dur(d) => Some(d),
        };
        let reasm = limits::reasm(r)?;
        let tag_unexp = limits::tag_unexp(r)?;
        let rndv_timeout = limits::rndv_timeout(r)?;
        let stream_unread = limits::stream_unread(r)?;
        let passive = limits::passive(r)?;
        let send_queue_limit = limits::send_queue(r)?;
        Ok(UcpConfig {
            tls,
            tls_spec,
            shm_devices,
            bcopy_thresh,
            zcopy_thresh,
            rndv_thresh,
            rndv_scheme,
            rndv_perf_diff,
            max_eager_lanes,
            max_rndv_lanes,
            seg_size: seg_size as usize,
            num_eps,
            num_ppn,
            proto_info,
            adaptive_progress,
            atomic_emulate,
            keepalive_interval,
            cm_timeout,
            reasm,
            tag_unexp,
            rndv_timeout,
            stream_unread,
            passive,
            send_queue_limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use ucs::Status;

    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Overrides {
        pairs.iter().copied().collect()
    }

    /// UCP's fields under a prefix of their own, for the one test that sets environment
    /// variables: tests are threads of one process, and the others read `RUCX_<NAME>`.
    static ENV_TEST_TABLE: ConfigTable = ConfigTable {
        name: "ucpenvtest",
        prefix: "UCPENVTEST_",
        fields: FIELDS,
    };

    #[test]
    fn defaults() {
        let c = UcpConfig::read(&Overrides::new()).expect("defaults are valid");
        let want = UcpConfig {
            tls: ucs::config::parse_allow_list("all").unwrap(),
            tls_spec: "all".into(),
            shm_devices: ucs::config::parse_allow_list("all").unwrap(),
            bcopy_thresh: Threshold::Auto,
            zcopy_thresh: Threshold::Auto,
            rndv_thresh: Threshold::Auto,
            rndv_scheme: RndvScheme::Auto,
            rndv_perf_diff: 1.0,
            max_eager_lanes: 1,
            max_rndv_lanes: 2,
            seg_size: 8192,
            num_eps: None,
            num_ppn: None,
            proto_info: false,
            adaptive_progress: true,
            atomic_emulate: false,
            keepalive_interval: Some(Duration::from_secs(20)),
            cm_timeout: DEFAULT_CM_TIMEOUT,
            reasm: ReasmLimits {
                worker_bytes: 1 << 30,
                peer_bytes: 256 << 20,
                timeout: Some(DEFAULT_REASM_TIMEOUT),
            },
            tag_unexp: ByteLimits {
                peer_bytes: 256 << 20,
                worker_bytes: 1 << 30,
            },
            rndv_timeout: Some(DEFAULT_REASM_TIMEOUT),
            stream_unread: ByteLimits {
                peer_bytes: 256 << 20,
                worker_bytes: 1 << 30,
            },
            passive: PassiveLimits {
                per_peer: 4096,
                per_worker: 16384,
            },
            send_queue_limit: 1 << 30,
        };
        assert_eq!(c, want);
        assert!(TlsFilter::parse(&c.tls).unwrap().allows_all());
        assert_eq!(UCP_CONFIG.env_name("TLS"), "RUCX_TLS");
        // Every field's default parses as its kind.
        for f in UCP_CONFIG.fields {
            assert!(f.kind.parse(f.default).is_some(), "{}", f.name);
            assert!(!f.doc.is_empty() && f.doc.len() < 300, "{}", f.name);
        }
    }

    #[test]
    fn values_set_in_code() {
        let c = UcpConfig::read(&with(&[
            ("TLS", "rc,tcp"),
            ("BCOPY_THRESH", "0"),
            ("ZCOPY_THRESH", "16k"),
            ("RNDV_THRESH", "inf"),
            ("RNDV_SCHEME", "PUT_ZCOPY"),
            ("RNDV_PERF_DIFF", "2.5"),
            ("MAX_EAGER_LANES", "2"),
            ("RUCX_MAX_RNDV_LANES", "8"),
            ("SEG_SIZE", "auto"),
            ("NUM_EPS", "1000"),
            ("NUM_PPN", "0x10"),
            ("PROTO_INFO", "y"),
            ("KEEPALIVE_INTERVAL", "inf"),
        ]))
        .unwrap();
        assert_eq!(c.tls_spec, "rc,tcp");
        let f = TlsFilter::parse(&c.tls).unwrap();
        assert_eq!(f.allows("ud_verbs"), Allowed::AuxOnly);
        assert_eq!(f.allows("self"), Allowed::No);
        assert_eq!(c.bcopy_thresh, Threshold::Bytes(0));
        assert_eq!(c.zcopy_thresh, Threshold::Bytes(16384));
        assert_eq!(c.rndv_thresh, Threshold::Bytes(usize::MAX));
        assert_eq!(c.rndv_thresh.or_auto(5), usize::MAX);
        assert_eq!(Threshold::Auto.or_auto(5), 5);
        assert_eq!(c.rndv_scheme, RndvScheme::PutZcopy);
        assert_eq!(c.rndv_perf_diff, 2.5);
        assert_eq!((c.max_eager_lanes, c.max_rndv_lanes), (2, 8));
        assert_eq!(c.seg_size, DEFAULT_SEG_SIZE);
        assert_eq!((c.num_eps, c.num_ppn), (Some(1000), Some(16)));
        assert!(c.proto_info);
        assert_eq!(c.keepalive_interval, None);
        let c = UcpConfig::read(&with(&[
            ("RNDV_SCHEME", "get_zcopy"),
            ("KEEPALIVE_INTERVAL", "1.5s"),
            ("SEG_SIZE", "1g"),
            ("RNDV_PERF_DIFF", "0"),
        ]))
        .unwrap();
        assert_eq!(c.rndv_scheme, RndvScheme::GetZcopy);
        assert_eq!(c.keepalive_interval, Some(Duration::from_millis(1500)));
        assert_eq!(c.seg_size, 1 << 30);
        assert_eq!(c.rndv_perf_diff, 0.0);
        let c = UcpConfig::read(&with(&[("RNDV_SCHEME", "am"), ("TLS", "^ib")])).unwrap();
        assert_eq!(c.rndv_scheme, RndvScheme::Am);
        assert_eq!(c.tls_spec, "^ib");
    }

    #[test]
    fn every_variable_invalid() {
        let table = [
            ("TLS", "", "RUCX_TLS= (set in code) is invalid: expected"),
            ("TLS", "tcp,^self", "RUCX_TLS=tcp,^self (set in code) is invalid"),
            ("TLS", "tcp:1", "'tcp:1'"),
            ("TLS", "rc*", "globs"),
            (
                "BCOPY_THRESH",
                "big",
                "RUCX_BCOPY_THRESH=big (set in code) is invalid: expected a memory size",
            ),
            ("ZCOPY_THRESH", "-1", "RUCX_ZCOPY_THRESH=-1"),
            ("RNDV_THRESH", "8q", "RUCX_RNDV_THRESH=8q"),
            (
                "RNDV_SCHEME",
                "rkey_ptr",
                "expected one of auto|get_zcopy|put_zcopy|am",
            ),
            ("RNDV_PERF_DIFF", "x", "RUCX_RNDV_PERF_DIFF=x"),
            ("RNDV_PERF_DIFF", "100", "from 0 up to (not including) 100"),
            ("RNDV_PERF_DIFF", "-1", "RUCX_RNDV_PERF_DIFF=-1"),
            ("RNDV_PERF_DIFF", "nan", "RUCX_RNDV_PERF_DIFF=nan"),
            (
                "MAX_EAGER_LANES",
                "0",
                "RUCX_MAX_EAGER_LANES=0 (set in code) is invalid: expected a lane count from 1 to 8",
            ),
            ("MAX_EAGER_LANES", "9", "RUCX_MAX_EAGER_LANES=9"),
            ("MAX_EAGER_LANES", "one", "a non-negative integer"),
            ("MAX_RNDV_LANES", "0", "RUCX_MAX_RNDV_LANES=0"),
            ("MAX_RNDV_LANES", "100", "a lane count from 1 to 8"),
            (
                "SEG_SIZE",
                "128",
                "RUCX_SEG_SIZE=128 (set in code) is invalid: expected a size from 256 to 1g",
            ),
            ("SEG_SIZE", "inf", "RUCX_SEG_SIZE=inf"),
            ("SEG_SIZE", "2g", "RUCX_SEG_SIZE=2g"),
            (
                "NUM_EPS",
                "0",
                "RUCX_NUM_EPS=0 (set in code) is invalid: expected auto or a count of at least 1",
            ),
            ("NUM_EPS", "many", "RUCX_NUM_EPS=many"),
            ("NUM_PPN", "0", "RUCX_NUM_PPN=0"),
            ("NUM_PPN", "-2", "RUCX_NUM_PPN=-2"),
            (
                "PROTO_INFO",
                "maybe",
                "RUCX_PROTO_INFO=maybe (set in code) is invalid: expected a boolean",
            ),
            (
                "ADAPTIVE_PROGRESS",
                "2",
                "RUCX_ADAPTIVE_PROGRESS=2 (set in code) is invalid: expected a boolean",
            ),
            (
                "ATOMIC_EMULATE",
                "sometimes",
                "RUCX_ATOMIC_EMULATE=sometimes (set in code) is invalid: expected a boolean",
            ),
            (
                "KEEPALIVE_INTERVAL",
                "0",
                "RUCX_KEEPALIVE_INTERVAL=0 (set in code) is invalid: expected a positive time",
            ),
            ("KEEPALIVE_INTERVAL", "often", "RUCX_KEEPALIVE_INTERVAL=often"),
            (
                "CM_TIMEOUT",
                "0",
                "RUCX_CM_TIMEOUT=0 (set in code) is invalid: expected a positive time",
            ),
            ("CM_TIMEOUT", "inf", "RUCX_CM_TIMEOUT=inf"),
            (
                "REASM_PEER_LIMIT",
                "1k",
                "RUCX_REASM_PEER_LIMIT=1k (set in code) is invalid: expected a size of at least 4k",
            ),
            ("REASM_WORKER_LIMIT", "lots", "RUCX_REASM_WORKER_LIMIT=lots"),
            (
                "REASM_TIMEOUT",
                "0",
                "RUCX_REASM_TIMEOUT=0 (set in code) is invalid: expected a positive time",
            ),
            ("SHM_DEVICES", "posix,^memory", "RUCX_SHM_DEVICES=posix,^memory"),
            (
                "TAG_UNEXP_PEER_LIMIT",
                "100",
                "RUCX_TAG_UNEXP_PEER_LIMIT=100 (set in code) is invalid: expected a size of at least 4k",
            ),
            ("TAG_UNEXP_WORKER_LIMIT", "-1", "RUCX_TAG_UNEXP_WORKER_LIMIT=-1"),
            ("STREAM_PEER_LIMIT", "1", "RUCX_STREAM_PEER_LIMIT=1"),
            (
                "PASSIVE_PEER_LIMIT",
                "0",
                "RUCX_PASSIVE_PEER_LIMIT=0 (set in code) is invalid: expected a count of at least 1",
            ),
            ("PASSIVE_WORKER_LIMIT", "many", "RUCX_PASSIVE_WORKER_LIMIT=many"),
            ("EP_SEND_QUEUE_LIMIT", "2k", "RUCX_EP_SEND_QUEUE_LIMIT=2k"),
            ("STREAM_WORKER_LIMIT", "big", "RUCX_STREAM_WORKER_LIMIT=big"),
            (
                "RNDV_TIMEOUT",
                "0s",
                "RUCX_RNDV_TIMEOUT=0s (set in code) is invalid: expected a positive time",
            ),
        ];
        for (name, value, msg) in table {
            let e = UcpConfig::read(&with(&[(name, value)])).unwrap_err();
            assert_eq!(e, Status::InvalidParam, "{name}={value}");
            let text = e.context().unwrap_or_default();
            assert!(text.contains(msg), "{name}={value}: {text:?} lacks {msg:?}");
            assert!(
                text.contains(&format!("RUCX_{name}=")),
                "{name}={value}: {text:?}"
            );
        }
        // Each variable of the table has at least one invalid case above.
        for f in UCP_CONFIG.fields {
            assert!(
                table.iter().any(|(n, _, _)| *n == f.name),
                "no invalid case for {}",
                f.name
            );
        }
    }

    #[test]
    fn code_beats_env() {
        let vars = [
            ("RUCX_UCPENVTEST_MAX_RNDV_LANES", "1"),
            ("RUCX_UCPENVTEST_TLS", "tcp"),
            ("RUCX_UCPENVTEST_NUM_PPN", "many"),
        ];
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
        let read = |code: &Overrides| UcpConfig::read_table(&ENV_TEST_TABLE, code);
        // The environment alone: its valid values are read, its invalid one is named.
        let e = read(&Overrides::new()).unwrap_err();
        let text = e.context().unwrap().to_string();
        assert!(
            text.starts_with("RUCX_UCPENVTEST_NUM_PPN=many is invalid"),
            "{text}"
        );
        // Values set in code win over the environment's.
        let c = read(&with(&[("UCPENVTEST_NUM_PPN", "4")])).unwrap();
        assert_eq!(
            (c.max_rndv_lanes, c.num_ppn, c.tls_spec.as_str()),
            (1, Some(4), "tcp")
        );
        let c = read(&with(&[
            ("UCPENVTEST_NUM_PPN", "auto"),
            ("UCPENVTEST_MAX_RNDV_LANES", "3"),
            ("RUCX_UCPENVTEST_TLS", "^tcp"),
        ]))
        .unwrap();
        assert_eq!(
            (c.max_rndv_lanes, c.num_ppn, c.tls_spec.as_str()),
            (3, None, "^tcp")
        );
        // An invalid value set in code is named as such even when the environment's is valid.
        let e = read(&with(&[
            ("UCPENVTEST_NUM_PPN", "2"),
            ("UCPENVTEST_MAX_RNDV_LANES", "0"),
        ]))
        .unwrap_err();
        assert!(
            e.context()
                .unwrap()
                .starts_with("RUCX_UCPENVTEST_MAX_RNDV_LANES=0 (set in code) is invalid"),
            "{e}"
        );
        for (k, _) in vars {
            std::env::remove_var(k);
        }
    }

    #[test]
    fn register_lists_the_table_once() {
        register();
        register();
        let tables = ucs::config::tables();
        assert_eq!(tables.iter().filter(|t| t.name == "ucp").count(), 1);
        assert_eq!(tables.iter().filter(|t| t.name == "net").count(), 1);
        let dump = ucs::config::dump();
        for v in [
            "RUCX_TLS",
            "RUCX_RNDV_THRESH",
            "RUCX_KEEPALIVE_INTERVAL",
            "RUCX_NET_DEVICES",
        ] {
            assert_eq!(dump.iter().filter(|e| e.full_name == v).count(), 1, "{v}");
        }
        let mut code = Overrides::new();
        code.set("RNDV_THRESH", "64k");
        code.set("NET_DEVICES", "lo");
        assert!(ucs::config::check_known(&code).is_ok());
        code.set("RNDV_TRESH", "64k");
        let e = ucs::config::check_known(&code).unwrap_err();
        assert!(e.context().unwrap().contains("RNDV_THRESH"), "{e}");
    }

    #[test]
    fn devices_from_the_shared_table() {
        let l = NET_TABLE
            .with(&with(&[("NET_DEVICES", "rxe0:1,lo")]))
            .get_allow_list("NET_DEVICES")
            .unwrap();
        assert!(device_allowed(&l, "rxe0:1"));
        assert!(device_allowed(&l, "lo"));
        assert!(!device_allowed(&l, "rxe0:2"));
        assert!(!device_allowed(&l, "eth0"));
        let l = NET_TABLE
            .with(&with(&[("NET_DEVICES", "^rxe*")]))
            .get_allow_list("NET_DEVICES")
            .unwrap();
        assert!(!device_allowed(&l, "rxe0:1"));
        assert!(device_allowed(&l, "lo"));
        let all = NET_TABLE.with(&Overrides::new()).get_allow_list("NET_DEVICES");
        // (unless someone runs the tests with RUCX_NET_DEVICES set)
        if std::env::var_os("RUCX_NET_DEVICES").is_none() {
            assert!(device_allowed(&all.unwrap(), "anything:1"));
        }
    }
}
