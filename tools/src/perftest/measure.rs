//! The measurement state of one run, updated once per iteration exactly as UCX's
//! `ucx_perf_update` does (tick clock, counters, a 2048-entry ring of iteration times for the
//! percentile, a report about every `report_interval`), and the results derived from it
//! (`ucx_perf_calc_result`).

use super::clock;
use super::report::Printer;

/// Iteration times kept for the percentile (UCX's `TIMING_QUEUE_SIZE`).
pub const TIMING_QUEUE_SIZE: usize = 2048;

/// Counters at one point in time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Snapshot {
    pub msgs: u64,
    pub bytes: u64,
    pub iters: u64,
    /// Tick clock.
    pub time: u64,
    /// Accurate clock, seconds.
    pub time_acc: f64,
}

/// Results in seconds, bytes/s and messages/s (before UCX's display scaling).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerfResult {
    pub iters: u64,
    pub bytes: u64,
    pub elapsed: f64,
    pub lat_percentile: f64,
    pub lat_moment: f64,
    pub lat_total: f64,
    pub bw_moment: f64,
    pub bw_total: f64,
    pub mr_moment: f64,
    pub mr_total: f64,
}

/// One run's measurement state.
///
/// `update` writes `current`, `prev_time` and `head` every iteration: they come first, in one
/// cache line. After a long copy (bandwidth tests) each store waits for the store queue to
/// drain, and stores spread over several lines drain slower than stores within one.
#[repr(C, align(64))]
pub struct Perf {
    pub current: Snapshot,
    prev_time: u64,
    head: usize,
    pub max_iter: u64,
    report_interval: u64,
    start_time_acc: f64,
    pub prev: Snapshot,
    timing: Box<[u64; TIMING_QUEUE_SIZE]>,
    scratch: Box<[u64; TIMING_QUEUE_SIZE]>,
    /// 2 for ping-pong (results are per half round trip), else 1.
    factor: f64,
    rank: f64,
    printer: Printer,
}

impl Perf {
    /// A fresh state (UCX's `ucx_perf_test_init`).
    pub fn new(max_iter: u64, report_interval: f64, pingpong: bool, rank: f64, printer: Printer) -> Perf {
        let mut p = Perf {
            current: Snapshot::default(),
            prev_time: 0,
            head: 0,
            max_iter: 0,
            report_interval: 0,
            start_time_acc: 0.0,
            prev: Snapshot::default(),
            timing: Box::new([0; TIMING_QUEUE_SIZE]),
            scratch: Box::new([0; TIMING_QUEUE_SIZE]),
            factor: if pingpong { 2.0 } else { 1.0 },
            rank,
            printer,
        };
        p.prepare_new_run(max_iter, report_interval);
        p
    }

    /// Resets everything a (warm-up) run changed (`ucx_perf_test_prepare_new_run`).
    pub fn prepare_new_run(&mut self, max_iter: u64, report_interval: f64) {
        self.max_iter = if max_iter == 0 { u64::MAX } else { max_iter };
        self.report_interval = clock::ticks_from_sec(report_interval);
        self.current = Snapshot::default();
        self.prev = Snapshot::default();
        self.head = 0;
        self.timing.fill(0);
        self.start_clock();
    }

    /// Disables periodic reports (used by the warm-up).
    pub fn set_warmup(&mut self, iters: u64) {
        self.max_iter = iters;
        self.report_interval = u64::MAX;
    }

    /// Starts the clocks (`ucx_perf_test_start_clock`).
    pub fn start_clock(&mut self) {
        let t = clock::ticks();
        self.start_time_acc = clock::accurate();
        self.prev_time = t;
        self.prev.time = t;
        self.prev.time_acc = self.start_time_acc;
        self.current.time_acc = self.start_time_acc;
    }

    /// The iterations of this run.
    pub fn max_iter(&self) -> u64 {
        self.max_iter
    }

    /// Whether the run has done its iterations.
    #[inline(always)]
    pub fn done(&self) -> bool {
        self.current.iters >= self.max_iter
    }

