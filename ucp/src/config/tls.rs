//! `RUCX_TLS`: which transports a context uses, with UCX's `UCX_TLS` rules.
//!
//! A comma list of transport names or aliases; `^` in front makes it a deny list; `all` (the
//! default) allows everything. Aliases name groups: `rc` is rc_verbs plus ud_verbs for wireup
//! only (rc endpoints connect through it), `ud`, `ib` (rc and ud), `sm`/`shm` (the shared-memory
//! transports). `name:aux` allows a transport (or an alias's members) for wireup only; `\name`
//! is the transport called `name`, never the alias. Unknown names are not an error: a plugin
//! may provide them, and the context reports "no usable transport" when nothing matches.
//!
//! In a deny list aliases expand too (`^ib` denies rc_verbs and ud_verbs). A transport that
//! some alias uses for wireup (ud_verbs for rc) stays allowed for wireup when denied by name or
//! alias while a transport that needs it is still allowed (`^ud` keeps rc working, as in UCX);
//! `^ud_verbs,ud_verbs:aux` removes it entirely. Unlike UCX, it is dropped as well once every
//! transport needing it is denied (`^ib`), instead of being opened for nothing.

use std::fmt;

use ucs::config::{parse_allow_list, AllowList};
use ucs::{Error, Result, Status};

/// What `RUCX_TLS` says about one transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allowed {
    /// Usable for everything.
    Yes,
    /// Usable only as an auxiliary transport, to carry another transport's wireup.
    AuxOnly,
    /// Not usable.
    No,
}

/// Alias name → members; a member `tl:aux` is allowed for wireup only. UCX's table, less the
/// accelerator and Cray entries (rucx has no such transports).
const ALIASES: &[(&str, &[&str])] = &[
    ("mm", &["posix", "sysv", "xpmem"]),
    ("sm", &["posix", "sysv", "xpmem", "knem", "cma"]),
    ("shm", &["posix", "sysv", "xpmem", "knem", "cma"]),
    ("ib", &["rc_verbs", "ud_verbs", "rc_mlx5", "ud_mlx5", "dc_mlx5"]),
    ("ud_v", &["ud_verbs"]),
    ("ud_x", &["ud_mlx5"]),
    ("ud", &["ud_mlx5", "ud_verbs"]),
    ("rc_v", &["rc_verbs", "ud_verbs:aux"]),
    ("rc_x", &["rc_mlx5", "ud_mlx5:aux"]),
    ("rc", &["rc_mlx5", "ud_mlx5:aux", "rc_verbs", "ud_verbs:aux"]),
    ("dc", &["dc_mlx5", "ud_mlx5:aux"]),
    ("dc_x", &["dc_mlx5", "ud_mlx5:aux"]),
];

const AUX_SUFFIX: &str = ":aux";

/// The alias names, for messages and docs.
pub fn alias_names() -> impl Iterator<Item = &'static str> {
    ALIASES.iter().map(|(a, _)| *a)
}

/// The members of alias `name` (`tl` or `tl:aux`), if it is one.
pub fn alias_members(name: &str) -> Option<&'static [&'static str]> {
    ALIASES.iter().find(|(a, _)| *a == name).map(|(_, m)| *m)
}

fn alias_has(members: &[&str], tl: &str, aux: bool) -> bool {
    members.iter().any(|m| match m.strip_suffix(AUX_SUFFIX) {
        Some(base) => aux && base == tl,
        None => !aux && *m == tl,
    })
}

/// True when some alias lists `tl` as a wireup-only member.
fn is_aux_somewhere(tl: &str) -> bool {
    ALIASES.iter().any(|(_, m)| alias_has(m, tl, true))
}

/// One list entry: `name`, `\name` (`strict`: not an alias) or either with `:aux`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    name: String,
    strict: bool,
    aux: bool,
}

/// How `tl` appears in the list (UCX `ucp_transports_list_search`).
#[derive(Clone, Copy, Default)]
struct Hits {
    /// Named, or a member of a named alias.
    primary: bool,
    /// `tl:aux`, or a member of a listed `alias:aux`.
    aux_in_main: bool,
    /// A `:aux` member of a listed alias.
    aux_in_alias: bool,
}

/// A parsed `RUCX_TLS`: answers [`TlsFilter::allows`] for each transport name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFilter {
    /// `None`: `all`.
    entries: Option<Vec<Entry>>,
    deny: bool,
    /// The list as written, for messages.
    spec: String,
}

/// What [`TlsFilter::parse`] accepts: the [`AllowList`] read from `RUCX_TLS`, or its text.
pub trait TlsSpec {
    /// The allow list; `InvalidParam` for text that does not parse.
    fn to_allow_list(&self) -> Result<AllowList>;
}

