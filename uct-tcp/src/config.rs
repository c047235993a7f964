//! `RUCX_TCP_*` and `RUCX_NET_DEVICES`, read once per interface into a checked [`TcpConfig`].

use std::time::Duration;

use ucs::config::{ConfigField, ConfigKind, ConfigReader, ConfigTable, Overrides};
use ucs::{Error, Result, Status};

pub use crate::read_tuner::DirectReads;
use crate::wire::MIN_MAX_PAYLOAD;

/// The tcp transport's variables (`RUCX_TCP_<NAME>`).
pub static TCP_CONFIG: ConfigTable = ConfigTable {
    name: "tcp",
    prefix: "TCP_",
    fields: &[
        ConfigField::new(
            "TX_SEG_SIZE",
            "8k",
            ConfigKind::MemUnits,
            "Largest am_short (8-byte header included), am_bcopy, put_short and put_bcopy; \
             also the size of each connection's send buffer.",
        ),
        ConfigField::new(
            "RX_SEG_SIZE",
            "64k",
            ConfigKind::MemUnits,
            "Largest active message received (am_zcopy header + payload); a connection's \
             receive buffer is twice this. Must be at least TX_SEG_SIZE.",
        ),
        ConfigField::new(
            "MAX_IOV",
            "6",
            ConfigKind::Uint,
            "Most I/O-vector entries of a zcopy operation (1..16).",
        ),
        ConfigField::new(
            "SENDV_THRESH",
            "2k",
            ConfigKind::MemUnits,
            "am_short payloads up to this size are copied behind the header and sent with one \
             send(); larger ones are gathered by sendmsg() from the user buffer.",
        ),
        ConfigField::new(
            "TX_COALESCE",
            "64k",
            ConfigKind::MemUnits,
            "Copied sends (am_short up to SENDV_THRESH, am_bcopy, put_short, put_bcopy) share \
             system calls: the first on a connection after a progress call is written at once, \
             later ones are staged and written together by the next progress call, and while \
             the socket is full they are appended behind its unsent bytes instead of answering \
             NoResource. At most this many bytes wait; 0: off (each send is written at once).",
        ),
        ConfigField::new(
            "SNDBUF",
            "auto",
            ConfigKind::MemUnits,
            "Socket send buffer (SO_SNDBUF; the kernel doubles it); auto: the kernel's \
             autotuning.",
        ),
        ConfigField::new(
            "RCVBUF",
            "auto",
            ConfigKind::MemUnits,
            "Socket receive buffer (SO_RCVBUF); auto: kernel default.",
        ),
        ConfigField::new(
            "CONGESTION",
            "auto",
            ConfigKind::Str,
            "Congestion control of the connections (TCP_CONGESTION). auto: reno on a loopback \
             device (nothing is lost there; reno does the least work per packet), the system's \
             default elsewhere; default: the system's default everywhere; or a name from \
             net.ipv4.tcp_available_congestion_control.",
        ),
        ConfigField::new(
            "NODELAY",
            "y",
            ConfigKind::Bool,
            "Disable Nagle's algorithm (TCP_NODELAY).",
        ),
        ConfigField::new(
            "PORT_RANGE",
            "0",
            ConfigKind::Str,
            "Listening port range 'first-last' (a single port is allowed); 0: any free port.",
        ),
        ConfigField::new(
            "MAX_CONN_RETRIES",
            "25",
            ConfigKind::Uint,
            "Connection attempts repeated (with exponential backoff) when the peer refuses or \
             resets the connection before the handshake completes.",
        ),
        ConfigField::new(
            "KEEPIDLE",
            "10s",
            ConfigKind::Time,
            "Idle time before the kernel sends keepalive probes (TCP_KEEPIDLE); inf: no keepalive.",
        ),
        ConfigField::new(
            "KEEPINTVL",
            "2s",
            ConfigKind::Time,
            "Time between keepalive probes (TCP_KEEPINTVL).",
        ),
        ConfigField::new(
            "KEEPCNT",
            "auto",
            ConfigKind::AutoUint,
            "Unanswered keepalive probes before the peer is declared dead (TCP_KEEPCNT); auto: 3.",
        ),
        ConfigField::new(
            "USER_TIMEOUT",
            "auto",
            ConfigKind::Time,
            "How long sent data may stay unacknowledged before the connection is declared dead \
             (TCP_USER_TIMEOUT); auto: KEEPIDLE + KEEPCNT * KEEPINTVL; inf: kernel default.",
        ),
        ConfigField::new(
            "CONN_TIMEOUT",
            "10s",
            ConfigKind::Time,
            "Time one connection attempt may take (connect and handshake), and how long a \
             connect-to-ep endpoint waits for its peer to connect.",
        ),
        ConfigField::new(
            "HANDSHAKE_TIMEOUT",
            "5s",
            ConfigKind::Time,
            "Time an accepted connection has to send its handshake before it is dropped.",
        ),
        ConfigField::new(
            "MAX_HALF_OPEN",
            "128",
            ConfigKind::Uint,
            "Most accepted connections still in their handshake; beyond it the oldest is dropped \
             (bounds what a flood of idle connections costs).",
        ),
        ConfigField::new(
            "MAX_UNPAIRED",
            "4096",
            ConfigKind::Uint,
            "Most accepted connections to this interface (connect to iface) that no endpoint of \
             ours has paired with yet; further ones are refused (a peer's flood of them costs no \
             more than this many sockets).",
        ),
        ConfigField::new(
            "DIRECT_READS",
            "auto",
            ConfigKind::Enum(&["auto", "y", "n"]),
            "While a reply is awaited on an interface's only connection, progress recv()s it \
             directly instead of asking epoll first (one system call less per message). auto: \
             whichever of the two waits less, timed at run time; y: always; n: never.",
        ),
        ConfigField::new(
            "MAX_POLL",
            "16",
            ConfigKind::Uint,
            "Most socket events handled per progress call (1..1024).",
        ),
    ],
};

