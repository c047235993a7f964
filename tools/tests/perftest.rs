//! `rucx-perftest` end to end over `self` loopback: output format (UCX's columns) and exit
//! status. Few iterations; no timing is checked.

use std::process::{Command, Output};

fn perftest(args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rucx-perftest"))
        .args(args.split_whitespace())
        .env("RUCX_LOG_LEVEL", "warn")
        .output()
        .expect("rucx-perftest runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The 8 numbers of a result row: iterations, 3 latencies, 2 bandwidths, 2 message rates.
fn numbers(row: &str) -> Vec<f64> {
    row.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<f64>()
                .unwrap_or_else(|_| panic!("not a number: {s:?} in {row:?}"))
        })
        .collect()
}

#[test]
fn am_lat_prints_ucx_table_and_final_row() {
    let o = perftest("-l -t am_lat -x self -d memory0 -n 1000 -w 10");
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "exit {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("+---") && lines[0].len() == 108, "{out}");
    assert!(lines[1].starts_with("| API:          transport layer"));
    assert!(lines[2].starts_with("| Test:         active message latency"));
    assert!(lines[3].starts_with("| Data layout:  short"));
    assert!(lines[6].starts_with("| Message size: 8 "));
    assert!(out.contains("|              |              |        latency (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |"));
    assert!(out.contains("|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |"));
    let fin = lines
        .iter()
        .find(|l| l.starts_with("Final:"))
        .expect("a Final row");
    let v = numbers(&fin["Final:".len()..]);
    assert_eq!(v.len(), 8, "{fin}");
    assert_eq!(v[0], 1000.0);
    assert!(v[1..].iter().all(|x| x.is_finite() && *x >= 0.0), "{fin}");
    // Message rate and bandwidth follow from the latency as UCX computes them (8-byte messages).
    let (lat_us, bw, mr) = (v[3], v[5], v[7]);
    // The latency is printed with 3 decimals: on a fast host (self: ~0.005 us) that rounding
    // alone is up to 10%, so it widens the tolerance.
    assert!((mr * lat_us / 1e6 - 1.0).abs() < 0.02 + 0.0005 / lat_us, "{fin}");
    assert!((bw * 1024.0 * 1024.0 / mr - 8.0).abs() < 0.1, "{fin}");
}

#[test]
fn csv_final_only_row_for_am_bw_bcopy_with_validation() {
    let o = perftest("-l -t am_bw -x self -d memory0 -s 8000 -D bcopy -n 500 -w 10 -f -v -V");
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    let h = lines
        .iter()
        .position(|l| l.starts_with("iterations,"))
        .expect("CSV header");
    assert_eq!(
        lines[h],
        "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr"
    );
    assert_eq!(lines.len(), h + 2, "{out}");
    let v = numbers(lines[h + 1]);
    assert_eq!(v.len(), 8);
    assert_eq!(v[0], 500.0);
    assert!(out.contains("| Data layout:  bcopy"));
}

#[test]
fn put_bw_zcopy_and_get_with_validation_succeed() {
    for args in [
        "-l -t put_bw -x self -d memory0 -s 65536 -D zcopy -n 200 -w 5 -f -V",
        "-l -t get -x self -d memory0 -s 4096 -D bcopy -n 200 -w 5 -f -V",
        "-l -t put_lat -x self -d memory0 -s 64 -D short -n 200 -w 5 -f -V",
        "-l -t fadd -x self -d memory0 -s 8 -n 200 -w 5 -f",
    ] {
        let o = perftest(args);
        let out = stdout(&o);
        assert!(
            o.status.success(),
            "{args}\n{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let row = out.lines().last().expect("a row");
        assert_eq!(numbers(row)[0], 200.0, "{args}: {row}");
    }
}

#[test]
fn errors_exit_like_ucx_perftest() {
    // Missing device: header, error, exit 255 (-1).
    let o = perftest("-l -t am_lat -x self -n 10");
    assert_eq!(o.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&o.stderr).contains("A device must be specified with -d"));
    // Unsupported size for the transport.
    let o = perftest("-l -t am_lat -x self -d memory0 -s 100000 -n 10");
    assert_eq!(o.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&o.stderr).contains("larger than max supported"));
    // Command-line errors print the usage and exit 129 (-127).
    let o = perftest("-l -t no_such_test");
    assert_eq!(o.status.code(), Some(129));
    assert!(stdout(&o).contains("Usage: rucx-perftest [ server-hostname ] [ options ]"));
    let o = perftest("-h");
    assert!(o.status.success());
    assert!(stdout(&o).contains("am_lat - UCT active message latency"));
    assert!(stdout(&o).contains("tag_lat - UCP tag match latency"));
    assert!(stdout(&o).contains("ucp_cswap - UCP atomic compare-and-swap"));
}