impl TlsSpec for AllowList {
    fn to_allow_list(&self) -> Result<AllowList> {
        Ok(self.clone())
    }
}

impl TlsSpec for str {
    fn to_allow_list(&self) -> Result<AllowList> {
        parse_allow_list(self).ok_or_else(|| {
            invalid(
                self,
                "a comma list of transports or aliases, starting with ^ to deny them instead, or all",
            )
        })
    }
}

impl TlsSpec for String {
    fn to_allow_list(&self) -> Result<AllowList> {
        self.as_str().to_allow_list()
    }
}

fn invalid(spec: &str, expected: &str) -> Error {
    let msg = format!("RUCX_TLS={spec} is invalid: expected {expected}");
    ucs::error!("{msg}");
    Error::new(Status::InvalidParam, msg)
}

fn spec_of(l: &AllowList) -> String {
    match (l.deny, l.items.is_empty()) {
        (true, true) => "all".to_string(),
        (true, false) => format!("^{}", l.items.join(",")),
        (false, _) => l.items.join(","),
    }
}

impl TlsFilter {
    /// Parses `RUCX_TLS`. `InvalidParam` (naming the variable and the value, and logged) for
    /// an empty list, a glob, or a `:` suffix other than `:aux`.
    pub fn parse<S: TlsSpec + ?Sized>(spec: &S) -> Result<TlsFilter> {
        let l = spec.to_allow_list()?;
        TlsFilter::from_list(&l).map_err(|expected| invalid(&spec_of(&l), &expected))
    }

    /// [`TlsFilter::parse`] without the log line; `Err` says what is accepted.
    pub(crate) fn from_list(l: &AllowList) -> std::result::Result<TlsFilter, String> {
        let text = spec_of(l);
        if l.allows_all() {
            return Ok(TlsFilter {
                entries: None,
                deny: true,
                spec: text,
            });
        }
        if l.items.is_empty() {
            return Err(
                "the transports to use (e.g. tcp or rc,self), ^ and the ones to leave out, or all".into(),
            );
        }
        let mut entries = Vec::with_capacity(l.items.len());
        for item in &l.items {
            let lower = item.trim().to_ascii_lowercase();
            let (rest, aux) = match lower.strip_suffix(AUX_SUFFIX) {
                Some(r) => (r, true),
                None => (lower.as_str(), false),
            };
            let (name, strict) = match rest.strip_prefix('\\') {
                Some(n) => (n, true),
                None => (rest, false),
            };
            if name.is_empty() || name.contains([':', '\\', '*', '?', '^', ' ']) {
                return Err(format!(
                    "transport names or aliases, each optionally followed by :aux (entry '{item}' \
                     is not one; globs and device names are not accepted here)"
                ));
            }
            entries.push(Entry {
                name: name.to_string(),
                strict,
                aux,
            });
        }
        Ok(TlsFilter {
            entries: Some(entries),
            deny: l.deny,
            spec: text,
        })
    }

    /// `all`.
    pub fn all() -> TlsFilter {
        TlsFilter {
            entries: None,
            deny: true,
            spec: "all".to_string(),
        }
    }

    /// True for `all`.
    pub fn allows_all(&self) -> bool {
        self.entries.is_none()
    }

    /// True for a `^list`.
    pub fn is_deny_list(&self) -> bool {
        self.deny && self.entries.is_some()
    }

    /// Whether `name` (a transport or an alias, with `:aux` or not) is listed.
    fn present(entries: &[Entry], name: &str, is_alias: bool, aux: bool) -> bool {
        entries
            .iter()
            .any(|e| e.aux == aux && !(is_alias && e.strict) && e.name == name)
    }

    fn search(entries: &[Entry], tl: &str) -> Hits {
        let mut h = Hits {
            primary: Self::present(entries, tl, false, false),
            aux_in_main: Self::present(entries, tl, false, true),
            aux_in_alias: false,
        };
        for (alias, members) in ALIASES {
            if Self::present(entries, alias, true, false) {
                h.primary |= alias_has(members, tl, false);
                h.aux_in_alias |= alias_has(members, tl, true);
            }
            if Self::present(entries, alias, true, true) {
                h.aux_in_main |= alias_has(members, tl, false);
            }
        }
        h
    }

