//! Value types and pure parsers for configuration strings (UCX `ucs_config_sscanf_*` rules).
//! Each parser returns `None` for invalid input; the caller builds the error message.

use std::fmt;
use std::time::Duration;

/// A memory size: `8k`, `64kb`, `1MB`, `4096`, `inf`, `auto` (binary units: `k` = 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemUnits {
    /// This many bytes.
    Bytes(u64),
    /// `inf`: unlimited (never switch).
    Inf,
    /// `auto`: the reader chooses.
    Auto,
}

impl MemUnits {
    /// The size in bytes, `auto` replaced by `auto_value`, `inf` by `u64::MAX`.
    pub fn bytes_or(self, auto_value: u64) -> u64 {
        match self {
            MemUnits::Bytes(b) => b,
            MemUnits::Inf => u64::MAX,
            MemUnits::Auto => auto_value,
        }
    }
}

impl fmt::Display for MemUnits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemUnits::Inf => f.write_str("inf"),
            MemUnits::Auto => f.write_str("auto"),
            MemUnits::Bytes(b) => {
                for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
                    if b != 0 && b % (1u64 << shift) == 0 {
                        return write!(f, "{}{unit}", b >> shift);
                    }
                }
                write!(f, "{b}")
            }
        }
    }
}

/// A time: `10ms`, `2s`, `100us`, `50ns`, `1m` (minute), `1.5` (seconds), `inf`, `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeValue {
    /// This long.
    Dur(Duration),
    /// `inf`: for ever.
    Inf,
    /// `auto`: the reader chooses.
    Auto,
}

impl TimeValue {
    /// The duration, `auto` replaced by `auto_value`, `inf` by `Duration::MAX`.
    pub fn duration_or(self, auto_value: Duration) -> Duration {
        match self {
            TimeValue::Dur(d) => d,
            TimeValue::Inf => Duration::MAX,
            TimeValue::Auto => auto_value,
        }
    }
}

/// A yes / no / try setting (UCX `UCS_CONFIG_TERNARY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ternary {
    /// Off.
    No,
    /// On; failing to do it is an error.
    Yes,
    /// On where possible, silently off where not.
    Try,
}

/// A bandwidth in bytes per second, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bandwidth {
    /// This many bytes per second.
    BytesPerSec(f64),
    /// `auto`: the reader chooses (usually the device's own figure).
    Auto,
}

/// An allow list (`a,b`) or a deny list (`^a,b`); `all` allows everything. Items may use the
/// globs `*` and `?`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowList {
    /// True for a deny list (`all` is a deny list with no items).
    pub deny: bool,
    /// The names or globs listed.
    pub items: Vec<String>,
}

impl AllowList {
    /// True if `name` may be used.
    pub fn allows(&self, name: &str) -> bool {
        let listed = self.items.iter().any(|pat| glob_match(pat, name));
        listed != self.deny
    }

    /// True for `all` (or an empty deny list).
    pub fn allows_all(&self) -> bool {
        self.deny && self.items.is_empty()
    }
}

/// Parses a memory size.
pub fn parse_memunits(s: &str) -> Option<MemUnits> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("inf") {
        return Some(MemUnits::Inf);
    }
    if s.eq_ignore_ascii_case("auto") {
        return Some(MemUnits::Auto);
    }
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let num: u64 = s[..digits].parse().ok()?;
    let unit = s[digits..].trim_start().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" => 10,
        "m" | "mb" => 20,
        "g" | "gb" => 30,
        "t" | "tb" => 40,
        _ => return None,
    };
    num.checked_mul(1u64 << shift).map(MemUnits::Bytes)
}

/// Parses a time; a bare number is seconds and `m` means minutes, as in UCX.
pub fn parse_time(s: &str) -> Option<TimeValue> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("inf") {
        return Some(TimeValue::Inf);
    }
    if s.eq_ignore_ascii_case("auto") {
        return Some(TimeValue::Auto);
    }
    let lower = s.to_ascii_lowercase();
    let (num, scale) = [("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9), ("s", 1.0), ("m", 60.0)]
        .iter()
        .find_map(|&(suffix, scale)| lower.strip_suffix(suffix).map(|n| (n, scale)))
        .unwrap_or((lower.as_str(), 1.0));
    let num = num.trim_end();
    // Rust's float parser accepts "inf"/"nan" spellings; require a plain number.
    if num.is_empty()
        || !num
            .bytes()
            .all(|c| c.is_ascii_digit() || c == b'.' || c == b'e' || c == b'-' || c == b'+')
    {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(v * scale).ok().map(TimeValue::Dur)
}

/// Parses `y/n/yes/no/1/0/on/off/true/false` (any case).
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" | "1" | "on" | "true" => Some(true),
        "n" | "no" | "0" | "off" | "false" => Some(false),
        _ => None,
    }
}