/// `RUCX_NET_DEVICES` now lives in ucs (shared with the other network transports and UCP, and
/// registered by ucs itself); this name is kept for existing users.
pub use ucs::config::NET_TABLE as NET_CONFIG;

/// Largest am_short payload copied behind the header (larger values of SENDV_THRESH act as this).
pub const SENDV_THRESH_MAX: usize = 8192;
/// Keepalive probes when `KEEPCNT=auto`.
const DEFAULT_KEEPCNT: u32 = 3;

/// Congestion control on a loopback device when `RUCX_TCP_CONGESTION=auto`: nothing is lost
/// or queued there, so the algorithm that does the least work per packet.
pub const LOOPBACK_CONGESTION: &str = "reno";

/// The congestion control a connection asks for (`RUCX_TCP_CONGESTION`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Congestion {
    /// Resolved by [`TcpConfig::for_device`]: [`LOOPBACK_CONGESTION`] on loopback, else
    /// [`Congestion::System`].
    Auto,
    /// The system's default (the socket option is not set).
    System,
    /// This algorithm (a kernel name, at most 15 characters).
    Named(String),
}

/// Parses `auto`, `default` or an algorithm's name (what the kernel accepts: up to 15
/// characters, letters, digits, `_` and `-`).
pub fn parse_congestion(s: &str) -> Option<Congestion> {
    match s.trim() {
        "auto" => Some(Congestion::Auto),
        "default" => Some(Congestion::System),
        n if !n.is_empty()
            && n.len() <= 15
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            Some(Congestion::Named(n.to_string()))
        }
        _ => None,
    }
}

/// Kernel keepalive settings (whole seconds, as the kernel takes them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    pub idle_s: u32,
    pub intvl_s: u32,
    pub cnt: u32,
}