    /// What the list says about transport `tl` (e.g. `rc_verbs`, `tcp`; any case).
    pub fn allows(&self, tl: &str) -> Allowed {
        let Some(entries) = &self.entries else {
            return Allowed::Yes;
        };
        let tl = tl.to_ascii_lowercase();
        let h = Self::search(entries, &tl);
        if !self.deny {
            return if h.primary {
                Allowed::Yes
            } else if h.aux_in_main || h.aux_in_alias {
                Allowed::AuxOnly
            } else {
                Allowed::No
            };
        }
        if !h.primary {
            return Allowed::Yes;
        }
        if !is_aux_somewhere(&tl) || h.aux_in_main {
            return Allowed::No;
        }
        // Denied, but other transports use it for wireup: keep it for them while one of
        // them is still allowed.
        let needed = ALIASES
            .iter()
            .filter(|(_, m)| alias_has(m, &tl, true))
            .flat_map(|(_, m)| m.iter().filter(|x| !x.ends_with(AUX_SUFFIX)))
            .any(|user| !Self::search(entries, user).primary);
        if needed {
            Allowed::AuxOnly
        } else {
            Allowed::No
        }
    }

    /// The entries that name none of `available` (transport names) directly or through an
    /// alias, as written (lower case): for a warning like UCX's "transport 'x' is not
    /// available".
    pub fn unmatched<'a>(&self, available: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let Some(entries) = &self.entries else {
            return Vec::new();
        };
        let avail: Vec<String> = available.into_iter().map(str::to_ascii_lowercase).collect();
        entries
            .iter()
            .filter(|e| {
                let direct = avail.contains(&e.name);
                // An alias counts when one of its full members is there (rc with only
                // ud_verbs would carry nothing but wireup).
                let via_alias = !e.strict
                    && alias_members(&e.name).is_some_and(|m| avail.iter().any(|a| alias_has(m, a, false)));
                !direct && !via_alias
            })
            .map(|e| {
                format!(
                    "{}{}{}",
                    if e.strict { "\\" } else { "" },
                    e.name,
                    if e.aux { AUX_SUFFIX } else { "" }
                )
            })
            .collect()
    }
}

impl Default for TlsFilter {
    fn default() -> TlsFilter {
        TlsFilter::all()
    }
}

impl fmt::Display for TlsFilter {
    /// The list as given (`all`, `rc,tcp`, `^ib`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Allowed::{AuxOnly, No, Yes};

    fn check(spec: &str, table: &[(&str, Allowed)]) {
        let f = TlsFilter::parse(spec).unwrap_or_else(|e| panic!("RUCX_TLS={spec}: {e}"));
        for (tl, want) in table {
            assert_eq!(f.allows(tl), *want, "RUCX_TLS={spec}: {tl}");
        }
    }

    const TLS: [&str; 8] = [
        "self", "tcp", "rc_verbs", "ud_verbs", "posix", "sysv", "cma", "rc_mlx5",
    ];

    #[test]
    fn all_allows_everything() {
        for spec in ["all", " all ", "ALL", "tcp,all", "^"] {
            let f = TlsFilter::parse(spec).unwrap();
            assert!(f.allows_all(), "{spec}");
            for tl in TLS.iter().chain(&["made_up"]) {
                assert_eq!(f.allows(tl), Yes, "{spec}: {tl}");
            }
        }
        assert_eq!(TlsFilter::default().allows("tcp"), Yes);
        assert_eq!(TlsFilter::all().to_string(), "all");
    }

    #[test]
    fn allow_lists() {
        check(
            "tcp",
            &[("tcp", Yes), ("self", No), ("rc_verbs", No), ("ud_verbs", No)],
        );
        check(
            "tcp,self",
            &[("tcp", Yes), ("self", Yes), ("rc_verbs", No), ("posix", No)],
        );
        check("TCP, Self", &[("tcp", Yes), ("self", Yes)]);
        check("rc_verbs", &[("rc_verbs", Yes), ("ud_verbs", No), ("tcp", No)]);
        check(
            "rc_verbs,ud_verbs:aux",
            &[("rc_verbs", Yes), ("ud_verbs", AuxOnly), ("tcp", No)],
        );
        check("tcp,made_up", &[("tcp", Yes), ("made_up", Yes), ("self", No)]);
    }