    /// Records `iters` iterations of `bytes` (one message); reports when the interval passed.
    #[inline(always)]
    pub fn update(&mut self, iters: u64, bytes: u64) {
        let t = clock::ticks();
        self.current.time = t;
        self.current.iters += iters;
        self.current.bytes += bytes;
        self.current.msgs += 1;
        // The size is a power of two: the mask keeps the index in range without a bounds check.
        self.timing[self.head & (TIMING_QUEUE_SIZE - 1)] = t.wrapping_sub(self.prev_time);
        self.head = (self.head + 1) & (TIMING_QUEUE_SIZE - 1);
        self.prev_time = t;
        if t.wrapping_sub(self.prev.time) >= self.report_interval {
            self.report();
        }
    }

    /// Reads the accurate end time (`ucx_perf_get_time`).
    #[inline]
    pub fn get_time(&mut self) {
        self.current.time_acc = clock::accurate();
    }

    #[cold]
    #[inline(never)]
    fn report(&mut self) {
        self.get_time();
        let r = self.calc_result();
        self.printer.progress(&r, false);
        self.prev = self.current;
    }

    /// Derives the results (`ucx_perf_calc_result`).
    pub fn calc_result(&mut self) -> PerfResult {
        let f = self.factor;
        let n = (self.current.iters.min(TIMING_QUEUE_SIZE as u64)) as usize;
        let pct_ticks = percentile(&self.timing[..n.max(1)], &mut self.scratch[..n.max(1)], self.rank);
        let cur = self.current;
        let prev = self.prev;
        let dt_moment = cur.time_acc - prev.time_acc;
        let dt_total = cur.time_acc - self.start_time_acc;
        PerfResult {
            iters: cur.iters,
            bytes: cur.bytes,
            elapsed: dt_total,
            lat_percentile: pct_ticks as f64 / clock::ticks_per_sec() / f,
            lat_moment: dt_moment / (cur.iters.wrapping_sub(prev.iters)) as f64 / f,
            lat_total: dt_total / cur.iters as f64 / f,
            bw_moment: (cur.bytes.wrapping_sub(prev.bytes)) as f64 / dt_moment * f,
            bw_total: cur.bytes as f64 / dt_total * f,
            mr_moment: (cur.msgs.wrapping_sub(prev.msgs)) as f64 / dt_moment * f,
            mr_total: cur.msgs as f64 / dt_total * f,
        }
    }

    /// Prints the final row.
    pub fn report_final(&mut self) {
        let r = self.calc_result();
        self.printer.progress(&r, true);
    }
}

/// The element at rank `rank`% of `v` (index `(len-1) * rank/100`, truncated, as UCX's
/// quick-select), using `scratch` so the ring keeps its order.
fn percentile(v: &[u64], scratch: &mut [u64], rank: f64) -> u64 {
    scratch.copy_from_slice(v);
    let idx = ((scratch.len() - 1) as f64 * (rank / 100.0)) as usize;
    *scratch.select_nth_unstable(idx.min(scratch.len() - 1)).1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_matches_ucx_indexing() {
        let v: Vec<u64> = (1..=11).rev().collect();
        let mut s = vec![0; v.len()];
        assert_eq!(percentile(&v, &mut s, 50.0), 6);
        assert_eq!(percentile(&v, &mut s, 0.0), 1);
        assert_eq!(percentile(&v, &mut s, 100.0), 11);
        assert_eq!(percentile(&v, &mut s, 99.0), 10);
        assert_eq!(percentile(&[7], &mut [0], 50.0), 7);
    }

    #[test]
    fn counts_and_halves_pingpong_results() {
        let mut p = Perf::new(10, 1e9, true, 50.0, Printer::silent());
        for _ in 0..10 {
            p.update(1, 8);
        }
        assert!(p.done());
        p.get_time();
        let r = p.calc_result();
        assert_eq!((r.iters, r.bytes), (10, 80));
        // Half round trip: total = elapsed / iters / 2, and rates doubled.
        assert!((r.lat_total - r.elapsed / 10.0 / 2.0).abs() < 1e-12);
        assert!((r.mr_total - 10.0 / r.elapsed * 2.0).abs() / r.mr_total < 1e-9);
        assert!((r.bw_total - 80.0 / r.elapsed * 2.0).abs() / r.bw_total < 1e-9);
    }

    #[test]
    fn zero_max_iter_means_unbounded() {
        let p = Perf::new(0, 1.0, false, 50.0, Printer::silent());
        assert_eq!(p.max_iter, u64::MAX);
        assert!(!p.done());
    }
}
