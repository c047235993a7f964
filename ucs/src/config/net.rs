//! Network-device selection shared by every network transport and by UCP
//! (`RUCX_NET_DEVICES`): one table, always registered, so tcp, ib and the ucp context read the
//! same variable and `rucx-info -c` lists it once.

use super::{glob_match, AllowList, ConfigField, ConfigKind, ConfigTable};

/// `RUCX_NET_DEVICES` (prefix `""`). Always registered, like [`super::GLOBAL_TABLE`].
pub static NET_TABLE: ConfigTable = ConfigTable {
    name: "net",
    prefix: "",
    fields: &[ConfigField::new(
        "NET_DEVICES",
        "all",
        ConfigKind::AllowList,
        "Network devices to use, by every transport: a comma list of device names such as lo, \
         eth0 or rxe0:1 (globs allowed), ^list to exclude them, or all.",
    )],
};

/// Whether device list entry `pattern` names device `name`: `all`, the exact name
/// (`rxe0:1`, `lo`), or a glob with `*` and `?` (`eth*`, `rxe0:*`). Names are case-sensitive,
/// as the kernel's are; `rxe0` alone does not name the port `rxe0:1` (UCX's rule).
pub fn device_matches(pattern: &str, name: &str) -> bool {
    let p = pattern.trim();
    p == "all" || glob_match(p, name)
}

/// Whether device `name` passes a device list such as `RUCX_NET_DEVICES` (see
/// [`device_matches`]): listed in an allow list, or not listed in a deny list (`^list`;
/// `^all` denies every device). An empty list (`RUCX_NET_DEVICES=`) means all, as tcp has
/// always read it.
pub fn device_allowed(list: &AllowList, name: &str) -> bool {
    if list.items.is_empty() {
        return true;
    }
    let hit = list.items.iter().any(|p| device_matches(p, name));
    hit != list.deny
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_allow_list, Overrides};

    fn allowed(list: &str, dev: &str) -> bool {
        device_allowed(&parse_allow_list(list).unwrap(), dev)
    }

    #[test]
    fn device_lists() {
        let table = [
            // (list, device, allowed)
            ("all", "lo", true),
            ("all", "rxe0:1", true),
            ("lo", "lo", true),
            ("lo", "eth0", false),
            ("rxe0:1,lo", "rxe0:1", true),
            ("rxe0:1,lo", "rxe0:2", false),
            ("rxe0:1,lo", "lo", true),
            ("rxe0", "rxe0:1", false),
            ("rxe0:*", "rxe0:1", true),
            ("rxe0:*", "rxe1:1", false),
            ("eth*", "eth0", true),
            ("eth*", "lo", false),
            ("mlx5_?:1", "mlx5_3:1", true),
            ("mlx5_?:1", "mlx5_10:1", false),
            ("*:1", "rxe0:1", true),
            ("*:1", "lo", false),
            ("^lo", "lo", false),
            ("^lo", "eth0", true),
            ("^lo", "rxe0:1", true),
            ("^rxe*,lo", "rxe0:1", false),
            ("^rxe*,lo", "lo", false),
            ("^rxe*,lo", "eth0", true),
            ("^all", "lo", false),
            ("lo,all", "eth0", true),
            (" lo , eth0 ", "eth0", true),
            ("LO", "lo", false),
            ("", "lo", true),
            ("^", "lo", true),
        ];
        for (list, dev, want) in table {
            assert_eq!(allowed(list, dev), want, "RUCX_NET_DEVICES={list} on {dev}");
        }
    }

    #[test]
    fn table_reads_code_over_default() {
        assert_eq!(NET_TABLE.env_name("NET_DEVICES"), "RUCX_NET_DEVICES");
        let mut code = Overrides::new();
        code.set("NET_DEVICES", "^lo");
        let l = NET_TABLE.with(&code).get_allow_list("NET_DEVICES").unwrap();
        assert!(l.deny);
        assert!(!device_allowed(&l, "lo"));
        code.set("NET_DEVICES", "lo^");
        assert!(NET_TABLE.with(&code).get_allow_list("NET_DEVICES").is_err());
        assert!(crate::config::tables()
            .iter()
            .any(|t| std::ptr::eq(*t, &NET_TABLE)));
    }
}
