//! The process-wide list of configuration tables, tables registered at run time (plugins),
//! the `rucx-info -c` dump and the unknown-variable check.

use std::sync::RwLock;

use once_cell::sync::{Lazy, OnceCell};

use super::{ConfigField, ConfigKind, ConfigTable, ENV_PREFIX, GLOBAL_TABLE, NET_TABLE};
use crate::{Result, Status};

/// Tables every process has, whichever components it loads: the globals, the CPU copy
/// tuning and the network-device list shared by all network transports and UCP.
static TABLES: Lazy<RwLock<Vec<&'static ConfigTable>>> =
    Lazy::new(|| RwLock::new(vec![&GLOBAL_TABLE, &crate::arch::ARCH_TABLE, &NET_TABLE]));

fn same(a: &ConfigTable, b: &ConfigTable) -> bool {
    std::ptr::eq(a, b) || (a.name == b.name && a.prefix == b.prefix)
}

/// Adds a table to the registry; registering it (or one with the same name and prefix) again
/// has no effect.
pub fn register(table: &'static ConfigTable) {
    let mut tables = TABLES.write().unwrap_or_else(|e| e.into_inner());
    if !tables.iter().any(|t| same(t, table)) {
        tables.push(table);
    }
}

/// All registered tables, [`GLOBAL_TABLE`] first, then in registration order.
pub fn tables() -> Vec<&'static ConfigTable> {
    TABLES.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The registered table called `name`.
pub fn find_table(name: &str) -> Option<&'static ConfigTable> {
    tables().into_iter().find(|t| t.name == name)
}

/// A field of a table known only at run time (e.g. sent by a plugin as strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynField {
    /// Name without prefixes, as in [`ConfigField::name`].
    pub name: String,
    /// Default value.
    pub default: String,
    /// One-line description.
    pub doc: String,
    /// The kind as written by [`ConfigKind::spec`], e.g. `memunits` or `enum(a|b)`.
    pub kind: String,
}

impl DynField {
    /// A field from its parts (see the fields).
    pub fn new(name: &str, default: &str, doc: &str, kind: &str) -> DynField {
        DynField {
            name: name.into(),
            default: default.into(),
            doc: doc.into(),
            kind: kind.into(),
        }
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

/// Parses a kind spec; enum names are leaked (only called once per registered table).
pub(super) fn kind_from_spec(spec: &str) -> Option<ConfigKind> {
    let spec = spec.trim();
    Some(match spec.to_ascii_lowercase().as_str() {
        "memunits" => ConfigKind::MemUnits,
        "time" => ConfigKind::Time,
        "bool" => ConfigKind::Bool,
        "ternary" => ConfigKind::Ternary,
        "uint" => ConfigKind::Uint,
        "autouint" => ConfigKind::AutoUint,
        "int" => ConfigKind::Int,
        "float" => ConfigKind::Float,
        "string" | "str" => ConfigKind::Str,
        "list" => ConfigKind::List,
        "pathlist" => ConfigKind::PathList,
        "allowlist" => ConfigKind::AllowList,
        "bandwidth" => ConfigKind::Bandwidth,
        _ => {
            let inner = spec.strip_prefix("enum(")?.strip_suffix(')')?;
            let names: Vec<&'static str> = inner
                .split('|')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(leak)
                .collect();
            if names.is_empty() {
                return None;
            }
            ConfigKind::Enum(Box::leak(names.into_boxed_slice()))
        }
    })
}

/// Registers a table described by strings (a plugin's table) and returns it. If a table with
/// this name and prefix is already registered, that one is returned. The table's memory is
/// kept for the life of the process, like a static table.
pub fn register_dynamic(name: &str, prefix: &str, fields: Vec<DynField>) -> Result<&'static ConfigTable> {
    if let Some(t) = tables()
        .into_iter()
        .find(|t| t.name == name && t.prefix == prefix)
    {
        return Ok(t);
    }
    let mut kinds = Vec::with_capacity(fields.len());
    for f in &fields {
        match kind_from_spec(&f.kind) {
            Some(k) => kinds.push(k),
            None => {
                crate::error!(
                    table = name,
                    "configuration field {} has unknown kind '{}'; expected memunits, time, \
                     bool, ternary, uint, int, float, string, list, pathlist, allowlist, \
                     bandwidth or enum(a|b)",
                    f.name,
                    f.kind
                );
                return Err(Status::InvalidParam.into());
            }
        }
    }
    let fields: Vec<ConfigField> = fields
        .iter()
        .zip(kinds)
        .map(|(f, kind)| ConfigField {
            name: leak(&f.name),
            default: leak(&f.default),
            doc: leak(&f.doc),
            kind,
        })
        .collect();
    let table: &'static ConfigTable = Box::leak(Box::new(ConfigTable {
        name: leak(name),
        prefix: leak(prefix),
        fields: Box::leak(fields.into_boxed_slice()),
    }));
    let mut all = TABLES.write().unwrap_or_else(|e| e.into_inner());
    // Another thread may have registered it meanwhile; keep the first.
    if let Some(t) = all.iter().find(|t| same(t, table)) {
        return Ok(t);
    }
    all.push(table);
    Ok(table)
}

