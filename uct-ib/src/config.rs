//! `RUCX_IB_*` variables (one table for every ib transport, prefix `IB_`), and [`IbConfig`],
//! their validated values, read once per `iface_open`.

use std::time::Duration;

use ucs::config::{ConfigField, ConfigKind, ConfigReader, ConfigTable, Overrides};
use ucs::{Error, Result, Status};

use uct_ib_verbs::Mtu;

/// Accepted values of `RUCX_IB_PATH_MTU`.
const MTU_NAMES: &[&str] = &["auto", "default", "256", "512", "1024", "2048", "4096"];

/// The ib transports' configuration.
pub static IB_CONFIG: ConfigTable = ConfigTable {
    name: "ib",
    prefix: "IB_",
    fields: &[
        ConfigField::new(
            "SEG_SIZE",
            "8k",
            ConfigKind::MemUnits,
            "Size of send and receive buffers: the largest bcopy message and AM (headers included).",
        ),
        ConfigField::new(
            "TX_QUEUE_LEN",
            "256",
            ConfigKind::Uint,
            "Send queue length (work requests per QP).",
        ),
        ConfigField::new(
            "RX_QUEUE_LEN",
            "4096",
            ConfigKind::Uint,
            "Receive queue length (posted receive buffers per interface; clamped to the device maximum).",
        ),
        ConfigField::new(
            "TX_MIN_INLINE",
            "64",
            ConfigKind::MemUnits,
            "Bytes of inline data to ask for in send WQEs (the device may grant more).",
        ),
        ConfigField::new(
            "TX_MIN_SGE",
            "5",
            ConfigKind::Uint,
            "Scatter/gather entries to ask for per send WQE.",
        ),
        ConfigField::new(
            "TX_CQ_LEN",
            "4096",
            ConfigKind::Uint,
            "Send completion queue length (bounds the signaled sends in flight per interface).",
        ),
        ConfigField::new(
            "TX_CQ_MODERATION",
            "64",
            ConfigKind::Uint,
            "Request a send completion every this many sends (capped at TX_QUEUE_LEN/4; ud_verbs also at RUCX_UD_TX_BUFS/4).",
        ),
        ConfigField::new(
            "TX_MAX_POLL",
            "16",
            ConfigKind::Uint,
            "Send completions polled per progress call.",
        ),
        ConfigField::new(
            "RX_MAX_POLL",
            "16",
            ConfigKind::Uint,
            "Receive completions polled per progress call.",
        ),
        ConfigField::new(
            "RX_HEADS",
            "y",
            ConfigKind::Bool,
            "rc_verbs and ud_verbs: the first 64 bytes of every receive (ud: with the 40-byte GRH) \
             land in one dense array (two SGEs per receive), so small messages share pages instead \
             of each touching a buffer of its own.",
        ),
        ConfigField::new(
            "TX_DB_BATCH",
            "4",
            ConfigKind::Uint,
            "Sends from a buffer of one burst (rc_verbs bcopy, ud_verbs AM packets not inline; \
             those after the first since the last progress call) are posted together, up to this \
             many per ibv_post_send (one doorbell); progress, flush, any other operation or a full \
             batch posts them. 1 posts every send at once (at most 16).",
        ),
        ConfigField::new(
            "RX_MAX_BATCH",
            "16",
            ConfigKind::Uint,
            "Receive buffers reposted at a time (at most 64).",
        ),
        ConfigField::new(
            "GID_INDEX",
            "auto",
            ConfigKind::AutoUint,
            "GID table index for RoCE, or auto: RoCE v2/IPv4, v2/IPv6, v1/IPv4, v1/IPv6 (UCX's order).",
        ),
        ConfigField::new(
            "PATH_MTU",
            "auto",
            ConfigKind::Enum(MTU_NAMES),
            "Path MTU of connected QPs (both ends must use the same setting). auto: the port's \
             active MTU, or its largest toward this port's own address on Soft-RoCE (no wire \
             there, and fewer packets cost less); default: the active MTU; 256..4096: that, at \
             most the active MTU.",
        ),
        ConfigField::new("SL", "0", ConfigKind::Uint, "InfiniBand service level (0..15)."),
        ConfigField::new(
            "TRAFFIC_CLASS",
            "0",
            ConfigKind::Uint,
            "Traffic class of the GRH (RoCE / global routing).",
        ),
        ConfigField::new("HOP_LIMIT", "255", ConfigKind::Uint, "Hop limit of the GRH."),
        ConfigField::new(
            "TIMEOUT",
            "1s",
            ConfigKind::Time,
            "RC: transport retry timeout (rounded to 4.096us*2^n).",
        ),
        ConfigField::new(
            "RETRY_COUNT",
            "7",
            ConfigKind::Uint,
            "RC: transport retries before an error (0..7).",
        ),
        ConfigField::new(
            "RNR_TIMEOUT",
            "1ms",
            ConfigKind::Time,
            "RC: receiver-not-ready NAK timer (the wait before a sender retries).",
        ),
        ConfigField::new(
            "RNR_RETRY_COUNT",
            "7",
            ConfigKind::Uint,
            "RC: RNR retries before an error (0..7, 7 = infinite).",
        ),
        ConfigField::new(
            "MAX_RD_ATOMIC",
            "auto",
            ConfigKind::AutoUint,
            "RC: RDMA READ/atomic operations in flight per QP, or auto (the device maximum, at most 16).",
        ),
        ConfigField::new(
            "THP",
            "y",
            ConfigKind::Bool,
            "Buffer pools whose chunks reach a huge page (the rc_verbs receive ring) in transparent huge pages (huge-page aligned chunks, madvise(MADV_HUGEPAGE)), as UCX's thp allocation, when the kernel's THP is always or madvise; smaller pools and n: heap memory.",
        ),
        ConfigField::new(
            "FC_ENABLE",
            "y",
            ConfigKind::Bool,
            "RC: active-message flow control (credit window per endpoint), so receivers never run dry.",
        ),
        ConfigField::new(
            "FC_WND_SIZE",
            "512",
            ConfigKind::Uint,
            "RC: flow-control window (AMs per grant).",
        ),
        ConfigField::new(
            "FC_SOFT_THRESH",
            "0.5",
            ConfigKind::Float,
            "RC: fraction of the window left when a grant is requested (piggybacked).",
        ),
        ConfigField::new(
            "FC_HARD_THRESH",
            "0.25",
            ConfigKind::Float,
            "RC: fraction of the window left when an immediate grant is requested.",
        ),
    ],
};

