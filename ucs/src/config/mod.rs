//! Typed configuration tables over `RUCX_<PREFIX><NAME>` environment variables (UCX
//! `ucs_config_parser`, without config files or sub-table prefix chains).
//!
//! A component declares a static [`ConfigTable`] (name, variable prefix, [`ConfigField`]s with
//! string defaults), [`register`]s it, and reads fields with the typed getters
//! ([`ConfigTable::get_memunits`] ...). A field's value is the environment variable if set, else
//! its default. Invalid values give `Err(Status::InvalidParam.into())` and one error log line naming the
//! variable, the value and what is accepted; [`ConfigTable::read`] returns the same text as a
//! [`ConfigError`]. Registered tables feed [`dump`] (`rucx-info -c`) and
//! [`warn_unknown_env_vars`].

mod net;
mod overrides;
mod parse;
mod registry;

pub use net::{device_allowed, device_matches, NET_TABLE};
pub use overrides::Overrides;

use std::borrow::Cow;
use std::fmt;

pub use parse::{
    glob_match, parse_allow_list, parse_bandwidth, parse_bool, parse_enum, parse_f64, parse_int, parse_list,
    parse_memunits, parse_ternary, parse_time, parse_uint, AllowList, Bandwidth, MemUnits, Ternary,
    TimeValue,
};
pub use registry::{
    check_known, dump, find_table, register, register_dynamic, tables, unknown_env_vars,
    warn_unknown_env_vars, ConfigEntry, DynField, UnknownVar,
};

use crate::{Error, Result, Status};

/// Prefix of every rucx environment variable.
pub const ENV_PREFIX: &str = "RUCX_";

/// Type of a configuration field; decides the parser and the accepted spellings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigKind {
    /// Memory size: `8k`, `64kb`, `1m`, `4096`, `inf`, `auto`.
    MemUnits,
    /// Time: `10ms`, `2s`, `100us`, `50ns`, `1m` (minute), `inf`, `auto`.
    Time,
    /// `y/n/yes/no/1/0/on/off/true/false`.
    Bool,
    /// A boolean or `try`.
    Ternary,
    /// Unsigned integer (decimal or `0x` hex).
    Uint,
    /// `auto` or an unsigned integer; read as a string (the reader resolves `auto`).
    AutoUint,
    /// Signed integer.
    Int,
    /// Floating-point number.
    Float,
    /// Any string.
    Str,
    /// Comma-separated list.
    List,
    /// Colon-separated list (paths).
    PathList,
    /// Comma list; a leading `^` makes it a deny list; `all`.
    AllowList,
    /// One of the given names (any case); read as an index.
    Enum(&'static [&'static str]),
    /// Bandwidth: `10GBps`, `100MB/s`, `auto`.
    Bandwidth,
}