/// The checked configuration of one interface.
#[derive(Clone, Debug, PartialEq)]
pub struct TcpConfig {
    pub tx_seg: usize,
    pub rx_seg: usize,
    pub max_iov: usize,
    pub sendv_thresh: usize,
    /// Most bytes of copied sends that wait (staged, or behind a full socket); 0: none wait.
    pub tx_coalesce: usize,
    pub sndbuf: Option<usize>,
    pub rcvbuf: Option<usize>,
    pub nodelay: bool,
    pub congestion: Congestion,
    /// Inclusive; `None`: any port.
    pub port_range: Option<(u16, u16)>,
    pub max_conn_retries: u32,
    pub keepalive: Option<Keepalive>,
    /// TCP_USER_TIMEOUT in milliseconds, `None`: kernel default.
    pub user_timeout_ms: Option<u32>,
    pub conn_timeout: Duration,
    pub handshake_timeout: Duration,
    pub max_half_open: usize,
    /// `RUCX_TCP_MAX_UNPAIRED`.
    pub max_unpaired: usize,
    pub max_poll: usize,
    pub direct_reads: DirectReads,
}

fn invalid(var: &str, value: &str, expected: &str) -> Error {
    let msg = format!("RUCX_{var}={value} is invalid: expected {expected}");
    ucs::error!("{msg}");
    Error::new(Status::InvalidParam, msg)
}

fn size(t: ConfigReader<'_>, name: &str, auto: Option<u64>) -> Result<Option<u64>> {
    Ok(match t.get_memunits(name)? {
        ucs::config::MemUnits::Bytes(b) => Some(b),
        ucs::config::MemUnits::Inf => Some(u64::MAX),
        ucs::config::MemUnits::Auto => auto,
    })
}

/// Parses `0`, `port` or `first-last`.
pub fn parse_port_range(s: &str) -> Option<Option<(u16, u16)>> {
    let s = s.trim();
    if s == "0" {
        return Some(None);
    }
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let a: u16 = a.trim().parse().ok()?;
    let b: u16 = b.trim().parse().ok()?;
    (a > 0 && a <= b).then_some(Some((a, b)))
}

fn secs_ceil(d: Duration) -> u32 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.clamp(1, u64::from(i32::MAX as u32)) as u32
}

impl TcpConfig {
    /// Resolves the device-dependent default: `CONGESTION=auto` on a loopback device.
    pub fn for_device(mut self, loopback: bool) -> TcpConfig {
        if self.congestion == Congestion::Auto {
            self.congestion = if loopback {
                Congestion::Named(LOOPBACK_CONGESTION.to_string())
            } else {
                Congestion::System
            };
        }
        self
    }

    /// Reads the configuration from the environment (and the defaults) and checks every
    /// variable; an invalid one is logged (naming the variable) and gives `InvalidParam`.
    pub fn read() -> Result<TcpConfig> {
        Self::read_with(&Overrides::new())
    }