/// One line of [`dump`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEntry {
    /// Table name.
    pub table: &'static str,
    /// Variable name, e.g. `RUCX_TCP_TX_SEG_SIZE`.
    pub full_name: String,
    /// Current value (environment or default), unparsed.
    pub value: String,
    /// Default value.
    pub default: &'static str,
    /// One-line description.
    pub doc: &'static str,
    /// [`ConfigKind::expected`] text.
    pub syntax: String,
    /// True if set in the environment.
    pub is_set: bool,
    /// Why the value is invalid (what a reader of it would get as its error), if it is.
    pub error: Option<String>,
}

/// Every registered variable with its current value, sorted by table name (fields in table
/// order), for `rucx-info -c`.
pub fn dump() -> Vec<ConfigEntry> {
    let mut tables = tables();
    tables.sort_by_key(|t| t.name);
    let mut out = Vec::new();
    for t in tables {
        for f in t.fields {
            let full_name = t.env_name(f.name);
            let env = std::env::var_os(&full_name);
            let error = t.read(f.name).err().map(|e| e.to_string());
            out.push(ConfigEntry {
                table: t.name,
                value: env
                    .as_ref()
                    .map(|v| v.to_string_lossy().into_owned())
                    .unwrap_or_else(|| f.default.to_string()),
                is_set: env.is_some(),
                full_name,
                default: f.default,
                doc: f.doc,
                syntax: f.kind.expected().into_owned(),
                error,
            });
        }
    }
    out
}

/// A `RUCX_*` environment variable that no registered table declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownVar {
    /// The variable as set, e.g. `RUCX_TCP_SNDBUFF`.
    pub name: String,
    /// The closest known variable, if one is close enough to be a likely typo.
    pub suggestion: Option<String>,
}

/// Lists the `RUCX_*` environment variables not declared by any registered table.
pub fn unknown_env_vars() -> Vec<UnknownVar> {
    let known: Vec<String> = tables()
        .iter()
        .flat_map(|t| t.fields.iter().map(|f| t.env_name(f.name)))
        .collect();
    let mut unknown: Vec<UnknownVar> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with(ENV_PREFIX) && !known.contains(k))
        .map(|name| {
            let suggestion = closest(&name, &known);
            UnknownVar { name, suggestion }
        })
        .collect();
    unknown.sort_by(|a, b| a.name.cmp(&b.name));
    unknown
}

/// Checks that every name in `code` is declared by a registered table: `Err` names the first
/// unknown one, with the closest known name when it looks like a typo.
pub fn check_known(code: &super::Overrides) -> Result<()> {
    let known: Vec<String> = tables()
        .iter()
        .flat_map(|t| t.fields.iter().map(|f| t.env_name(f.name)))
        .collect();
    for (name, _) in code.iter() {
        let full = format!("{ENV_PREFIX}{name}");
        if !known.contains(&full) {
            let hint = match closest(&full, &known) {
                Some(s) => format!("did you mean {}?", &s[ENV_PREFIX.len()..]),
                None => "`rucx-info -c` lists the valid ones".to_string(),
            };
            return Err(crate::Error::new(
                Status::InvalidParam,
                format!("unknown configuration variable {name} set in code; {hint}"),
            ));
        }
    }
    Ok(())
}

/// Warns once per process about each unknown `RUCX_*` variable (call it after the tables of the
/// loaded components are registered).
pub fn warn_unknown_env_vars() {
    static DONE: OnceCell<()> = OnceCell::new();
    DONE.get_or_init(|| {
        for u in unknown_env_vars() {
            match &u.suggestion {
                Some(s) => crate::warn!("unknown environment variable {}; did you mean {s}?", u.name),
                None => crate::warn!(
                    "unknown environment variable {}; `rucx-info -c` lists the valid ones",
                    u.name
                ),
            }
        }
    });
}