/// Validated values of [`IB_CONFIG`].
#[derive(Clone, Debug, PartialEq)]
pub struct IbConfig {
    pub seg_size: usize,
    pub tx_queue_len: u32,
    pub rx_queue_len: u32,
    pub tx_min_inline: u32,
    pub tx_min_sge: u32,
    pub tx_cq_len: u32,
    pub tx_cq_moderation: u32,
    pub tx_max_poll: usize,
    pub rx_max_poll: usize,
    pub rx_max_batch: usize,
    /// rc and ud receives start in a dense array of head slots (`RUCX_IB_RX_HEADS`).
    pub rx_heads: bool,
    /// rc bcopy sends / ud AM packets of a burst per doorbell (`RUCX_IB_TX_DB_BATCH`; 1: off).
    pub tx_db_batch: usize,
    /// `None`: auto (`Context::select_gid`).
    pub gid_index: Option<u8>,
    /// `None`: the port's active MTU.
    pub path_mtu: Option<Mtu>,
    /// `PATH_MTU=auto`: a connected QP toward this port's own address on Soft-RoCE uses the
    /// port's largest MTU (`path_mtu` is then `None`).
    pub local_max_mtu: bool,
    pub sl: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub timeout: Duration,
    pub retry_count: u8,
    pub rnr_timeout: Duration,
    pub rnr_retry_count: u8,
    /// `None`: auto.
    pub max_rd_atomic: Option<u8>,
    /// Buffer pools in transparent huge pages (`RUCX_IB_THP`).
    pub thp: bool,
    pub fc_enable: bool,
    pub fc_wnd_size: u32,
    pub fc_soft_thresh: f64,
    pub fc_hard_thresh: f64,
}

/// An invalid variable: logged for the operator, and returned to the caller as the context.
#[cold]
fn bad(var: &str, why: &str) -> Error {
    let msg = format!("RUCX_IB_{var}: {why}");
    ucs::error!("{msg}");
    Error::new(Status::InvalidParam, msg)
}

fn uint_in(t: ConfigReader<'_>, var: &str, lo: u64, hi: u64) -> Result<u64> {
    let v = t.get_uint(var)?;
    if !(lo..=hi).contains(&v) {
        return Err(bad(var, &format!("{v} is out of range; use {lo}..={hi}")));
    }
    Ok(v)
}

/// Parses `auto` or a number in `0..=max` (for the `Str` fields that allow `auto`).
pub(crate) fn parse_auto_u8(var: &str, raw: &str, max: u8) -> Result<Option<u8>> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match raw.parse::<u8>() {
        Ok(v) if v <= max => Ok(Some(v)),
        _ => Err(bad(
            var,
            &format!("'{raw}' is invalid; use auto or a number in 0..={max}"),
        )),
    }
}

impl IbConfig {
    /// Reads and checks every variable; an invalid one gives `InvalidParam` saying which and why,
    /// and one log line.
    pub fn read() -> Result<IbConfig> {
        Self::read_with(&Overrides::new())
    }