    /// Reads the configuration with `code` (set in code) on top of the environment.
    pub fn read_with(code: &Overrides) -> Result<TcpConfig> {
        let t = TCP_CONFIG.with(code);
        let tx_seg = size(t, "TX_SEG_SIZE", Some(8192))?.unwrap_or(8192);
        let rx_seg = size(t, "RX_SEG_SIZE", Some(65536))?.unwrap_or(65536);
        if !(256..=1 << 30).contains(&tx_seg) {
            return Err(invalid(
                "TCP_TX_SEG_SIZE",
                &tx_seg.to_string(),
                "a size between 256 and 1g",
            ));
        }
        if rx_seg < u64::from(MIN_MAX_PAYLOAD) || rx_seg > 1 << 30 {
            return Err(invalid(
                "TCP_RX_SEG_SIZE",
                &rx_seg.to_string(),
                "a size between 64 and 1g",
            ));
        }
        if rx_seg < tx_seg {
            let msg = format!(
                "RUCX_TCP_RX_SEG_SIZE ({rx_seg}) is smaller than RUCX_TCP_TX_SEG_SIZE ({tx_seg}): \
                 a peer could send messages this side cannot receive; raise RX_SEG_SIZE"
            );
            ucs::error!("{msg}");
            return Err(Error::new(Status::InvalidParam, msg));
        }
        let max_iov = t.get_uint("MAX_IOV")?;
        if !(1..=uct_transport::types::MAX_IOV as u64).contains(&max_iov) {
            return Err(invalid(
                "TCP_MAX_IOV",
                &max_iov.to_string(),
                &format!("1..{}", uct_transport::types::MAX_IOV),
            ));
        }
        let sendv = size(t, "SENDV_THRESH", Some(2048))?
            .unwrap_or(2048)
            .min(SENDV_THRESH_MAX as u64);
        let tx_coalesce = size(t, "TX_COALESCE", Some(65536))?.unwrap_or(65536);
        if tx_coalesce > 1 << 30 {
            return Err(invalid(
                "TCP_TX_COALESCE",
                &tx_coalesce.to_string(),
                "0 (off) or a size up to 1g",
            ));
        }
        let sndbuf = size(t, "SNDBUF", None)?.map(|b| b.min(i32::MAX as u64) as usize);
        let rcvbuf = size(t, "RCVBUF", None)?.map(|b| b.min(i32::MAX as u64) as usize);
        let range = t.get_str("PORT_RANGE")?;
        let port_range = parse_port_range(&range).ok_or_else(|| {
            invalid(
                "TCP_PORT_RANGE",
                &range,
                "0 (any port), a port, or a range like 20000-20100",
            )
        })?;
        let retries = t.get_uint("MAX_CONN_RETRIES")?.min(u64::from(u32::MAX)) as u32;
        let idle = t.get_time("KEEPIDLE")?.duration_or(Duration::from_secs(10));
        let intvl = t.get_time("KEEPINTVL")?.duration_or(Duration::from_secs(2));
        let cnt_s = t.get_str("KEEPCNT")?;
        let cnt = match cnt_s.trim() {
            "auto" => DEFAULT_KEEPCNT,
            s => match s.parse::<u32>() {
                Ok(n) if (1..=127).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        "TCP_KEEPCNT",
                        &cnt_s,
                        "auto or a count between 1 and 127",
                    ))
                }
            },
        };
        let keepalive = (idle != Duration::MAX && !idle.is_zero()).then(|| Keepalive {
            idle_s: secs_ceil(idle),
            intvl_s: secs_ceil(intvl.min(Duration::from_secs(32767))).min(32767),
            cnt,
        });
        let user_timeout_ms = match t.get_time("USER_TIMEOUT")? {
            ucs::config::TimeValue::Auto => keepalive
                .map(|k| (k.idle_s.saturating_add(k.cnt.saturating_mul(k.intvl_s))).saturating_mul(1000)),
            ucs::config::TimeValue::Inf => None,
            ucs::config::TimeValue::Dur(d) if d.is_zero() => None,
            ucs::config::TimeValue::Dur(d) => Some(d.as_millis().clamp(1, i32::MAX as u128) as u32),
        };
        let conn_timeout = t.get_time("CONN_TIMEOUT")?.duration_or(Duration::from_secs(10));
        let handshake_timeout = t
            .get_time("HANDSHAKE_TIMEOUT")?
            .duration_or(Duration::from_secs(5));
        for (name, d) in [
            ("TCP_CONN_TIMEOUT", conn_timeout),
            ("TCP_HANDSHAKE_TIMEOUT", handshake_timeout),
        ] {
            if d.is_zero() {
                return Err(invalid(name, "0", "a positive time like 10s, or inf"));
            }
        }
        let half_open = t.get_uint("MAX_HALF_OPEN")?;
        if half_open == 0 {
            return Err(invalid("TCP_MAX_HALF_OPEN", "0", "at least 1"));
        }
        let unpaired = t.get_uint("MAX_UNPAIRED")?;
        if unpaired == 0 {
            return Err(invalid("TCP_MAX_UNPAIRED", "0", "at least 1"));
        }
        let max_poll = t.get_uint("MAX_POLL")?;
        if !(1..=1024).contains(&max_poll) {
            return Err(invalid("TCP_MAX_POLL", &max_poll.to_string(), "1..1024"));
        }
        let cc = t.get_str("CONGESTION")?;
        let congestion = parse_congestion(&cc).ok_or_else(|| {
            invalid(
                "TCP_CONGESTION",
                &cc,
                "auto, default, or an algorithm's name like reno or cubic (up to 15 letters, digits, _ or -)",
            )
        })?;
        Ok(TcpConfig {
            tx_seg: tx_seg as usize,
            rx_seg: rx_seg as usize,
            max_iov: max_iov as usize,
            sendv_thresh: sendv as usize,
            tx_coalesce: tx_coalesce as usize,
            sndbuf,
            rcvbuf,
            nodelay: t.get_bool("NODELAY")?,
            congestion,
            port_range,
            max_conn_retries: retries,
            keepalive,
            user_timeout_ms,
            conn_timeout,
            handshake_timeout,
            max_half_open: half_open.min(1 << 20) as usize,
            max_unpaired: unpaired.min(1 << 24) as usize,
            max_poll: max_poll as usize,
            direct_reads: match t.get_enum("DIRECT_READS")? {
                1 => DirectReads::Always,
                2 => DirectReads::Never,
                _ => DirectReads::Auto,
            },
        })
    }
}

