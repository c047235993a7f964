//! `socket-floor` end to end: each mode prints ucx_perftest's CSV (header and one row of 8
//! numbers) with the iterations asked for; bad modes and options fail with usage. Few
//! iterations; no timing is checked beyond "a positive, finite time".

use std::process::{Command, Output};

fn floor(args: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_socket-floor"))
        .args(args.split_whitespace())
        .output()
        .expect("socket-floor runs")
}

/// The result row's 8 numbers.
fn row(o: &Output) -> Vec<f64> {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("iterations,50.0_percentile_lat,avg_lat"),
        "{out}"
    );
    let v: Vec<f64> = lines[1]
        .split(',')
        .map(|s| s.parse().expect("a number"))
        .collect();
    assert_eq!(v.len(), 8, "{out}");
    v
}

#[test]
fn lat_and_stream_rows() {
    let v = row(&floor("lat -n 2000 -w 10"));
    assert_eq!(v[0], 2000.0);
    assert!(v[1] > 0.0 && v[2] > 0.0 && v[2].is_finite(), "{v:?}");
    let v = row(&floor("stream -s 4096 -n 200 -w 1"));
    assert_eq!(v[0], 200.0);
    assert!(v[4] > 0.0, "{v:?}");
}

#[test]
fn congestion_control_option() {
    // reno is built into every kernel and allowed to every user.
    let v = row(&floor("lat -n 500 -w 10 --cc reno"));
    assert_eq!(v[0], 500.0);
    let v = row(&floor("stream -s 4096 -n 100 -w 1 --cc reno"));
    assert_eq!(v[0], 100.0);
    // A name the kernel does not know is an error, not the default in silence.
    let o = floor("lat -n 10 --cc no_such_cc");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("TCP_CONGESTION"));
}

#[test]
fn line_times_a_cache_line_between_two_cpus() {
    let o = floor("line -n 20000 -w 100");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        assert!(!o.status.success());
        return;
    }
    let v = row(&o);
    assert_eq!(v[0], 20000.0);
    // One way in µs: tens to hundreds of nanoseconds on real machines; far above a
    // microsecond only if a thread was descheduled for long.
    assert!(v[1] > 0.0 && v[1] < 1000.0, "{v:?}");
    assert!(v[6] > 0.0, "{v:?}");
}

#[test]
fn bad_usage_fails() {
    for args in ["", "ping", "lat -n", "lat -x 3"] {
        let o = floor(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("usage"), "{args:?}");
    }
}
