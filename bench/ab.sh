#!/usr/bin/env bash
# bench/ab.sh — interleaved A/B rounds: UCX and several rucx variants, one perftest case.
#
# compare.sh answers "rucx against UCX"; this answers "is a change better than the build
# before", which needs the variants run next to each other in every round (a shared host's
# speed drifts by more than most changes are worth; what a set of rounds resolves:
# docs/benchmarks.md, "How many rounds"). Each round runs UCX's ucx_perftest and every
# variant once, in an order rotated per round, and appends one CSV row per run to OUT:
#   name,round,iters,p50,avg,overall,bw,bw_overall,mr,mr_overall
# then prints, for every variant, the median per-round ratio against UCX and against the first
# variant, by the typical latency (p50) and by the overall average (1 / overall message rate,
# what compare.sh's table takes: lower is better; for *_bw tests the overall MB/s: higher is
# better), with the rounds whose ratio was below 1 (the sign test's count: of 16 rounds 13 or
# more, of 40 rounds 27 or more, or as few on the other side, say a difference at 5%).
#
# Usage: bench/ab.sh [--vm] [--rounds N] [--out FILE] [--args "PERFTEST ARGS"] [--loopback]
#                    [--netns] [--floor [--line-split US] [--split US]]
#                    NAME=DIR[,VAR=VALUE...] ...
#        bench/ab.sh --snapshot DIR      copy the release build (rucx-perftest, libuct_*.so)
#                                        into DIR, a variant's folder
#        bench/ab.sh --summary FILE      summarize an OUT file again
#   NAME=DIR   a variant: DIR/rucx-perftest with RUCX_MODULE_DIR=DIR (a --snapshot folder);
#              VAR=VALUE pairs are set for its processes only (e.g. base=/tmp/a
#              small=/tmp/a,RUCX_IB_RX_QUEUE_LEN=256: one build, two settings)
#   --args     the case (default: ud_verbs am_lat 8 B as compare.sh runs it)
#   --loopback one process (-l), as compare.sh's self cases; default: server and client
#   --netns    (native only, root) server and client in two network namespaces joined by a veth
#              pair, 192.0.2.1/24 and 192.0.2.2/24 as scripts/netns-test.sh: a path that is not
#              loopback. The veth is veth0 in both (both tools' servers use the device the client
#              names), so the case says -d veth0, e.g. --args "-t am_lat -x tcp -d veth0 -s 8
#              -D short -n 100000"; UCX_* / RUCX_* variables reach both sides. Set up once,
#              removed on exit. --floor's probes still run outside (the host's speed)
#   --vm       run the rounds in the soft-RoCE VM (testbed/rxe-vm.sh --smp 4, one boot)
#   --rounds   default 16; the processes run SCHED_FIFO (chrt -f 10) as compare.sh --rt
#   --floor    (native only) first in each round the bare-socket ping-pong and the cache-line
#              probe (socket-floor lat, socket-floor line); the summary then also splits the
#              rounds by where the host put the two vCPUs: a cache line one way between CPUs 0
#              and 1 below --line-split microseconds (default 0.06: both on one die) or at or
#              above it (across dies), since two-process cases run at different speeds on the
#              two. Files without the probe split by the floor p50
#              (--split, default 4.0 us)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=16
OUT=""
VM=0
LOOP=0
ARGS="-t am_lat -x ud_verbs -d rxe0:1 -s 8 -n 20000"
FLOOR=0
NETNS=0
SPLIT=4.0
LINE_SPLIT=0.06
VARIANTS=()
die() { echo "ab.sh: $*" >&2; exit 2; }