/// The device allow/deny list (`RUCX_NET_DEVICES`, [`ucs::config::NET_TABLE`]): `(items, deny)`.
pub fn net_devices(code: &Overrides) -> Result<(Vec<String>, bool)> {
    let l = ucs::config::NET_TABLE.with(code).get_allow_list("NET_DEVICES")?;
    Ok((l.items, l.deny))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let c = TcpConfig::read().expect("defaults");
        assert_eq!(
            (c.tx_seg, c.rx_seg, c.max_iov, c.sendv_thresh),
            (8192, 65536, 6, 2048)
        );
        assert_eq!(
            c.keepalive,
            Some(Keepalive {
                idle_s: 10,
                intvl_s: 2,
                cnt: 3
            })
        );
        assert_eq!(c.user_timeout_ms, Some(16_000));
        assert_eq!(c.tx_coalesce, 65536);
        assert_eq!(c.port_range, None);
        assert!(c.nodelay);
        assert_eq!(c.direct_reads, DirectReads::Auto);
    }

    #[test]
    fn the_send_buffer_is_the_kernels_unless_set() {
        let c = TcpConfig::read().expect("defaults");
        assert_eq!(c.sndbuf, None);
        assert_eq!(c.clone().for_device(false).sndbuf, None);
        assert_eq!(c.clone().for_device(true).sndbuf, None);
        let set = TcpConfig {
            sndbuf: Some(4 << 20),
            ..c
        };
        assert_eq!(set.for_device(true).sndbuf, Some(4 << 20));
    }

    #[test]
    fn loopback_gets_reno_unless_set() {
        let c = TcpConfig::read().expect("defaults");
        assert_eq!(c.congestion, Congestion::Auto);
        assert_eq!(
            c.clone().for_device(true).congestion,
            Congestion::Named("reno".into())
        );
        assert_eq!(c.clone().for_device(false).congestion, Congestion::System);
        for (set, lo, other) in [
            (Congestion::System, Congestion::System, Congestion::System),
            (
                Congestion::Named("cubic".into()),
                Congestion::Named("cubic".into()),
                Congestion::Named("cubic".into()),
            ),
        ] {
            let s = TcpConfig {
                congestion: set,
                ..c.clone()
            };
            assert_eq!(s.clone().for_device(true).congestion, lo);
            assert_eq!(s.for_device(false).congestion, other);
        }
    }

    #[test]
    fn congestion_values() {
        assert_eq!(parse_congestion("auto"), Some(Congestion::Auto));
        assert_eq!(parse_congestion(" default "), Some(Congestion::System));
        assert_eq!(parse_congestion("bbr"), Some(Congestion::Named("bbr".into())));
        assert_eq!(
            parse_congestion("dctcp_x-1"),
            Some(Congestion::Named("dctcp_x-1".into()))
        );
        assert_eq!(
            parse_congestion("a23456789012345"),
            Some(Congestion::Named("a23456789012345".into()))
        );
        for bad in ["", " ", "a234567890123456", "re no", "reno;", "bbr\0", "c\u{e9}"] {
            assert_eq!(parse_congestion(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn port_ranges() {
        assert_eq!(parse_port_range("0"), Some(None));
        assert_eq!(parse_port_range("2000-2010"), Some(Some((2000, 2010))));
        assert_eq!(parse_port_range("2000"), Some(Some((2000, 2000))));
        assert_eq!(parse_port_range("10-1"), None);
        assert_eq!(parse_port_range("a-b"), None);
        assert_eq!(parse_port_range("0-5"), None);
    }
}
