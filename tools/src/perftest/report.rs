//! Output in `ucx_perftest`'s exact format: the test box, the column header, progress rows
//! (`[thread 0]`, as Debian's OpenMP build prints), the final row (`Final:`), `-f` (final only),
//! `-v` (CSV) and `-N` (thousands separators). Latency in µs, bandwidth in MB/s counted as UCX
//! counts it (MiB: bytes / 2^20 per second), message rate in messages per second.

use std::fmt::Write as _;
use std::io::Write as _;

use super::cli::PrintFlags;
use super::measure::PerfResult;
use super::params::{layout, Api, Params};

const LINE: &str =
    "+----------------------------------------------------------------------------------------------------------+";
const GROUPS: &str =
    "+--------------+--------------+------------------------------+---------------------+-----------------------+";
const COLS: &str =
    "+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+";

/// Formats `v` like printf `%<width>.<prec>f` (`nan`/`inf` spelled as glibc does).
fn f(v: f64, width: usize, prec: usize) -> String {
    if v.is_nan() {
        format!("{:>width$}", if v.is_sign_negative() { "-nan" } else { "nan" })
    } else if v.is_infinite() {
        format!("{:>width$}", if v < 0.0 { "-inf" } else { "inf" })
    } else {
        format!("{v:>width$.prec$}")
    }
}

/// printf `%'<width>.0f`: an integer with `,` between thousands.
fn grouped(v: f64, width: usize) -> String {
    if !v.is_finite() {
        return f(v, width, 0);
    }
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 && s != "0" {
        out.insert(0, '-');
    }
    format!("{out:>width$}")
}

/// Prints rows for one process according to its flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct Printer {
    pub flags: PrintFlags,
}

impl Printer {
    /// Prints nothing.
    #[cfg(test)]
    pub fn silent() -> Printer {
        Printer::default()
    }

    /// One result row (UCX's `print_progress`); nothing unless this process prints results.
    pub fn progress(&self, r: &PerfResult, is_final: bool) {
        if let Some(line) = self.format_row(r, is_final) {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(line.as_bytes());
            let _ = out.flush();
        }
    }

    /// The text of one row, newline included; `None` when this row is not printed.
    pub fn format_row(&self, r: &PerfResult, is_final: bool) -> Option<String> {
        let fl = self.flags;
        if !fl.results || (!is_final && fl.final_only) {
            return None;
        }
        let mut s = String::new();
        if !is_final {
            s.push_str("[thread 0]");
        } else if !fl.csv {
            s.push_str(if fl.final_only { "          " } else { "Final:    " });
        }
        let mb = 1024.0 * 1024.0;
        let v = [
            r.iters as f64,
            r.lat_percentile * 1e6,
            r.lat_moment * 1e6,
            r.lat_total * 1e6,
            r.bw_moment / mb,
            r.bw_total / mb,
            r.mr_moment,
            r.mr_total,
        ];
        if fl.csv {
            let _ = write!(
                s,
                "{},{},{},{},{},{},{},{}",
                f(v[0], 4, 0),
                f(v[1], 0, 3),
                f(v[2], 0, 3),
                f(v[3], 0, 3),
                f(v[4], 0, 2),
                f(v[5], 0, 2),
                f(v[6], 0, 0),
                f(v[7], 0, 0)
            );
        } else {
            let (it, m1, m2) = if fl.numeric {
                (grouped(v[0], 18), grouped(v[6], 11), grouped(v[7], 11))
            } else {
                (f(v[0], 18, 0), f(v[6], 11, 0), f(v[7], 11, 0))
            };
            let _ = write!(
                s,
                "{it} {} {} {} {} {} {m1} {m2}",
                f(v[1], 10, 3),
                f(v[2], 9, 3),
                f(v[3], 9, 3),
                f(v[4], 11, 2),
                f(v[5], 10, 2)
            );
        }
        if fl.extra_info && !fl.csv {
            s.push_str("  ");
        }
        s.push('\n');
        Some(s)
    }
}