summary() {
    python3 - "$1" "$SPLIT" "$LINE_SPLIT" <<'EOF'
import collections, statistics as st, sys
rows = collections.defaultdict(dict)
bw = False
for line in open(sys.argv[1]):
    if line.startswith('#kind,'):
        bw = line.strip() == '#kind,bw'
    p = line.strip().split(',')
    if len(p) < 10 or not p[1].isdigit():
        continue
    try:
        p50, mr = float(p[3]), float(p[9])
        bw_o = float(p[7])
    except ValueError:
        continue
    rows[int(p[1])][p[0]] = (p50, mr, bw_o)
# --floor: the round's bare-socket ping-pong p50, to tell the host's speeds apart
floor = {r: d.pop('floor')[0] for r, d in rows.items() if 'floor' in d}
# --floor: the round's cache-line probe, one way in us (where the vCPUs are)
line = {r: d.pop('line')[0] for r, d in rows.items() if 'line' in d}
names = [n for n in dict.fromkeys(n for r in rows.values() for n in r) if n != 'ucx']
first = names[0] if names else None
def ratios(sel, a, b):
    out = []
    for r in sel:
        if a in r and b in r:
            (p_a, m_a, b_a), (p_b, m_b, b_b) = r[a], r[b]
            avg = (b_a / b_b) if bw else (m_b / m_a if m_a > 0 else float('nan'))
            out.append((p_a / p_b if p_b > 0 else float('nan'), avg))
    return out
def report(sel, title):
    print('%s\n%-12s %-8s %7s %9s %7s %9s   (median of the per-round ratios; rounds below 1)' % (
        title, 'variant', 'against', 'p50', '', 'bw' if bw else 'avg', ''))
    for n in names:
        for ref in (['ucx'] if any('ucx' in r for r in sel) else []) + ([first] if n != first else []):
            rs = ratios(sel, n, ref)
            if not rs:
                continue
            p = [x for x, _ in rs]; a = [y for _, y in rs]
            print('%-12s %-8s %7.3f %4d/%-4d %7.3f %4d/%-4d' % (n, ref, st.median(p), sum(x < 1 for x in p),
                  len(p), st.median(a), sum(y < 1 for y in a), len(a)))
report(list(rows.values()), 'all rounds')
def split_report(by, split, names, what, prec):
    # the rounds on either side of `split` by their probe `by` (one report each)
    for name, keep in ((names[0], lambda f: f < split), (names[1], lambda f: f >= split)):
        rs = [r for r in rows if r in by and keep(by[r])]
        if rs:
            med = st.median([by[r] for r in rs])
            extra = (', floor p50 %.2f us' % st.median([floor[r] for r in rs if r in floor] or [0])
                     if by is line else '')
            report([rows[r] for r in rs], '%s rounds (%s %s %.*f us%s; median %.*f us%s)' % (
                name, what, '<' if name == names[0] else '>=', prec, split,
                ' one way' if by is line else '', prec, med, extra))
if line:
    split_report(line, float(sys.argv[3]), ('one die', 'across dies'), 'cache line', 3)
elif floor:
    split_report(floor, float(sys.argv[2]), ('fast', 'slow'), 'floor p50', 2)
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --args) ARGS="$2"; shift 2 ;;
        --loopback) LOOP=1; shift ;;
        --floor) FLOOR=1; shift ;;
        --netns) NETNS=1; shift ;;
        --split) SPLIT="$2"; shift 2 ;;
        --line-split) LINE_SPLIT="$2"; shift 2 ;;
        --vm) VM=1; shift ;;
        --snapshot)
            [ $# -ge 2 ] || die "--snapshot needs a folder"
            mkdir -p "$2" && cp "$ROOT/target/release/rucx-perftest" "$ROOT"/target/release/libuct_*.so "$2"/ ||
                die "no release build to copy (cargo build --release -p rucx-tools -p uct-ib-plugin -p uct-self-plugin -p uct-tcp-plugin)"
            echo "ab.sh: $(ls "$2" | wc -l) files in $2"; exit 0 ;;
        --summary) [ $# -ge 2 ] || die "--summary needs a file"; summary "$2"; exit 0 ;;
        -h|--help) sed -n '2,41p' "$0"; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *=*) VARIANTS+=("$1"); shift ;;
        *) die "not a variant (NAME=DIR): $1" ;;
    esac