fn closest(name: &str, known: &[String]) -> Option<String> {
    let limit = (name.len() / 4).clamp(1, 4);
    known
        .iter()
        .map(|k| (edit_distance(name, k), k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.clone())
}

/// Levenshtein distance over bytes (variable names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    static REG_TABLE: ConfigTable = ConfigTable {
        name: "regtest",
        prefix: "REGTEST_",
        fields: &[
            ConfigField::new("RX_QUEUE_LEN", "256", ConfigKind::Uint, "rx queue"),
            ConfigField::new("SNDBUF", "auto", ConfigKind::MemUnits, "send buffer"),
        ],
    };

    /// Its own prefix for the test that sets variables the dump test reads as unset: tests
    /// run in parallel threads of one process.
    static UNKNOWN_TEST_TABLE: ConfigTable = ConfigTable {
        name: "unktest",
        prefix: "UNKTEST_",
        fields: &[ConfigField::new(
            "RX_QUEUE_LEN",
            "256",
            ConfigKind::Uint,
            "rx queue",
        )],
    };

    #[test]
    fn register_is_idempotent_and_global_first() {
        register(&REG_TABLE);
        register(&REG_TABLE);
        let all = tables();
        assert!(std::ptr::eq(all[0], &GLOBAL_TABLE));
        assert_eq!(all.iter().filter(|t| t.name == "regtest").count(), 1);
        assert!(find_table("regtest").is_some());
    }

    #[test]
    fn dynamic_tables() {
        let fields = vec![
            DynField::new("LEVEL", "mid", "a level", "enum(low|mid|high)"),
            DynField::new("SIZE", "4k", "a size", "memunits"),
        ];
        let t = register_dynamic("dyntest", "DYNTEST_", fields.clone()).unwrap();
        assert_eq!(t.get_enum("LEVEL"), Ok(1));
        assert_eq!(t.get_memunits("SIZE"), Ok(super::super::MemUnits::Bytes(4096)));
        let again = register_dynamic("dyntest", "DYNTEST_", fields).unwrap();
        assert!(std::ptr::eq(t, again), "same table returned on re-registration");
        assert_eq!(
            register_dynamic("dynbad", "DYNBAD_", vec![DynField::new("X", "1", "", "complex")]).unwrap_err(),
            Status::InvalidParam
        );
        assert!(find_table("dynbad").is_none());
    }

    #[test]
    fn dump_lists_values_sorted_by_table() {
        register(&REG_TABLE);
        std::env::set_var("RUCX_REGTEST_SNDBUF", "64k");
        let d = dump();
        let names: Vec<&str> = d.iter().map(|e| e.table).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        let e = d.iter().find(|e| e.full_name == "RUCX_REGTEST_SNDBUF").unwrap();
        assert_eq!((e.value.as_str(), e.default, e.is_set), ("64k", "auto", true));
        let e = d
            .iter()
            .find(|e| e.full_name == "RUCX_REGTEST_RX_QUEUE_LEN")
            .unwrap();
        assert_eq!((e.value.as_str(), e.is_set), ("256", false));
        assert!(d.iter().any(|e| e.full_name == "RUCX_LOG_LEVEL"));
        std::env::remove_var("RUCX_REGTEST_SNDBUF");
    }

    #[test]
    fn unknown_vars_with_suggestions() {
        register(&UNKNOWN_TEST_TABLE);
        std::env::set_var("RUCX_UNKTEST_RX_QUEUE_LNE", "1");
        std::env::set_var("RUCX_ZZZ_TOTALLY_UNRELATED_THING", "1");
        std::env::set_var("RUCX_UNKTEST_RX_QUEUE_LEN", "1");
        let u = unknown_env_vars();
        let typo = u.iter().find(|v| v.name == "RUCX_UNKTEST_RX_QUEUE_LNE").unwrap();
        assert_eq!(typo.suggestion.as_deref(), Some("RUCX_UNKTEST_RX_QUEUE_LEN"));
        let other = u
            .iter()
            .find(|v| v.name == "RUCX_ZZZ_TOTALLY_UNRELATED_THING")
            .unwrap();
        assert_eq!(other.suggestion, None);
        assert!(!u.iter().any(|v| v.name == "RUCX_UNKTEST_RX_QUEUE_LEN"));
        warn_unknown_env_vars();
        warn_unknown_env_vars();
        for v in [
            "RUCX_UNKTEST_RX_QUEUE_LNE",
            "RUCX_ZZZ_TOTALLY_UNRELATED_THING",
            "RUCX_UNKTEST_RX_QUEUE_LEN",
        ] {
            std::env::remove_var(v);
        }
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