impl ConfigKind {
    /// What a valid value looks like, for error messages and docs.
    pub fn expected(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            ConfigKind::MemUnits => "a memory size like 8k, 64kb, 1m, inf or auto",
            ConfigKind::Time => "a time like 10ms, 2s, 100us, 50ns, 1m (minute), 1.5s, inf or auto",
            ConfigKind::Bool => "a boolean: y/n, yes/no, 1/0, on/off or true/false",
            ConfigKind::Ternary => "y, n or try",
            ConfigKind::Uint => "a non-negative integer (decimal or 0x hex)",
            ConfigKind::AutoUint => "auto or a non-negative integer",
            ConfigKind::Int => "an integer",
            ConfigKind::Float => "a number like 1.5",
            ConfigKind::Str => "a string",
            ConfigKind::List => "a comma-separated list",
            ConfigKind::PathList => "a colon-separated list of paths",
            ConfigKind::AllowList => "a comma list of names, starting with ^ to deny them instead, or all",
            ConfigKind::Bandwidth => "a bandwidth like 10GBps, 100MB/s, 800Mbps or auto",
            ConfigKind::Enum(names) => return Cow::Owned(format!("one of {}", names.join("|"))),
        })
    }

    /// The kind as a string, as accepted by [`register_dynamic`]: `memunits`, `time`, `bool`,
    /// `ternary`, `uint`, `int`, `float`, `string`, `list`, `pathlist`, `allowlist`,
    /// `bandwidth`, `enum(a|b|c)`.
    pub fn spec(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            ConfigKind::MemUnits => "memunits",
            ConfigKind::Time => "time",
            ConfigKind::Bool => "bool",
            ConfigKind::Ternary => "ternary",
            ConfigKind::Uint => "uint",
            ConfigKind::AutoUint => "autouint",
            ConfigKind::Int => "int",
            ConfigKind::Float => "float",
            ConfigKind::Str => "string",
            ConfigKind::List => "list",
            ConfigKind::PathList => "pathlist",
            ConfigKind::AllowList => "allowlist",
            ConfigKind::Bandwidth => "bandwidth",
            ConfigKind::Enum(names) => return Cow::Owned(format!("enum({})", names.join("|"))),
        })
    }

    /// Parses `raw` according to this kind.
    pub fn parse(&self, raw: &str) -> Option<ConfigValue> {
        Some(match self {
            ConfigKind::MemUnits => ConfigValue::MemUnits(parse_memunits(raw)?),
            ConfigKind::Time => ConfigValue::Time(parse_time(raw)?),
            ConfigKind::Bool => ConfigValue::Bool(parse_bool(raw)?),
            ConfigKind::Ternary => ConfigValue::Ternary(parse_ternary(raw)?),
            ConfigKind::Uint => ConfigValue::Uint(parse_uint(raw)?),
            ConfigKind::AutoUint => {
                let r = raw.trim();
                if !r.eq_ignore_ascii_case("auto") {
                    parse_uint(r)?;
                }
                ConfigValue::Str(r.to_string())
            }
            ConfigKind::Int => ConfigValue::Int(parse_int(raw)?),
            ConfigKind::Float => ConfigValue::Float(parse_f64(raw)?),
            ConfigKind::Str => ConfigValue::Str(raw.to_string()),
            ConfigKind::List => ConfigValue::List(parse_list(raw, ',')),
            ConfigKind::PathList => ConfigValue::List(parse_list(raw, ':')),
            ConfigKind::AllowList => ConfigValue::AllowList(parse_allow_list(raw)?),
            ConfigKind::Enum(names) => ConfigValue::Enum(parse_enum(raw, names)?),
            ConfigKind::Bandwidth => ConfigValue::Bandwidth(parse_bandwidth(raw)?),
        })
    }
}

/// One configuration variable of a table.
#[derive(Clone, Copy, Debug)]
pub struct ConfigField {
    /// Name without prefixes, e.g. `TX_SEG_SIZE`.
    pub name: &'static str,
    /// Default value, in the same syntax as the variable.
    pub default: &'static str,
    /// One-line description.
    pub doc: &'static str,
    /// The value's syntax: how it is parsed and what `rucx-info -c` says it expects.
    pub kind: ConfigKind,
}

impl ConfigField {
    /// For concise static tables.
    pub const fn new(
        name: &'static str,
        default: &'static str,
        kind: ConfigKind,
        doc: &'static str,
    ) -> ConfigField {
        ConfigField {
            name,
            default,
            doc,
            kind,
        }
    }
}

/// A component's configuration: variables are `RUCX_<prefix><field name>`.
#[derive(Debug)]
pub struct ConfigTable {
    /// Short name, e.g. `tcp`.
    pub name: &'static str,
    /// Variable prefix including the trailing underscore, e.g. `TCP_` (`""` for globals).
    pub prefix: &'static str,
    /// The table's variables.
    pub fields: &'static [ConfigField],
}