done
[ ${#VARIANTS[@]} -gt 0 ] || die "no variant given (NAME=DIR, see --help)"
for v in "${VARIANTS[@]}"; do
    d=${v#*=}; d=${d%%,*}
    [ -x "$d/rucx-perftest" ] || die "$d/rucx-perftest missing (bench/ab.sh --snapshot $d)"
    [[ "$d" = /* ]] || die "give variant folders as absolute paths (the VM runs elsewhere): $d"
done
command -v ucx_perftest >/dev/null || die "ucx_perftest missing (scripts/install-deps.sh installs ucx-utils)"
OUT=${OUT:-$(mktemp /tmp/rucx-ab.XXXXXX.csv)}
touch "$OUT" || die "cannot write $OUT"
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")

[ "$FLOOR" = 1 ] && [ "$VM" = 1 ] && die "--floor measures the host's speed: for native runs only"
if [ "$NETNS" = 1 ]; then
    [ "$VM" = 0 ] && [ "$LOOP" = 0 ] || die "--netns runs a server and a client natively (not with --vm or --loopback)"
    [[ " $ARGS " == *" -d veth0 "* ]] || die "--netns: the case's device is veth0 (--args \"... -d veth0 ...\")"
    [ "$(id -u)" = 0 ] || die "--netns needs root (ip netns, veth)"
fi
if [ "$VM" = 1 ]; then
    # the folders of the variants and of OUT are shared read-write with the guest
    rw=(--rw "$(dirname "$OUT")")
    for v in "${VARIANTS[@]}"; do d=${v#*=}; rw+=(--rw "${d%%,*}"); done
    "$ROOT/testbed/rxe-vm.sh" --smp 4 --timeout 3000 "${rw[@]}" -- \
        "$ROOT/bench/ab.sh" --rounds "$ROUNDS" --out "$OUT" --args "$ARGS" \
        $([ "$LOOP" = 1 ] && echo --loopback) "${VARIANTS[@]}" || die "the VM run failed"
    exit 0
fi

if [ "${RXE_VM:-0}" = 1 ]; then export UCX_IB_GID_INDEX=0 RUCX_IB_GID_INDEX=0; fi
read -r -a PARGS <<<"$ARGS"
TEST=$(echo " $ARGS " | sed -n 's/.* -t \([^ ]*\) .*/\1/p')
case "$TEST" in *_bw) KIND=bw ;; *) KIND=lat ;; esac
grep -q '^#kind,' "$OUT" || echo "#kind,$KIND" >>"$OUT"
PORT=$((24000 + RANDOM % 4000))
# Where the server and the client run, and the address the client connects to.
SRV=(); CLI=(); HOST=127.0.0.1
if [ "$NETNS" = 1 ]; then
    NS_A=rucx-ab-a-$$ NS_B=rucx-ab-b-$$
    netns_down() {
        timeout 10 ip netns del "$NS_A" 2>/dev/null
        timeout 10 ip netns del "$NS_B" 2>/dev/null
        timeout 10 ip link del "abva$$" 2>/dev/null # left in this namespace by a failed setup
    }
    trap netns_down EXIT
    trap 'exit 130' INT TERM
    t="timeout 10"
    { $t ip netns add "$NS_A" && $t ip netns add "$NS_B" &&
        $t ip link add "abva$$" type veth peer name "abvb$$" &&
        $t ip link set "abva$$" netns "$NS_A" && $t ip link set "abvb$$" netns "$NS_B" &&
        $t ip -n "$NS_A" link set "abva$$" name veth0 && $t ip -n "$NS_B" link set "abvb$$" name veth0 &&
        $t ip -n "$NS_A" addr add 192.0.2.1/24 dev veth0 && $t ip -n "$NS_B" addr add 192.0.2.2/24 dev veth0 &&
        $t ip -n "$NS_A" link set lo up && $t ip -n "$NS_B" link set lo up &&
        $t ip -n "$NS_A" link set veth0 up && $t ip -n "$NS_B" link set veth0 up; } ||
        die "cannot set up the namespaces and the veth pair"
    for _ in $(seq 50); do # the link up at both ends
        $t ip -n "$NS_A" -br link show veth0 | grep -q ' UP ' &&
            $t ip -n "$NS_B" -br link show veth0 | grep -q ' UP ' && break
        sleep 0.1
    done
    SRV=(ip netns exec "$NS_A"); CLI=(ip netns exec "$NS_B"); HOST=192.0.2.1
    echo "ab.sh: server in $NS_A (192.0.2.1), client in $NS_B (192.0.2.2), veth0" >&2
fi
run() { # name round tool env...
    local name=$1 r=$2 tool=$3 out s
    shift 3
    if [ "$LOOP" = 1 ]; then
        out=$(env "$@" timeout -k 5 120 chrt -f 10 "$tool" -l "${PARGS[@]}" -f -v 2>/dev/null | tail -1)
    else
        PORT=$((PORT + 1))
        env "$@" timeout -k 5 120 "${SRV[@]}" chrt -f 10 "$tool" -p "$PORT" >/dev/null 2>&1 &
        s=$!
        for _ in $(seq 100); do
            timeout 5 "${SRV[@]}" ss -ltnH "sport = :$PORT" 2>/dev/null | grep -q . && break
            kill -0 "$s" 2>/dev/null || break
            sleep 0.05
        done
        out=$(env "$@" timeout -k 5 120 "${CLI[@]}" chrt -f 10 "$tool" "$HOST" -p "$PORT" "${PARGS[@]}" -f -v 2>/dev/null | tail -1)
        wait "$s" 2>/dev/null
    fi
    echo "$name,$r,${out:-FAIL}" >>"$OUT"
}
ALL=(ucx "${VARIANTS[@]}")
FLOOR_BIN=$ROOT/target/release/socket-floor
if [ "$FLOOR" = 1 ] && [ ! -x "$FLOOR_BIN" ]; then
    die "--floor needs $FLOOR_BIN (cargo build --release -p rucx-bench --bin socket-floor)"
fi
for r in $(seq 1 "$ROUNDS"); do
    if [ "$FLOOR" = 1 ]; then
        fl=$(timeout -k 5 60 chrt -f 10 "$FLOOR_BIN" lat -s 8 -n 100000 2>/dev/null |
            grep -E '^ *[0-9]' | tail -1 | tr -d ' ')
        echo "floor,$r,${fl:-FAIL}" >>"$OUT"
        ln=$(timeout -k 5 60 "$FLOOR_BIN" line 2>/dev/null | grep -E '^ *[0-9]' | tail -1 | tr -d ' ')
        echo "line,$r,${ln:-FAIL}" >>"$OUT"
    fi
    for i in $(seq 0 $((${#ALL[@]} - 1))); do
        v=${ALL[$(((i + r) % ${#ALL[@]}))]}
        if [ "$v" = ucx ]; then
            run ucx "$r" ucx_perftest
        else
            d=${v#*=}
            envs=()
            if [[ "$d" == *,* ]]; then IFS=, read -r -a envs <<<"${d#*,}"; d=${d%%,*}; fi
            run "${v%%=*}" "$r" "$d/rucx-perftest" RUCX_MODULE_DIR="$d" "${envs[@]}"
        fi
    done
    echo "ab.sh: round $r of $ROUNDS" >&2
done
echo "ab.sh: rows in $OUT" >&2
summary "$OUT"
