//! Configuration given in code (UCX's `ucp_config_modify`): values that win over the
//! environment for the objects they are passed to, so a program (or a test) can set each
//! object's configuration without touching the process environment.

use std::fmt;

use super::ENV_PREFIX;

/// Variable values set in code, by name without the `RUCX_` prefix (`TCP_SNDBUF`); a name
/// given with the prefix is accepted too. Later settings of a name replace earlier ones.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Overrides(Vec<(String, String)>);

impl Overrides {
    /// No overrides.
    pub const fn new() -> Overrides {
        Overrides(Vec::new())
    }

    fn key(name: &str) -> &str {
        name.strip_prefix(ENV_PREFIX).unwrap_or(name)
    }

    /// Sets `name` to `value`.
    pub fn set(&mut self, name: &str, value: &str) {
        let k = Self::key(name);
        match self.0.iter_mut().find(|(n, _)| n == k) {
            Some(e) => e.1 = value.to_owned(),
            None => self.0.push((k.to_owned(), value.to_owned())),
        }
    }

    /// The value set for `name` (without the prefix), if any.
    pub fn get(&self, name: &str) -> Option<&str> {
        let k = Self::key(name);
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `(name, value)` pairs in the order they were first set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// These settings with `other`'s on top (`other` wins).
    pub fn merged(&self, other: &Overrides) -> Overrides {
        let mut out = self.clone();
        for (n, v) in other.iter() {
            out.set(n, v);
        }
        out
    }
}

impl fmt::Debug for Overrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Overrides {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Overrides {
        let mut o = Overrides::new();
        for (k, v) in iter {
            o.set(k.as_ref(), v.as_ref());
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_merge() {
        let mut a = Overrides::new();
        a.set("TCP_SNDBUF", "1m");
        a.set("RUCX_TCP_NODELAY", "n");
        a.set("TCP_SNDBUF", "2m");
        assert_eq!(a.get("TCP_SNDBUF"), Some("2m"));
        assert_eq!(a.get("RUCX_TCP_NODELAY"), Some("n"));
        assert_eq!(a.iter().count(), 2);
        let b: Overrides = [("TCP_NODELAY", "y"), ("IB_SEG_SIZE", "4k")]
            .into_iter()
            .collect();
        let m = a.merged(&b);
        assert_eq!(m.get("TCP_NODELAY"), Some("y"));
        assert_eq!(m.get("TCP_SNDBUF"), Some("2m"));
        assert_eq!(m.get("IB_SEG_SIZE"), Some("4k"));
        assert_eq!(format!("{a:?}"), r#"{"TCP_SNDBUF": "2m", "TCP_NODELAY": "n"}"#);
    }
}