/// A parsed value.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigValue {
    /// [`ConfigKind::MemUnits`].
    MemUnits(MemUnits),
    /// [`ConfigKind::Time`].
    Time(TimeValue),
    /// [`ConfigKind::Bool`].
    Bool(bool),
    /// [`ConfigKind::Ternary`].
    Ternary(Ternary),
    /// [`ConfigKind::Uint`].
    Uint(u64),
    /// [`ConfigKind::Int`].
    Int(i64),
    /// [`ConfigKind::Float`].
    Float(f64),
    /// [`ConfigKind::Str`] (and [`ConfigKind::AutoUint`], resolved by the reader).
    Str(String),
    /// [`ConfigKind::List`] and [`ConfigKind::PathList`]: the items in order.
    List(Vec<String>),
    /// An allow or deny list of names.
    AllowList(AllowList),
    /// An enumeration: the index of the value among the field's names.
    Enum(usize),
    /// A bandwidth.
    Bandwidth(Bandwidth),
}

/// Why a field could not be read. `Display` gives the logged text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The table has no such field (a bug in the caller).
    UnknownField {
        /// The table's name.
        table: String,
        /// The field asked for.
        field: String,
    },
    /// The value does not parse.
    Invalid {
        /// The variable's full name, e.g. `RUCX_TCP_SNDBUF`.
        var: String,
        /// The text that does not parse.
        value: String,
        /// What the variable accepts ([`ConfigKind::expected`]).
        expected: String,
        /// Where the value came from.
        source: ValueSource,
    },
    /// The field is read with a getter of another type (a bug in the caller).
    WrongKind {
        /// The variable's full name.
        var: String,
        /// The kind the table declares.
        declared: String,
        /// The kind the getter reads.
        requested: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::UnknownField { table, field } => {
                write!(f, "configuration table '{table}' has no field {field}")
            }
            ConfigError::Invalid {
                var,
                value,
                expected,
                source: ValueSource::Env,
            } => {
                write!(f, "{var}={value} is invalid: expected {expected}")
            }
            ConfigError::Invalid {
                var,
                value,
                expected,
                source: ValueSource::Code,
            } => {
                write!(f, "{var}={value} (set in code) is invalid: expected {expected}")
            }
            ConfigError::Invalid {
                var,
                value,
                expected,
                source: ValueSource::Default,
            } => write!(
                f,
                "built-in default of {var} ({value}) is invalid: expected {expected}; set {var}"
            ),
            ConfigError::WrongKind {
                var,
                declared,
                requested,
            } => {
                write!(f, "{var} is declared as {declared} but was read as {requested}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for Status {
    fn from(_: ConfigError) -> Status {
        Status::InvalidParam
    }
}

/// Where a field's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueSource {
    /// The field's built-in default.
    Default,
    /// The `RUCX_*` environment variable.
    Env,
    /// [`Overrides`] set in code.
    Code,
}

/// A field's raw string and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawValue {
    /// The text as set, or the default.
    pub value: String,
    /// True if set (in the environment or in code), false for the default.
    pub is_set: bool,
    /// Where it came from.
    pub source: ValueSource,
}

impl ConfigTable {
    /// The field called `name`.
    pub fn field(&self, name: &str) -> Option<&'static ConfigField> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Environment variable of a field: `RUCX_<prefix><name>`.
    pub fn env_name(&self, name: &str) -> String {
        format!("{ENV_PREFIX}{}{name}", self.prefix)
    }

    fn lookup(&self, name: &str) -> std::result::Result<&'static ConfigField, ConfigError> {
        self.field(name).ok_or_else(|| ConfigError::UnknownField {
            table: self.name.to_string(),
            field: name.to_string(),
        })
    }

    /// Reads this table from the environment (and defaults) only.
    pub fn env(&self) -> ConfigReader<'_> {
        ConfigReader {
            table: self,
            code: None,
        }
    }

    /// Reads this table with `code` on top of the environment: a name set there wins over
    /// `RUCX_<name>`, which wins over the default.
    pub fn with<'a>(&'a self, code: &'a Overrides) -> ConfigReader<'a> {
        ConfigReader {
            table: self,
            code: Some(code),
        }
    }

    /// The raw string of a field: the environment variable if set, else the default.
    pub fn raw(&self, name: &str) -> std::result::Result<RawValue, ConfigError> {
        self.env().raw(name)
    }

    /// Reads and parses a field according to its kind (environment, else default).
    pub fn read(&self, name: &str) -> std::result::Result<ConfigValue, ConfigError> {
        self.env().read(name)
    }
}