    #[test]
    fn each_alias() {
        check(
            "rc",
            &[
                ("rc_verbs", Yes),
                ("ud_verbs", AuxOnly),
                ("rc_mlx5", Yes),
                ("ud_mlx5", AuxOnly),
                ("tcp", No),
                ("self", No),
            ],
        );
        check(
            "rc_v",
            &[("rc_verbs", Yes), ("ud_verbs", AuxOnly), ("rc_mlx5", No)],
        );
        check("ud", &[("ud_verbs", Yes), ("rc_verbs", No), ("tcp", No)]);
        check("ud_v", &[("ud_verbs", Yes), ("ud_mlx5", No)]);
        check(
            "ib",
            &[
                ("rc_verbs", Yes),
                ("ud_verbs", Yes),
                ("dc_mlx5", Yes),
                ("tcp", No),
            ],
        );
        for sm in ["sm", "shm"] {
            check(
                sm,
                &[
                    ("posix", Yes),
                    ("sysv", Yes),
                    ("cma", Yes),
                    ("xpmem", Yes),
                    ("tcp", No),
                    ("self", No),
                ],
            );
        }
        check("mm", &[("posix", Yes), ("cma", No)]);
        // rc and ud together: ud_verbs is a full transport, not only rc's wireup.
        check("rc,ud", &[("rc_verbs", Yes), ("ud_verbs", Yes)]);
        check(
            "rc,tcp,self",
            &[
                ("rc_verbs", Yes),
                ("ud_verbs", AuxOnly),
                ("tcp", Yes),
                ("self", Yes),
            ],
        );
        // rc:aux: rc's transports for wireup only.
        check(
            "tcp,rc:aux",
            &[("tcp", Yes), ("rc_verbs", AuxOnly), ("ud_verbs", No)],
        );
        for a in ["rc", "ud", "ib", "sm", "shm"] {
            assert!(alias_names().any(|n| n == a), "{a}");
        }
    }

    #[test]
    fn strict_names_skip_aliases() {
        // `\rc` is a transport called rc, not the alias.
        check("\\rc", &[("rc", Yes), ("rc_verbs", No), ("ud_verbs", No)]);
        check("\\tcp", &[("tcp", Yes)]);
    }

    #[test]
    fn deny_lists_expand_aliases() {
        check(
            "^tcp",
            &[("tcp", No), ("self", Yes), ("rc_verbs", Yes), ("ud_verbs", Yes)],
        );
        check(
            "^ib",
            &[
                ("rc_verbs", No),
                ("ud_verbs", No),
                ("rc_mlx5", No),
                ("tcp", Yes),
                ("self", Yes),
            ],
        );
        // ^rc leaves ud alone (it was only rc's wireup helper there).
        check("^rc", &[("rc_verbs", No), ("ud_verbs", Yes), ("tcp", Yes)]);
        // ^ud keeps ud_verbs for rc's wireup, as UCX does ...
        check("^ud", &[("ud_verbs", AuxOnly), ("rc_verbs", Yes), ("tcp", Yes)]);
        check("^ud_verbs", &[("ud_verbs", AuxOnly), ("rc_verbs", Yes)]);
        // ... unless told to drop that too, or nothing needing it is left.
        check("^ud,ud:aux", &[("ud_verbs", No), ("rc_verbs", Yes)]);
        check("^ud_verbs,ud_verbs:aux", &[("ud_verbs", No), ("rc_verbs", Yes)]);
        check("^ud,rc", &[("ud_verbs", No), ("rc_verbs", No), ("tcp", Yes)]);
        check(
            "^ud,rc_verbs",
            &[("ud_verbs", AuxOnly), ("rc_verbs", No), ("rc_mlx5", Yes)],
        );
        check(
            "^sm,self",
            &[("posix", No), ("cma", No), ("self", No), ("tcp", Yes)],
        );
        check("^made_up", &[("tcp", Yes), ("made_up", No)]);
        assert!(TlsFilter::parse("^tcp").unwrap().is_deny_list());
        assert!(!TlsFilter::parse("tcp").unwrap().is_deny_list());
    }

    #[test]
    fn invalid_lists() {
        for spec in [
            "",
            " , ",
            "tcp,^self",
            "tcp:1",
            "rc_*",
            "tcp:",
            ":aux",
            "rc:aux:aux",
            "\\",
        ] {
            let e = TlsFilter::parse(spec).unwrap_err();
            assert_eq!(e, Status::InvalidParam, "{spec}");
            assert!(e.context().unwrap().starts_with("RUCX_TLS="), "{spec}: {e}");
        }
        let e = TlsFilter::parse("tcp,lo:1").unwrap_err();
        assert!(e.context().unwrap().contains("'lo:1'"), "{e}");
    }

    #[test]
    fn parse_from_allow_list_and_display() {
        let l = parse_allow_list("^ib,tcp").unwrap();
        let f = TlsFilter::parse(&l).unwrap();
        assert_eq!(f, TlsFilter::parse("^ib,tcp").unwrap());
        assert_eq!(f.to_string(), "^ib,tcp");
        assert_eq!(TlsFilter::parse(&"rc".to_string()).unwrap().to_string(), "rc");
    }

    #[test]
    fn unmatched_entries() {
        let f = TlsFilter::parse("rc,tcp,sm,made_up,\\ud").unwrap();
        assert_eq!(
            f.unmatched(["tcp", "self", "rc_verbs"]),
            ["sm", "made_up", "\\ud"]
        );
        assert_eq!(f.unmatched(["tcp", "posix", "ud_verbs", "ud"]), ["rc", "made_up"]);
        assert!(TlsFilter::all().unmatched(["tcp"]).is_empty());
    }
}