/// The test box and column header (UCX's `print_header`), printed before the test runs.
pub fn header(p: &Params, fl: PrintFlags) -> String {
    let mut s = String::new();
    let test = p.test.map(|_| p.desc());
    if let Some(t) = test.filter(|_| fl.test) {
        let (api, data) = match t.api {
            Api::Uct => ("transport layer", layout::name(p.layout)),
            Api::Ucp => ("protocol layer", "(automatic)"),
        };
        let row = |s: &mut String, k: &str, v: &str| {
            let _ = writeln!(s, "| {k:<14}{v:<60}                               |");
        };
        let _ = writeln!(s, "{LINE}");
        row(&mut s, "API:", api);
        row(&mut s, "Test:", t.desc);
        row(&mut s, "Data layout:", data);
        row(&mut s, "Send memory:", "host");
        row(&mut s, "Recv memory:", "host");
        row(&mut s, "Message size:", &p.message_size().to_string());
    }
    if fl.csv {
        if fl.results {
            let _ = writeln!(
                s,
                "iterations,{:.1}_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr",
                p.percentile_rank
            );
        }
    } else if fl.results {
        let ol = test.map_or("overhead", |t| t.overhead_lat);
        let _ = writeln!(s, "{GROUPS}");
        let _ = writeln!(
            s,
            "|              |              |       {ol:>8} (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |"
        );
        let _ = writeln!(s, "{}", COLS);
        let _ = writeln!(
            s,
            "|    {:>5}     | # iterations | {:4.1}%ile | average | overall |  average |  overall |  average  |  overall  |",
            if fl.final_only { "Test" } else { "Stage" },
            p.percentile_rank
        );
        let _ = writeln!(s, "{COLS}");
    } else if fl.test {
        let _ = writeln!(s, "{LINE}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> PerfResult {
        PerfResult {
            iters: 100000,
            bytes: 800000,
            elapsed: 0.0137,
            lat_percentile: 0.016e-6,
            lat_moment: 0.137e-6,
            lat_total: 0.137e-6,
            bw_moment: 55.75 * 1048576.0,
            bw_total: 55.75 * 1048576.0,
            mr_moment: 7307532.0,
            mr_total: 7307532.0,
        }
    }

    fn flags() -> PrintFlags {
        PrintFlags {
            results: true,
            test: true,
            ..Default::default()
        }
    }

    #[test]
    fn final_row_matches_ucx_columns() {
        let p = Printer { flags: flags() };
        assert_eq!(
            p.format_row(&result(), true).unwrap(),
            "Final:                100000      0.016     0.137     0.137       55.75      55.75     7307532     7307532\n"
        );
        assert!(p
            .format_row(&result(), false)
            .unwrap()
            .starts_with("[thread 0]            100000"));
    }

    #[test]
    fn final_only_and_csv_rows() {
        let p = Printer {
            flags: PrintFlags {
                final_only: true,
                ..flags()
            },
        };
        assert!(p.format_row(&result(), false).is_none());
        assert!(p
            .format_row(&result(), true)
            .unwrap()
            .starts_with("                      100000      0.016"));
        let p = Printer {
            flags: PrintFlags { csv: true, ..flags() },
        };
        assert_eq!(
            p.format_row(&result(), true).unwrap(),
            "100000,0.016,0.137,0.137,55.75,55.75,7307532,7307532\n"
        );
        let p = Printer {
            flags: PrintFlags {
                numeric: true,
                ..flags()
            },
        };
        assert!(p
            .format_row(&result(), true)
            .unwrap()
            .ends_with("  7,307,532   7,307,532\n"));
        assert!(Printer::silent().format_row(&result(), true).is_none());
    }

    #[test]
    fn header_matches_ucx_box_and_columns() {
        let mut p = Params {
            test: Some(0),
            ..Default::default()
        };
        p.adjust().unwrap();
        let h = header(&p, flags());
        let lines: Vec<&str> = h.lines().collect();
        assert_eq!(lines[0], LINE);
        assert_eq!(lines[7], GROUPS);
        assert_eq!(lines[9], COLS);
        assert_eq!(lines[1].len(), LINE.len());
        assert_eq!(
            lines[1],
            format!(
                "| API:          {:<60}                               |",
                "transport layer"
            )
        );
        assert_eq!(
            lines[2].trim_end(),
            format!(
                "| Test:         {:<60}                               |",
                "active message latency"
            )
        );
        assert!(lines[8].contains("        latency (usec)        "));
        assert!(lines[10].starts_with("|    Stage     | # iterations | 50.0%ile |"));
        assert_eq!(lines.len(), 12);
        let csv = header(&p, PrintFlags { csv: true, ..flags() });
        assert!(csv.ends_with(
            "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n"
        ));
        // A server prints the box closed by a line and no column header.
        let srv = header(
            &p,
            PrintFlags {
                test: true,
                ..Default::default()
            },
        );
        assert_eq!(srv.lines().count(), 8);
    }

    #[test]
    fn printf_like_number_formatting() {
        assert_eq!(f(f64::NAN, 5, 3), "  nan");
        assert_eq!(f(f64::INFINITY, 4, 0), " inf");
        assert_eq!(grouped(1234567.4, 10), " 1,234,567");
        assert_eq!(grouped(999.0, 4), " 999");
    }
}