/// Parses a boolean or `try`.
pub fn parse_ternary(s: &str) -> Option<Ternary> {
    if s.trim().eq_ignore_ascii_case("try") {
        return Some(Ternary::Try);
    }
    parse_bool(s).map(|b| if b { Ternary::Yes } else { Ternary::No })
}

/// Parses a decimal or `0x` hexadecimal unsigned integer.
pub fn parse_uint(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses a decimal signed integer.
pub fn parse_int(s: &str) -> Option<i64> {
    s.trim().parse().ok()
}

/// Parses a finite floating-point number.
pub fn parse_f64(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Splits on `sep`, trimming items and dropping empty ones.
pub fn parse_list(s: &str, sep: char) -> Vec<String> {
    s.split(sep)
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(String::from)
        .collect()
}

/// Parses `all`, `a,b` or `^a,b`.
pub fn parse_allow_list(s: &str) -> Option<AllowList> {
    let s = s.trim();
    let (deny, body) = match s.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let items = parse_list(body, ',');
    if items.iter().any(|i| i.contains('^')) {
        return None; // '^' is only valid as the first character
    }
    if !deny && items.iter().any(|i| i.eq_ignore_ascii_case("all")) {
        return Some(AllowList {
            deny: true,
            items: Vec::new(),
        });
    }
    Some(AllowList { deny, items })
}

/// Finds `s` among `names` (any case); returns its index.
pub fn parse_enum(s: &str, names: &[&str]) -> Option<usize> {
    let s = s.trim();
    names.iter().position(|n| n.eq_ignore_ascii_case(s))
}

/// Parses `auto` or `<number>[K|M|G|T](B|b)(ps|/s)`: `B` bytes, `b` bits, binary multiples.
pub fn parse_bandwidth(s: &str) -> Option<Bandwidth> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("auto") {
        return Some(Bandwidth::Auto);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let v: f64 = s[..split]
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
    let mut unit = s[split..].trim_start();
    unit = unit
        .strip_suffix("ps")
        .or_else(|| unit.strip_suffix("/s"))
        .unwrap_or(unit);
    let (prefix, per_bits) = match unit.strip_suffix('B') {
        Some(p) => (p, false),
        None => match unit.strip_suffix('b') {
            Some(p) => (p, true),
            None if unit.is_empty() => ("", false),
            None => return None,
        },
    };
    let mult = match prefix.to_ascii_lowercase().as_str() {
        "" => 1.0,
        "k" => 1024.0,
        "m" => 1024.0 * 1024.0,
        "g" => 1024.0 * 1024.0 * 1024.0,
        "t" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = v * mult / if per_bits { 8.0 } else { 1.0 };
    Some(Bandwidth::BytesPerSec(bytes))
}

/// `*` matches any run of characters, `?` one character; everything else literally.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memunits() {
        let b = |n| Some(MemUnits::Bytes(n));
        assert_eq!(parse_memunits("8k"), b(8192));
        assert_eq!(parse_memunits("8K"), b(8192));
        assert_eq!(parse_memunits("64kb"), b(65536));
        assert_eq!(parse_memunits("1m"), b(1 << 20));
        assert_eq!(parse_memunits("1MB"), b(1 << 20));
        assert_eq!(parse_memunits("2g"), b(2 << 30));
        assert_eq!(parse_memunits("4096"), b(4096));
        assert_eq!(parse_memunits("4096b"), b(4096));
        assert_eq!(parse_memunits(" 16 K "), b(16384));
        assert_eq!(parse_memunits("inf"), Some(MemUnits::Inf));
        assert_eq!(parse_memunits("AUTO"), Some(MemUnits::Auto));
        for bad in [
            "",
            "12q",
            "k",
            "-1",
            "1.5k",
            "8kk",
            "99999999999999999999",
            "20000000000t",
        ] {
            assert_eq!(parse_memunits(bad), None, "{bad:?}");
        }
        assert_eq!(MemUnits::Bytes(8192).to_string(), "8K");
        assert_eq!(MemUnits::Bytes(1000).to_string(), "1000");
        assert_eq!(MemUnits::Auto.bytes_or(7), 7);
        assert_eq!(MemUnits::Inf.bytes_or(7), u64::MAX);
    }

    #[test]
    fn times() {
        let d = |d| Some(TimeValue::Dur(d));
        assert_eq!(parse_time("10ms"), d(Duration::from_millis(10)));
        assert_eq!(parse_time("2s"), d(Duration::from_secs(2)));
        assert_eq!(parse_time("100us"), d(Duration::from_micros(100)));
        assert_eq!(parse_time("50ns"), d(Duration::from_nanos(50)));
        assert_eq!(parse_time("1m"), d(Duration::from_secs(60)));
        assert_eq!(parse_time("1.5s"), d(Duration::from_millis(1500)));
        assert_eq!(parse_time("3"), d(Duration::from_secs(3)));
        assert_eq!(parse_time("10 MS"), d(Duration::from_millis(10)));
        assert_eq!(parse_time("inf"), Some(TimeValue::Inf));
        assert_eq!(parse_time("auto"), Some(TimeValue::Auto));
        for bad in ["", "s", "10x", "-1s", "infs", "nan", "1e999s", "10 sec"] {
            assert_eq!(parse_time(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn bools_ternary_numbers() {
        for t in ["y", "yes", "1", "on", "true", "Y", "TRUE"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["n", "no", "0", "off", "false", "No"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        assert_eq!(parse_bool("maybe"), None);
        assert_eq!(parse_ternary("try"), Some(Ternary::Try));
        assert_eq!(parse_ternary("y"), Some(Ternary::Yes));
        assert_eq!(parse_ternary("n"), Some(Ternary::No));
        assert_eq!(parse_ternary("perhaps"), None);
        assert_eq!(parse_uint("42"), Some(42));
        assert_eq!(parse_uint("0x10"), Some(16));
        assert_eq!(parse_uint("-1"), None);
        assert_eq!(parse_int("-7"), Some(-7));
        assert_eq!(parse_f64("1.5"), Some(1.5));
        assert_eq!(parse_f64("inf"), None);
    }

    #[test]
    fn lists_and_allow_lists() {
        assert_eq!(parse_list(" a, b ,,c", ','), vec!["a", "b", "c"]);
        assert_eq!(parse_list("/x:/y:", ':'), vec!["/x", "/y"]);
        let all = parse_allow_list("all").unwrap();
        assert!(all.allows_all() && all.allows("anything"));
        let allow = parse_allow_list("tcp,self").unwrap();
        assert!(allow.allows("tcp") && allow.allows("self") && !allow.allows("ib"));
        let deny = parse_allow_list("^ib,rdma*").unwrap();
        assert!(deny.deny && deny.allows("tcp") && !deny.allows("ib") && !deny.allows("rdmacm"));
        assert_eq!(parse_allow_list("a,^b"), None);
        assert!(
            !parse_allow_list("").unwrap().allows("x"),
            "empty allow list allows nothing"
        );
        assert!(
            parse_allow_list("^").unwrap().allows("x"),
            "empty deny list allows all"
        );
    }

    #[test]
    fn enums_bandwidth_glob() {
        let names = ["error", "warn", "info"];
        assert_eq!(parse_enum("WARN", &names), Some(1));
        assert_eq!(parse_enum("verbose", &names), None);
        assert_eq!(parse_bandwidth("auto"), Some(Bandwidth::Auto));
        assert_eq!(
            parse_bandwidth("100MBps"),
            Some(Bandwidth::BytesPerSec(100.0 * 1048576.0))
        );
        assert_eq!(parse_bandwidth("8Kb/s"), Some(Bandwidth::BytesPerSec(1024.0)));
        assert_eq!(parse_bandwidth("12.5"), Some(Bandwidth::BytesPerSec(12.5)));
        assert_eq!(parse_bandwidth("10Xps"), None);
        assert!(glob_match("uct_*", "uct_ib"));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("ib", "ibx"));
        assert!(glob_match("*b*x", "abyyx"));
    }
}
