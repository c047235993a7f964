#!/usr/bin/env python3
"""Reads bench/vm/iter-times.c's files of ping-pong runs (bench/README.md). A diagnostic tool,
not part of the test suite.

Files are DIR/TOOL.ROUND.SIDE.PID.{ev,clk} (SIDE cli or srv; the shim's ITER_TIMES_TAG is
TOOL.ROUND.SIDE). The last ITERS iterations of each run are read (default 15000, the runs'
-n): one iteration is the time between two of the client's clock reads, converted from tsc
ticks with the rate of the first UCX client file (gettimeofday only; rucx processes also read
CLOCK_MONOTONIC through `Instant` at reports).

  iter-times.py pct DIR [BASE]     per tool: p25/p50/p75/p90, mean, mean of iterations <= 100 us;
                                   per round: each tool / BASE (default ucx), median, rounds below 1
  iter-times.py stalls DIR         iterations > 500 us: count and share of the time, per run
  iter-times.py period DIR [M]     mean excess over the median by iteration index mod M (16)
  iter-times.py seg DIR            per side: the doorbell write, write return -> clock read,
                                   clock read -> first CQ poll, the poll that found the message
                                   -> the post's lock, an empty poll round (p25 / p50, us)
"""
import collections
import glob
import statistics as st
import struct
import sys

ITERS = 15000


def load_ev(path):
    b = open(path, 'rb').read()
    return [struct.unpack_from('<QII', b, 16 * i) for i in range(len(b) // 16)]


def load_clk(path):
    b = open(path, 'rb').read()
    return struct.unpack('<%dq' % (len(b) // 8), b)


def runs(d, side='cli'):
    for ev in sorted(glob.glob('%s/*.%s.*.ev' % (d, side))):
        tool, rnd = ev.split('/')[-1].split('.')[:2]
        yield tool, int(rnd), ev


def tsc_per_us(d):
    ev_path = sorted(glob.glob('%s/ucx.*.cli.*.ev' % d))[0]
    ev, clk = load_ev(ev_path), load_clk(ev_path[:-2] + 'clk')
    t = [e[0] for e in ev if e[1] == 0]
    return (t[-2] - t[0]) / (clk[-2] - clk[0]) * 1000


def iterations(ev, rate):
    t = [e[0] for e in ev if e[1] == 0]
    return [(t[i + 1] - t[i]) / rate for i in range(len(t) - ITERS - 2, len(t) - 2)]


def pctl(s, p):
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def cmd_pct(d, base='ucx'):
    rate = tsc_per_us(d)
    rows = collections.defaultdict(dict)
    names = ['p25', 'p50', 'p75', 'p90', 'mean', 'mean<=100']
    for tool, rnd, ev in runs(d):
        it = iterations(load_ev(ev), rate)
        s = sorted(it)
        small = [x for x in it if x <= 100]
        rows[tool][rnd] = [pctl(s, 25), pctl(s, 50), pctl(s, 75), pctl(s, 90),
                           sum(it) / len(it), sum(small) / len(small)]
    for tool in sorted(rows):
        print('%-6s' % tool, ' '.join('%s %.2f' % (n, st.median(v[i] for v in rows[tool].values()))
                                       for i, n in enumerate(names)), '(round trip, us)')
    for tool in sorted(rows):
        if tool == base:
            continue
        print('%s/%s per round:' % (tool, base))
        for i, n in enumerate(names):
            r = [rows[tool][k][i] / rows[base][k][i] for k in rows[tool] if k in rows[base]]
            print('   %-10s median %.3f  below 1 in %d of %d' % (n, st.median(r), sum(x < 1 for x in r), len(r)))


def cmd_stalls(d):
    rate = tsc_per_us(d)
    for tool, rnd, ev in runs(d):
        it = iterations(load_ev(ev), rate)
        big = [x for x in it if x > 500]
        print('%-6s r%-3d mean %.2f us, %d iterations > 500 us: %.1f ms, %.0f%% of the run' % (
            tool, rnd, sum(it) / len(it), len(big), sum(big) / 1000, 100 * sum(big) / sum(it)))


def cmd_period(d, m=16):
    rate = tsc_per_us(d)
    tot = collections.defaultdict(lambda: [0.0] * m)
    cnt = collections.Counter()
    for tool, rnd, ev in runs(d):
        it = iterations(load_ev(ev), rate)
        med = sorted(it)[len(it) // 2]
        acc = collections.defaultdict(list)
        for i, x in enumerate(it):
            if x < 100:
                acc[i % m].append(x - med)
        ex = {k: sum(v) / len(v) for k, v in acc.items()}
        # align rounds on their costliest index (the phase differs from run to run)
        top = max(ex, key=ex.get)
        for j in range(m):
            tot[tool][j] += ex[(top + j) % m]
        cnt[tool] += 1
    for tool in sorted(tot):
        v = [x / cnt[tool] for x in tot[tool]]
        print('%-6s excess per %d iterations %.1f us; by index from the costliest: %s' % (
            tool, m, sum(v), ' '.join('%+.1f' % x for x in v)))


def cmd_seg(d):
    rate = tsc_per_us(d)
    res = collections.defaultdict(lambda: collections.defaultdict(list))
    for side in ('cli', 'srv'):
        for tool, rnd, ev_path in runs(d, side):
            ev = load_ev(ev_path)
            ci = [i for i, e in enumerate(ev) if e[1] == 0]
            seg = collections.defaultdict(list)
            for j in range(len(ci) - ITERS, len(ci) - 3):
                s = ev[ci[j]:ci[j + 1] + 1]
                w = [k for k, e in enumerate(s) if e[1] == 1]
                if len(w) != 1:
                    continue
                w = w[0]
                locks = [k for k, e in enumerate(s[:w]) if e[1] == 3]
                if len(locks) < 2:
                    continue
                post, found = locks[-1], locks[-2]
                t = [e[0] / rate for e in s]
                seg['doorbell write'].append(t[w + 1] - t[w])
                seg['write return -> clock read'].append(t[-1] - t[w + 1])
                seg['clock read -> first poll'].append(t[locks[0]] - t[0])
                seg['found poll -> post lock'].append(t[post] - t[found + 1])
                rx = [k for k in locks[:-1] if s[k][2] == s[found][2]]
                if len(rx) >= 3:
                    seg['empty poll round'].append((t[rx[-2]] - t[rx[0]]) / (len(rx) - 2))
            for k, v in seg.items():
                v.sort()
                res[(side, k)][tool].append((pctl(v, 25), pctl(v, 50)))
    for (side, k), by_tool in sorted(res.items()):
        print('%s %-28s' % (side, k), '   '.join(
            '%s %.3f / %.3f' % (t, st.median(x[0] for x in v), st.median(x[1] for x in v))
            for t, v in sorted(by_tool.items())))


if __name__ == '__main__':
    if len(sys.argv) < 3 or sys.argv[1] not in ('pct', 'stalls', 'period', 'seg'):
        sys.exit(__doc__)
    cmd, d = sys.argv[1], sys.argv[2]
    if cmd == 'pct':
        cmd_pct(d, *sys.argv[3:4])
    elif cmd == 'stalls':
        cmd_stalls(d)
    elif cmd == 'period':
        cmd_period(d, *(int(x) for x in sys.argv[3:4]))
    else:
        cmd_seg(d)
