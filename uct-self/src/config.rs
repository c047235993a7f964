//! `RUCX_SELF_*` variables.

use ucs::config::{ConfigField, ConfigKind, ConfigTable};

/// The self transport's configuration.
pub static SELF_CONFIG: ConfigTable = ConfigTable {
    name: "self",
    prefix: "SELF_",
    fields: &[ConfigField::new(
        "SEG_SIZE",
        "8k",
        ConfigKind::MemUnits,
        "Largest AM (short, bcopy and zcopy, header included) and bcopy put/get.",
    )],
};