/// The UCP tests, over tcp, in one process (`-l`) and as two threads with their own workers
/// (`-L`): messages at an eager and a rendezvous size (with `-V`; `-D iov` too), RMA at 8 B and 1 MiB,
/// atomics at both widths. Each completes its iterations. Few iterations; no timing is checked.
#[test]
fn ucp_tests_run_over_tcp() {
    let cases: &[(&str, &[&str], &str)] = &[
        ("tag_lat", &["8", "1048576"], "-V"),
        ("tag_bw", &["8", "1048576"], "-V"),
        ("tag_sync_lat", &["8", "1048576"], "-V"),
        ("tag_sync_bw", &["8", "1048576"], "-V"),
        ("ucp_am_lat", &["8", "1048576"], "-V"),
        ("ucp_am_bw", &["8", "1048576"], "-V"),
        ("stream_lat", &["8", "1048576"], "-V"),
        ("stream_bw", &["8", "1048576"], "-V"),
        // Scatter-gather lists (one entry per -s size) both ways, and each way alone.
        ("tag_lat", &["8,24", "1000,0,1048576"], "-V -D iov"),
        ("tag_bw", &["8,24", "1000,0,1048576"], "-V -D iov"),
        ("tag_bw", &["100,1048576"], "-V -D contig,iov"),
        ("tag_sync_bw", &["100,1048576"], "-V -D iov,contig"),
        ("ucp_am_bw", &["8,24", "1000,1048576"], "-V -D iov,contig"),
        ("ucp_put_lat", &["8", "1048576"], ""),
        ("ucp_put_bw", &["8", "1048576"], ""),
        ("ucp_get", &["8", "1048576"], ""),
        ("ucp_add", &["4", "8"], ""),
        ("ucp_fadd", &["4", "8"], ""),
        ("ucp_swap", &["4", "8"], ""),
        ("ucp_cswap", &["4", "8"], ""),
    ];
    for &(t, sizes, extra) in cases {
        for mode in ["-l", "-L"] {
            for size in sizes {
                let args = format!("{mode} -t {t} -n 20 -w 4 -s {size} {extra}");
                let o = Command::new(env!("CARGO_BIN_EXE_rucx-perftest"))
                    .args(args.split_whitespace())
                    .env("RUCX_LOG_LEVEL", "warn")
                    .env("RUCX_TLS", "tcp")
                    .env("RUCX_NET_DEVICES", "lo")
                    .env("RUCX_RNDV_THRESH", "65536")
                    .output()
                    .expect("rucx-perftest runs");
                let out = stdout(&o);
                assert!(
                    o.status.success(),
                    "{args}: exit {:?}\n{out}\n{}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                );
                let row = out
                    .lines()
                    .find(|l| l.starts_with("Final:"))
                    .unwrap_or_else(|| panic!("{args}: no final row\n{out}"));
                assert_eq!(numbers(&row["Final:".len()..])[0], 20.0, "{args}: {row}");
            }
        }
    }
    // An atomic of another width is refused with a message, exit 255.
    let o = perftest("-l -t ucp_fadd -s 16 -n 10");
    assert_eq!(o.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-s 4 or -s 8"));
}
