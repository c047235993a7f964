//! Number formatting in `ucx_info`'s style: sizes with K/M/G suffixes, times in nanoseconds,
//! bandwidth in MB/s (MiB, as UCX counts them).

/// A size limit: `unlimited` for the "no limit" values, `8K`-style when exact, else the number.
pub fn size(n: usize) -> String {
    if n >= usize::MAX / 2 {
        return "unlimited".into();
    }
    for (shift, suffix) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        let unit = 1usize << shift;
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

/// Seconds as whole nanoseconds.
pub fn nsec(seconds: f64) -> String {
    format!("{:.0}", seconds * 1e9)
}

/// `c + m * x` seconds as `"C + M * N nsec"` (`"C nsec"` when `m` is 0).
pub fn linear_nsec(f: uct::LinearFunc, var: &str) -> String {
    if f.m == 0.0 {
        format!("{} nsec", nsec(f.c))
    } else {
        format!("{} + {:.3} * {var} nsec", nsec(f.c), f.m * 1e9)
    }
}

/// Bytes per second as MB/s (2^20 bytes).
pub fn mbps(bytes_per_sec: f64) -> String {
    format!("{:.2}", bytes_per_sec / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0");
        assert_eq!(size(100), "100");
        assert_eq!(size(8192), "8K");
        assert_eq!(size(8256), "8256");
        assert_eq!(size(64 << 20), "64M");
        assert_eq!(size(u32::MAX as usize), "4294967295");
        assert_eq!(size(usize::MAX), "unlimited");
    }

    #[test]
    fn times_and_bandwidth() {
        assert_eq!(nsec(10.96e-6), "10960");
        assert_eq!(linear_nsec(uct::LinearFunc { c: 5e-9, m: 0.0 }, "N"), "5 nsec");
        assert_eq!(
            linear_nsec(uct::LinearFunc { c: 16e-6, m: 0.06e-9 }, "N"),
            "16000 + 0.060 * N nsec"
        );
        assert_eq!(mbps(6911.0 * 1024.0 * 1024.0), "6911.00");
    }
}
