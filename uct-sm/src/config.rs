//! `RUCX_MM_*` (both FIFO transports), `RUCX_POSIX_*`, `RUCX_SYSV_*` and `RUCX_CMA_*` variables.

use std::time::Duration;

use ucs::config::{ConfigField, ConfigKind, ConfigTable, Overrides, Ternary};
use ucs::{Error, Result, Status};

/// What posix and sysv share: the receive FIFO's shape and the peer checks.
pub static MM_CONFIG: ConfigTable = ConfigTable {
    name: "mm",
    prefix: "MM_",
    fields: &[
        ConfigField::new(
            "FIFO_SIZE",
            "64",
            ConfigKind::Uint,
            "Elements in an interface's receive FIFO (a power of 2, 2 to 65536): messages that may wait unread before senders get NoResource.",
        ),
        ConfigField::new(
            "SEG_SIZE",
            "8k",
            ConfigKind::MemUnits,
            "Largest active message (am_short and am_bcopy, header included); every FIFO element holds this much.",
        ),
        ConfigField::new(
            "FIFO_MAX_POLL",
            "16",
            ConfigKind::Uint,
            "Most messages one progress call delivers from the FIFO.",
        ),
        ConfigField::new(
            "PEER_CHECK_INTERVAL",
            "100ms",
            ConfigKind::Time,
            "How often endpoints check that their peer process and interface are still there (a failure goes to the error handler).",
        ),
    ],
};

/// The posix mapper.
pub static POSIX_CONFIG: ConfigTable = ConfigTable {
    name: "posix",
    prefix: "POSIX_",
    fields: &[ConfigField::new(
        "USE_PROC_LINK",
        "y",
        ConfigKind::Bool,
        "Peers map the segment through /proc/<pid>/fd (its /dev/shm name is removed at once, so nothing is left behind after a crash); n keeps the name until the interface closes (for containers without ptrace access).",
    )],
};

/// The sysv mapper.
pub static SYSV_CONFIG: ConfigTable = ConfigTable {
    name: "sysv",
    prefix: "SYSV_",
    fields: &[ConfigField::new(
        "HUGETLB_MODE",
        "n",
        ConfigKind::Ternary,
        "Back the FIFO segment with huge pages: y (fail without them), try, or n.",
    )],
};

/// Cross-memory attach.
pub static CMA_CONFIG: ConfigTable = ConfigTable {
    name: "cma",
    prefix: "CMA_",
    fields: &[
        ConfigField::new(
            "MAX_IOV",
            "16",
            ConfigKind::Uint,
            "Most local iov entries in one cma put_zcopy/get_zcopy (1 to 1024).",
        ),
        ConfigField::new(
            "RELEASE_TIMEOUT",
            "2s",
            ConfigKind::Time,
            "How long deregistering memory waits for a peer's copy still in flight on it (1ms to 1h); a copy that outlasts it (a peer killed or stopped inside process_vm_*) makes the deregistration fail with Busy, and the memory is kept, never freed.",
        ),
    ],
};

/// The FIFO settings of one interface, checked.
#[derive(Clone, Copy, Debug)]
pub struct MmSettings {
    pub fifo_size: u64,
    pub seg_size: usize,
    pub max_poll: u32,
    pub peer_check: Duration,
}

fn invalid(msg: String) -> Error {
    ucs::error!("{msg}");
    Error::new(Status::InvalidParam, msg)
}

impl MmSettings {
    pub fn read(config: &Overrides) -> Result<MmSettings> {
        let c = MM_CONFIG.with(config);
        let fifo_size = c.get_uint("FIFO_SIZE")?;
        if !(2..=65536).contains(&fifo_size) || !fifo_size.is_power_of_two() {
            return Err(invalid(format!(
                "RUCX_MM_FIFO_SIZE={fifo_size} is invalid: expected a power of 2 between 2 and 65536"
            )));
        }
        let seg = c.get_memunits("SEG_SIZE")?.bytes_or(8192);
        if !(64..=(1 << 20)).contains(&seg) {
            return Err(invalid(format!(
                "RUCX_MM_SEG_SIZE={seg} is invalid: expected between 64 bytes and 1m"
            )));
        }
        let max_poll = c.get_uint("FIFO_MAX_POLL")?;
        if !(1..=4096).contains(&max_poll) {
            return Err(invalid(format!(
                "RUCX_MM_FIFO_MAX_POLL={max_poll} is invalid: expected between 1 and 4096"
            )));
        }
        let peer_check = c
            .get_time("PEER_CHECK_INTERVAL")?
            .duration_or(Duration::from_millis(100))
            .clamp(Duration::from_millis(1), Duration::from_secs(3600));
        Ok(MmSettings {
            fifo_size,
            seg_size: seg as usize,
            max_poll: max_poll as u32,
            peer_check,
        })
    }
}

/// `RUCX_POSIX_USE_PROC_LINK`.
pub fn posix_proc_link(config: &Overrides) -> Result<bool> {
    POSIX_CONFIG.with(config).get_bool("USE_PROC_LINK")
}

/// `RUCX_SYSV_HUGETLB_MODE`.
pub fn sysv_hugetlb(config: &Overrides) -> Result<Ternary> {
    SYSV_CONFIG.with(config).get_ternary("HUGETLB_MODE")
}

/// `RUCX_CMA_RELEASE_TIMEOUT` (`auto`: 2 s), clamped to 1 ms .. 1 h.
pub fn cma_release_timeout(config: &Overrides) -> Result<Duration> {
    Ok(CMA_CONFIG
        .with(config)
        .get_time("RELEASE_TIMEOUT")?
        .duration_or(Duration::from_secs(2))
        .clamp(Duration::from_millis(1), Duration::from_secs(3600)))
}

/// `RUCX_CMA_MAX_IOV`, checked.
pub fn cma_max_iov(config: &Overrides) -> Result<usize> {
    let n = CMA_CONFIG.with(config).get_uint("MAX_IOV")?;
    if !(1..=1024).contains(&n) {
        return Err(invalid(format!(
            "RUCX_CMA_MAX_IOV={n} is invalid: expected between 1 and 1024"
        )));
    }
    Ok(n as usize)
}
