#!/usr/bin/env python3
"""Pools the rounds of several bench/compare.sh runs (docs/benchmarks.md, "How many rounds").

compare.sh prints every round's measurement to stderr ("  round R CASE  TOOL CSV"); the VM's
rounds go to the log file it names at the end. Give this script both (any number of runs).
For each case it prints the number of paired rounds, the median of all their rucx/UCX ratios
(latency cases: 1e6 / overall message rate, the others: overall MB/s, as compare.sh takes
them), how many runs' own median met the target, and for N rounds per run the chance that a
run's median misses, estimated by drawing N rounds from the pool (4000 draws). Rounds of one
run are not independent (the host's speed drifts over minutes), so the estimate is a lower
bound.

  bench/pool-rounds.py [--rounds 9,15,25] LOG...
"""
import collections
import random
import re
import statistics as st
import sys

ROUND = re.compile(r'\s+round (\d+) (.+?)\s{2,}(ucx|rucx)\s+([-\d.,]+)$')


def is_latency(case):
    return ' am_lat ' in ' %s ' % case


def met(case, ratio):
    # as compare.sh's verdict: the unrounded median per-round ratio against 1.0
    return ratio <= 1.0 if is_latency(case) else ratio >= 1.0


def read_runs(paths):
    """{case: [[ratio per round] per run]}: each file is one run (or one run's VM part)."""
    runs = collections.defaultdict(list)
    for path in paths:
        vals = collections.defaultdict(dict)
        with open(path, errors='replace') as f:
            for line in f:
                m = ROUND.match(line.rstrip())
                if not m:
                    continue
                rnd, case, tool, csv = m.groups()
                cols = csv.split(',')
                if len(cols) < 8 or case.startswith(('tcp floor', 'ep cost')):
                    continue
                # as compare.sh: latency = 1e6 / overall message rate (the latency column has
                # three decimals, too few for self's nanoseconds), bandwidth = overall MB/s
                try:
                    v = 1e6 / float(cols[7]) if is_latency(case) else float(cols[5])
                except (ValueError, ZeroDivisionError):
                    continue
                vals[case][(int(rnd), tool)] = v
        for case, d in vals.items():
            rs = [d[(r, 'rucx')] / d[(r, 'ucx')] for r in sorted({k[0] for k in d})
                  if (r, 'rucx') in d and d.get((r, 'ucx'), 0) > 0]
            if rs:
                runs[case].append(rs)
    return runs


def main(argv):
    sizes = [9, 15, 25]
    if argv[:1] == ['--rounds']:
        sizes = [int(x) for x in argv[1].split(',')]
        argv = argv[2:]
    if not argv:
        print(__doc__.strip())
        return 2
    rng = random.Random(1)
    runs = read_runs(argv)
    print('%-44s %7s %7s %9s  %s' % ('case', 'rounds', 'median', 'runs met',
                                     '  '.join('P(miss|%d)' % n for n in sizes)))
    for case in sorted(runs):
        pool = [r for run in runs[case] for r in run]
        runs_met = sum(met(case, st.median(run)) for run in runs[case])
        miss = []
        for n in sizes:
            k = sum(not met(case, st.median(rng.choices(pool, k=n))) for _ in range(4000))
            miss.append('%9.2f' % (k / 4000))
        print('%-44s %7d %7.3f %5d/%-3d  %s' % (case, len(pool), st.median(pool), runs_met,
                                               len(runs[case]), '  '.join(miss)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
