//! `RUCX_OFI_*` variables.

use ucs::config::{ConfigField, ConfigKind, ConfigTable};

/// The ofi transport's configuration.
pub static OFI_CONFIG: ConfigTable = ConfigTable {
    name: "ofi",
    prefix: "OFI_",
    fields: &[
        ConfigField::new(
            "PROVIDER",
            "tcp;ofi_rxm,shm,verbs;ofi_rxm,verbs,efa",
            ConfigKind::AllowList,
            "libfabric providers to offer as devices, named as fi_info prints them (globs work): a \
             layered name (verbs;ofi_rxm) or RDM provider (shm) gives reliable-datagram devices, a \
             core provider with connected endpoints (verbs, tcp) its FI_EP_MSG devices \
             (verbs/rxe0); ^list to leave them out; all.",
        ),
        ConfigField::new(
            "SEG_SIZE",
            "8k",
            ConfigKind::MemUnits,
            "Size of send and receive buffers: the largest bcopy AM (header included); clamped to the \
             provider's max_msg_size.",
        ),
        ConfigField::new(
            "TX_QUEUE_LEN",
            "256",
            ConfigKind::Uint,
            "Operations in flight per interface (sends, RMA, atomics) before sends return NoResource.",
        ),
        ConfigField::new(
            "RX_QUEUE_LEN",
            "256",
            ConfigKind::Uint,
            "Receive buffers posted per interface.",
        ),
        ConfigField::new(
            "RX_MAX_BATCH",
            "16",
            ConfigKind::Uint,
            "Receive buffers given back to the provider at a time: a consumed buffer is reposted \
             when this many wait or when progress finds no completion (1: at once).",
        ),
        ConfigField::new(
            "PEER_TIMEOUT",
            "10s",
            ConfigKind::Time,
            "How long an endpoint's sends may find the provider full (-FI_EAGAIN) before its peer \
             counts as gone (error handler, EndpointTimeout); inf: never.",
        ),
        ConfigField::new(
            "EVENT_FD",
            "n",
            ConfigKind::Bool,
            "Give every interface an event fd (a CQ fd wait object, which libfabric signals per \
             completion); without it, only interfaces opened for wakeup (UCP Features::WAKEUP) have one.",
        ),
    ],
};