/// Generates a [`ConfigTable`] getter that reads the environment only, for each typed getter
/// of [`ConfigReader`].
macro_rules! env_getters {
    ($($(#[$m:meta])* $name:ident -> $ty:ty;)*) => {
        impl ConfigTable {
            $($(#[$m])* pub fn $name(&self, name: &str) -> Result<$ty> {
                self.env().$name(name)
            })*
        }
    };
}

env_getters! {
    /// Reads a [`ConfigKind::MemUnits`] field.
    get_memunits -> MemUnits;
    /// Reads a [`ConfigKind::Time`] field.
    get_time -> TimeValue;
    /// Reads a [`ConfigKind::Bool`] field.
    get_bool -> bool;
    /// Reads a [`ConfigKind::Ternary`] field.
    get_ternary -> Ternary;
    /// Reads a [`ConfigKind::Uint`] field.
    get_uint -> u64;
    /// Reads a [`ConfigKind::Int`] field.
    get_int -> i64;
    /// Reads a [`ConfigKind::Float`] field.
    get_f64 -> f64;
    /// The raw string of any field.
    get_str -> String;
    /// Reads a [`ConfigKind::List`] (comma) or [`ConfigKind::PathList`] (colon) field.
    get_list -> Vec<String>;
    /// Reads a [`ConfigKind::AllowList`] field.
    get_allow_list -> AllowList;
    /// Reads a [`ConfigKind::Enum`] field as the index of the chosen name.
    get_enum -> usize;
    /// Reads a [`ConfigKind::Bandwidth`] field.
    get_bandwidth -> Bandwidth;
}

/// Reads a [`ConfigTable`]'s fields from one source stack: values set in code, then the
/// environment, then the defaults. Invalid values give an [`Error`] naming the variable, the
/// value and what is accepted (also logged once, for the operator).
#[derive(Clone, Copy)]
pub struct ConfigReader<'a> {
    table: &'a ConfigTable,
    code: Option<&'a Overrides>,
}

impl ConfigReader<'_> {
    /// The raw string of a field and where it came from.
    pub fn raw(&self, name: &str) -> std::result::Result<RawValue, ConfigError> {
        let t = self.table;
        let field = t.lookup(name)?;
        let var = t.env_name(name);
        if let Some(v) = self.code.and_then(|c| c.get(&format!("{}{name}", t.prefix))) {
            return Ok(RawValue {
                value: v.to_owned(),
                is_set: true,
                source: ValueSource::Code,
            });
        }
        match std::env::var_os(&var) {
            None => Ok(RawValue {
                value: field.default.to_string(),
                is_set: false,
                source: ValueSource::Default,
            }),
            Some(v) => match v.into_string() {
                Ok(value) => Ok(RawValue {
                    value,
                    is_set: true,
                    source: ValueSource::Env,
                }),
                Err(v) => Err(ConfigError::Invalid {
                    var,
                    value: v.to_string_lossy().into_owned(),
                    expected: format!("UTF-8 text: {}", field.kind.expected()),
                    source: ValueSource::Env,
                }),
            },
        }
    }

    /// Reads and parses a field according to its kind.
    pub fn read(&self, name: &str) -> std::result::Result<ConfigValue, ConfigError> {
        let field = self.table.lookup(name)?;
        let raw = self.raw(name)?;
        field.kind.parse(&raw.value).ok_or_else(|| ConfigError::Invalid {
            var: self.table.env_name(name),
            value: raw.value,
            expected: field.kind.expected().into_owned(),
            source: raw.source,
        })
    }

    /// Reads a field and extracts one variant; errors are logged and returned with their text.
    fn typed<R>(
        &self,
        name: &str,
        requested: &'static str,
        extract: impl FnOnce(ConfigValue) -> Option<R>,
    ) -> Result<R> {
        let res = self.read(name).and_then(|v| {
            extract(v).ok_or_else(|| ConfigError::WrongKind {
                var: self.table.env_name(name),
                declared: self
                    .table
                    .field(name)
                    .map(|f| f.kind.spec().into_owned())
                    .unwrap_or_default(),
                requested,
            })
        });
        res.map_err(|e| {
            crate::error!("{e}");
            Error::from(e)
        })
    }

    /// Reads a [`ConfigKind::MemUnits`] field.
    pub fn get_memunits(&self, name: &str) -> Result<MemUnits> {
        self.typed(name, "memunits", |v| match v {
            ConfigValue::MemUnits(m) => Some(m),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Time`] field.
    pub fn get_time(&self, name: &str) -> Result<TimeValue> {
        self.typed(name, "time", |v| match v {
            ConfigValue::Time(t) => Some(t),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Bool`] field.
    pub fn get_bool(&self, name: &str) -> Result<bool> {
        self.typed(name, "bool", |v| match v {
            ConfigValue::Bool(b) => Some(b),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Ternary`] field.
    pub fn get_ternary(&self, name: &str) -> Result<Ternary> {
        self.typed(name, "ternary", |v| match v {
            ConfigValue::Ternary(t) => Some(t),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Uint`] field.
    pub fn get_uint(&self, name: &str) -> Result<u64> {
        self.typed(name, "uint", |v| match v {
            ConfigValue::Uint(u) => Some(u),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Int`] field.
    pub fn get_int(&self, name: &str) -> Result<i64> {
        self.typed(name, "int", |v| match v {
            ConfigValue::Int(i) => Some(i),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Float`] field.
    pub fn get_f64(&self, name: &str) -> Result<f64> {
        self.typed(name, "float", |v| match v {
            ConfigValue::Float(x) => Some(x),
            _ => None,
        })
    }

    /// The raw string of any field.
    pub fn get_str(&self, name: &str) -> Result<String> {
        self.raw(name).map(|r| r.value).map_err(|e| {
            crate::error!("{e}");
            Error::from(e)
        })
    }

    /// Reads a [`ConfigKind::List`] (comma) or [`ConfigKind::PathList`] (colon) field.
    pub fn get_list(&self, name: &str) -> Result<Vec<String>> {
        self.typed(name, "list", |v| match v {
            ConfigValue::List(l) => Some(l),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::AllowList`] field.
    pub fn get_allow_list(&self, name: &str) -> Result<AllowList> {
        self.typed(name, "allowlist", |v| match v {
            ConfigValue::AllowList(a) => Some(a),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Enum`] field as the index of the chosen name.
    pub fn get_enum(&self, name: &str) -> Result<usize> {
        self.typed(name, "enum", |v| match v {
            ConfigValue::Enum(i) => Some(i),
            _ => None,
        })
    }

    /// Reads a [`ConfigKind::Bandwidth`] field.
    pub fn get_bandwidth(&self, name: &str) -> Result<Bandwidth> {
        self.typed(name, "bandwidth", |v| match v {
            ConfigValue::Bandwidth(b) => Some(b),
            _ => None,
        })
    }
}

/// Names of `RUCX_LOG_LEVEL`, in [`GLOBAL_TABLE`] order.
pub const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace"];

/// Process-wide settings (prefix `""`): `RUCX_LOG_LEVEL`, `RUCX_LOG_RATE_LIMIT`,
/// `RUCX_MODULE_DIR`, `RUCX_MODULES`.
/// Always registered. Other global variables can be added as further tables with prefix `""`
/// (e.g. [`NET_TABLE`], `RUCX_NET_DEVICES`).
pub static GLOBAL_TABLE: ConfigTable = ConfigTable {
    name: "global",
    prefix: "",
    fields: &[
        ConfigField::new(
            "LOG_LEVEL",
            "warn",
            ConfigKind::Enum(LOG_LEVELS),
            "Level of rucx's stderr log when the application has no tracing subscriber.",
        ),
        ConfigField::new(
            "LOG_RATE_LIMIT",
            "1s",
            ConfigKind::Time,
            "Lines a peer can trigger (garbage frames, refused remote accesses) are logged at most \
             once per this time from each place, with the count of those suppressed; 0: all.",
        ),
        ConfigField::new(
            "MODULE_DIR",
            "",
            ConfigKind::PathList,
            "Colon-separated directories searched for plugins first, before the executable's \
             directory and its rucx/ subfolder.",
        ),
        ConfigField::new(
            "MODULES",
            "all",
            ConfigKind::AllowList,
            "Plugins to load: comma list of names (globs allowed), ^ for a deny list, or all.",
        ),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_FIELDS: &[ConfigField] = &[
        ConfigField::new("SEG_SIZE", "8k", ConfigKind::MemUnits, "segment size"),
        ConfigField::new("TIMEOUT", "10ms", ConfigKind::Time, "timeout"),
        ConfigField::new("ENABLE", "y", ConfigKind::Bool, "switch"),
        ConfigField::new("MODE", "try", ConfigKind::Ternary, "mode"),
        ConfigField::new("COUNT", "16", ConfigKind::Uint, "count"),
        ConfigField::new("FACTOR", "1.5", ConfigKind::Float, "factor"),
        ConfigField::new("NAMES", "a,b", ConfigKind::List, "names"),
        ConfigField::new("DEVICES", "all", ConfigKind::AllowList, "devices"),
        ConfigField::new("FLAVOR", "Sweet", ConfigKind::Enum(&["sweet", "sour"]), "flavor"),
        ConfigField::new("BROKEN", "12q", ConfigKind::MemUnits, "bad default"),
    ];

    static TEST_TABLE: ConfigTable = ConfigTable {
        name: "cfgtest",
        prefix: "CFGTEST_",
        fields: TEST_FIELDS,
    };

    /// The same fields under their own prefix for the test that sets variables: tests run in
    /// parallel threads of one process, so `defaults` must never see them.
    static ENV_TABLE: ConfigTable = ConfigTable {
        name: "cfgenv",
        prefix: "CFGENV_",
        fields: TEST_FIELDS,
    };

    #[test]
    fn defaults() {
        let t = &TEST_TABLE;
        assert_eq!(t.get_memunits("SEG_SIZE"), Ok(MemUnits::Bytes(8192)));
        assert_eq!(
            t.get_time("TIMEOUT"),
            Ok(TimeValue::Dur(std::time::Duration::from_millis(10)))
        );
        assert_eq!(t.get_bool("ENABLE"), Ok(true));
        assert_eq!(t.get_ternary("MODE"), Ok(Ternary::Try));
        assert_eq!(t.get_uint("COUNT"), Ok(16));
        assert_eq!(t.get_f64("FACTOR"), Ok(1.5));
        assert_eq!(t.get_list("NAMES"), Ok(vec!["a".to_string(), "b".to_string()]));
        assert!(t.get_allow_list("DEVICES").unwrap().allows_all());
        assert_eq!(t.get_enum("FLAVOR"), Ok(0));
        assert_eq!(t.env_name("SEG_SIZE"), "RUCX_CFGTEST_SEG_SIZE");
    }

    #[test]
    fn env_overrides_and_errors() {
        let t = &ENV_TABLE;
        std::env::set_var("RUCX_CFGENV_COUNT", "0x20");
        std::env::set_var("RUCX_CFGENV_FLAVOR", "SOUR");
        std::env::set_var("RUCX_CFGENV_SEG_SIZE", "12q");
        assert_eq!(t.get_uint("COUNT"), Ok(32));
        assert_eq!(t.get_enum("FLAVOR"), Ok(1));
        assert_eq!(
            t.raw("COUNT").unwrap(),
            RawValue {
                value: "0x20".into(),
                is_set: true,
                source: ValueSource::Env,
            }
        );
        // Values set in code win over the environment, and say so when invalid.
        let mut code = Overrides::new();
        code.set("CFGENV_COUNT", "7");
        code.set("CFGENV_SEG_SIZE", "4k");
        assert_eq!(t.with(&code).get_uint("COUNT"), Ok(7));
        assert_eq!(t.with(&code).raw("COUNT").unwrap().source, ValueSource::Code);
        assert_eq!(t.with(&code).get_memunits("SEG_SIZE"), Ok(MemUnits::Bytes(4096)));
        assert_eq!(t.with(&code).get_enum("FLAVOR"), Ok(1));
        code.set("RUCX_CFGENV_COUNT", "many");
        let e = t.with(&code).get_uint("COUNT").unwrap_err();
        assert_eq!(e, Status::InvalidParam);
        assert!(
            e.context()
                .unwrap()
                .contains("RUCX_CFGENV_COUNT=many (set in code) is invalid"),
            "{e}"
        );
        assert_eq!(t.get_memunits("SEG_SIZE"), Err(Status::InvalidParam.into()));
        let err = t.read("SEG_SIZE").unwrap_err();
        assert_eq!(
            err.to_string(),
            "RUCX_CFGENV_SEG_SIZE=12q is invalid: expected a memory size like 8k, 64kb, 1m, inf \
             or auto"
        );
        std::env::set_var("RUCX_CFGENV_FLAVOR", "bitter");
        assert_eq!(
            t.read("FLAVOR").unwrap_err().to_string(),
            "RUCX_CFGENV_FLAVOR=bitter is invalid: expected one of sweet|sour"
        );
        assert!(t
            .read("BROKEN")
            .unwrap_err()
            .to_string()
            .contains("built-in default"));
        assert_eq!(
            t.read("NOPE").unwrap_err(),
            ConfigError::UnknownField {
                table: "cfgenv".into(),
                field: "NOPE".into()
            }
        );
        assert_eq!(
            t.get_bool("COUNT"),
            Err(Status::InvalidParam.into()),
            "wrong getter"
        );
        assert_eq!(t.get_str("COUNT"), Ok("0x20".to_string()));
        for v in ["RUCX_CFGENV_COUNT", "RUCX_CFGENV_FLAVOR", "RUCX_CFGENV_SEG_SIZE"] {
            std::env::remove_var(v);
        }
    }

    #[test]
    fn global_table_defaults() {
        assert_eq!(GLOBAL_TABLE.field("LOG_LEVEL").unwrap().default, "warn");
        assert_eq!(
            GLOBAL_TABLE.field("LOG_LEVEL").unwrap().kind,
            ConfigKind::Enum(LOG_LEVELS)
        );
        assert!(GLOBAL_TABLE.get_list("MODULE_DIR").is_ok());
        assert!(GLOBAL_TABLE.get_allow_list("MODULES").is_ok());
        assert_eq!(GLOBAL_TABLE.env_name("MODULES"), "RUCX_MODULES");
    }

    #[test]
    fn kind_spec_round_trip() {
        let kinds = [
            ConfigKind::MemUnits,
            ConfigKind::Time,
            ConfigKind::Bool,
            ConfigKind::Ternary,
            ConfigKind::Uint,
            ConfigKind::Int,
            ConfigKind::Float,
            ConfigKind::Str,
            ConfigKind::List,
            ConfigKind::PathList,
            ConfigKind::AllowList,
            ConfigKind::Bandwidth,
            ConfigKind::Enum(&["x", "y"]),
        ];
        for k in kinds {
            let back = registry::kind_from_spec(&k.spec()).unwrap();
            assert_eq!(back.spec(), k.spec());
        }
        assert!(registry::kind_from_spec("complex").is_none());
        assert!(registry::kind_from_spec("enum()").is_none());
    }
}