    /// [`IbConfig::read`] with `code` (set in code) on top of the environment.
    pub fn read_with(code: &Overrides) -> Result<IbConfig> {
        let t = IB_CONFIG.with(code);
        let seg = t.get_memunits("SEG_SIZE")?.bytes_or(8192);
        if !(256..=(1 << 30)).contains(&seg) {
            return Err(bad("SEG_SIZE", &format!("{seg} bytes; use 256 bytes .. 1g")));
        }
        let inline = t.get_memunits("TX_MIN_INLINE")?.bytes_or(64);
        if inline > 4096 {
            return Err(bad("TX_MIN_INLINE", &format!("{inline} bytes; use at most 4k")));
        }
        let (mtu, local_max_mtu) = match t.get_enum("PATH_MTU")? {
            0 => (None, true),
            1 => (None, false),
            i => (
                Mtu::from_bytes(MTU_NAMES[i].parse::<u32>().unwrap_or(1024)),
                false,
            ),
        };
        let time = |var: &str| -> Result<Duration> {
            let d = t.get_time(var)?.duration_or(Duration::from_secs(1));
            if d.is_zero() {
                return Err(bad(var, "must be above 0"));
            }
            Ok(d)
        };
        let frac = |var: &str| -> Result<f64> {
            let v = t.get_f64(var)?;
            if !(v > 0.0 && v < 1.0) {
                return Err(bad(var, &format!("{v}; use a fraction between 0 and 1")));
            }
            Ok(v)
        };
        let cfg = IbConfig {
            seg_size: seg as usize,
            tx_queue_len: uint_in(t, "TX_QUEUE_LEN", 8, 1 << 20)? as u32,
            rx_queue_len: uint_in(t, "RX_QUEUE_LEN", 16, 1 << 20)? as u32,
            tx_min_inline: inline as u32,
            tx_min_sge: uint_in(t, "TX_MIN_SGE", 1, 32)? as u32,
            tx_cq_len: uint_in(t, "TX_CQ_LEN", 16, 1 << 22)? as u32,
            tx_cq_moderation: uint_in(t, "TX_CQ_MODERATION", 1, 1 << 16)? as u32,
            tx_max_poll: uint_in(t, "TX_MAX_POLL", 1, 32)? as usize,
            rx_max_poll: uint_in(t, "RX_MAX_POLL", 1, 32)? as usize,
            rx_max_batch: uint_in(t, "RX_MAX_BATCH", 1, uct_ib_verbs::MAX_RECV_BATCH as u64)? as usize,
            rx_heads: t.get_bool("RX_HEADS")?,
            tx_db_batch: uint_in(t, "TX_DB_BATCH", 1, uct_ib_verbs::SEND_BATCH_MAX as u64)? as usize,
            gid_index: parse_auto_u8("GID_INDEX", &t.get_str("GID_INDEX")?, 255)?,
            path_mtu: mtu,
            local_max_mtu,
            sl: uint_in(t, "SL", 0, 15)? as u8,
            traffic_class: uint_in(t, "TRAFFIC_CLASS", 0, 255)? as u8,
            hop_limit: uint_in(t, "HOP_LIMIT", 1, 255)? as u8,
            timeout: time("TIMEOUT")?,
            retry_count: uint_in(t, "RETRY_COUNT", 0, 7)? as u8,
            rnr_timeout: time("RNR_TIMEOUT")?,
            rnr_retry_count: uint_in(t, "RNR_RETRY_COUNT", 0, 7)? as u8,
            max_rd_atomic: parse_auto_u8("MAX_RD_ATOMIC", &t.get_str("MAX_RD_ATOMIC")?, 255)?,
            thp: t.get_bool("THP")?,
            fc_enable: t.get_bool("FC_ENABLE")?,
            fc_wnd_size: uint_in(t, "FC_WND_SIZE", 4, i16::MAX as u64)? as u32,
            fc_soft_thresh: frac("FC_SOFT_THRESH")?,
            fc_hard_thresh: frac("FC_HARD_THRESH")?,
        };
        if cfg.fc_hard_thresh >= cfg.fc_soft_thresh {
            return Err(bad("FC_HARD_THRESH", "must be below RUCX_IB_FC_SOFT_THRESH"));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_to_ucx_values() {
        // no RUCX_IB_* variables are set in unit tests
        let c = IbConfig::read().unwrap();
        assert_eq!(
            (c.seg_size, c.tx_queue_len, c.rx_queue_len, c.tx_min_inline),
            (8192, 256, 4096, 64)
        );
        assert_eq!((c.tx_cq_moderation, c.rx_max_batch, c.fc_wnd_size), (64, 16, 512));
        assert!(c.rx_heads);
        assert_eq!(c.tx_db_batch, 4);
        assert_eq!((c.gid_index, c.path_mtu, c.max_rd_atomic), (None, None, None));
        assert!(c.local_max_mtu);
        assert_eq!(
            (c.timeout, c.rnr_timeout),
            (Duration::from_secs(1), Duration::from_millis(1))
        );
        assert_eq!((c.retry_count, c.rnr_retry_count, c.hop_limit), (7, 7, 255));
        assert!(c.fc_enable);
    }

    #[test]
    fn auto_or_number() {
        assert_eq!(parse_auto_u8("X", "auto", 9).unwrap(), None);
        assert_eq!(parse_auto_u8("X", " AUTO ", 9).unwrap(), None);
        assert_eq!(parse_auto_u8("X", "3", 9).unwrap(), Some(3));
        assert_eq!(parse_auto_u8("X", "10", 9), Err(Status::InvalidParam.into()));
        assert_eq!(parse_auto_u8("X", "-1", 9), Err(Status::InvalidParam.into()));
    }
}
