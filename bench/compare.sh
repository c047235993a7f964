#!/usr/bin/env bash
# bench/compare.sh — rucx next to UCX 1.13, same machine, same run.
#
# For every case it runs UCX's `ucx_perftest` and rucx's `rucx-perftest` (same options, same
# measurement method) alternately, several rounds, takes the median of each and prints one
# markdown table: case, unit, UCX, rucx, rucx/UCX, plus the 50th-percentile latency (robust on
# a busy machine). The TCP floor (a bare non-blocking socket, tools/src/bin/socket-floor.rs)
# shows what the kernel alone costs.
#
# Usage: bench/compare.sh [--rounds N] [--quick] [--cases self,tcp,floor,verbs,eps] [--pin]
#                         [--write] [--timeout S]
#   --quick   2 rounds, a fifth of the iterations (a smoke run)
#   --pin     loopback runs on CPU 0; server on CPU 0, client on CPU 1 (taskset)
#   --write   also put the table, machine and date into docs/benchmarks.md (between markers)
# Every command runs under `timeout`; a failed run is reported, never waited for.
set -uo pipefail

ROUNDS=5
QUICK=0
PIN=0
WRITE=0
TO=60
CASES="self,tcp,floor,verbs,eps"
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --quick) QUICK=1; ROUNDS=2; shift ;;
        --pin) PIN=1; shift ;;
        --write) WRITE=1; shift ;;
        --timeout) TO="$2"; shift 2 ;;
        --cases) CASES="$2"; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
RUCX=$TARGET/release/rucx-perftest
FLOOR=$TARGET/release/socket-floor
UCX=ucx_perftest
LOG=$(mktemp -t rucx-bench.XXXXXX)
PORT=$((14000 + $$ % 1000 * 2))
want() { case ",$CASES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
note() { echo "$*" >&2; NOTES+=("$*"); }
NOTES=()

# ------------------------------------------------------------------ prerequisites
if ! command -v "$UCX" >/dev/null 2>&1; then
    echo "installing UCX (Debian ucx-utils) ..." >&2
    timeout 300 apt-get install -y ucx-utils >/dev/null 2>&1 ||
        { timeout 300 apt-get update >/dev/null 2>&1 && timeout 300 apt-get install -y ucx-utils >/dev/null 2>&1; } ||
        { echo "compare.sh: cannot install ucx-utils; install UCX so that ucx_perftest is on PATH" >&2; exit 1; }
fi
UCX_VERSION=$(dpkg-query -W -f '${Version}' ucx-utils 2>/dev/null || ucx_info -v 2>/dev/null | head -1)
echo "building rucx-perftest and socket-floor (release) ..." >&2
(cd "$ROOT" && timeout 1800 cargo build --release -q -p rucx-tools --bin rucx-perftest --bin socket-floor) ||
    { echo "compare.sh: build failed" >&2; exit 1; }

SCALE=1
[ "$QUICK" = 1 ] && SCALE=5
iters() { echo $(( $1 / SCALE > 0 ? $1 / SCALE : 1 )); }

cpu() { if [ "$PIN" = 1 ]; then echo "taskset -c $1"; fi; }

# One CSV result row ("iters,pct,avg,overall,bw,bw_overall,mr,mr_overall") or "FAIL".
run_loopback() { # tool args...
    local tool=$1; shift
    local out
    out=$(timeout -k 5 "$TO" $(cpu 0) "$tool" -l "$@" -f -v 2>>"$LOG" | grep -E '^[0-9]' | tail -1)
    echo "${out:-FAIL}"
}

run_p2p() { # tool args...
    local tool=$1; shift
    PORT=$((PORT + 1))
    timeout -k 5 "$TO" $(cpu 0) "$tool" -p "$PORT" >/dev/null 2>>"$LOG" &
    local spid=$! i out
    for i in $(seq 1 100); do
        ss -ltnH "sport = :$PORT" 2>/dev/null | grep -q . && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    out=$(timeout -k 5 "$TO" $(cpu 1) "$tool" 127.0.0.1 -p "$PORT" "$@" -f -v 2>>"$LOG" | grep -E '^[0-9]' | tail -1)
    wait "$spid" 2>/dev/null
    echo "${out:-FAIL}"
}

median() { # precision values... (FAIL ignored)
    local prec=$1; shift
    printf '%s\n' "$@" | grep -v FAIL | sort -g | awk -v p="$prec" '{v[NR]=$1} END {
        if (NR == 0) { print "n/a"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.*f\n", p, m }'
}

field() { echo "$1" | awk -F, -v f="$2" '{print ($1 == "FAIL") ? "FAIL" : $f}'; }

# ------------------------------------------------------------------ cases
# id|mode|label|kind|ucx options|rucx options   (kind: lat = µs, lower is better; bw = MB/s)
CASE_LIST=()
if want self; then
    CASE_LIST+=(
        "self_am_lat|loop|self am_lat 8 B short|lat|-t am_lat -x self -d memory0 -s 8 -D short -n $(iters 5000000)|same"
        "self_am_bw|loop|self am_bw 8000 B bcopy|bw|-t am_bw -x self -d memory0 -s 8000 -D bcopy -n $(iters 5000000)|same"
        "self_put_bw|loop|self put_bw 1 MiB (UCX bcopy, rucx zcopy)|bw|-t put_bw -x self -d memory0 -s 1048576 -D bcopy -n $(iters 20000)|-t put_bw -x self -d memory0 -s 1048576 -D zcopy -n $(iters 20000)"
    )
fi
if want tcp; then
    # rucx has tcp once its module exists: probe with a short two-process run.
    probe=$(run_p2p "$RUCX" -t am_lat -x tcp -d lo -n 10 -w 0)
    if [ "$probe" = FAIL ]; then
        why=$(grep -m1 -iE "error|cannot|failed" "$LOG" | sed -E 's/\x1b\[[0-9;]*m//g; s/^.*ERROR +[^ ]+: //' | cut -c1-160)
        note "tcp cases skipped: rucx-perftest has no usable tcp transport yet (${why:-see $LOG})"
    else
        CASE_LIST+=(
            "tcp_am_lat_8|p2p|tcp lo am_lat 8 B short|lat|-t am_lat -x tcp -d lo -s 8 -D short -n $(iters 10000)|same"
            "tcp_am_lat_8000|p2p|tcp lo am_lat 8000 B bcopy|lat|-t am_lat -x tcp -d lo -s 8000 -D bcopy -n $(iters 10000)|same"
            "tcp_am_bw_8000|p2p|tcp lo am_bw 8000 B bcopy|bw|-t am_bw -x tcp -d lo -s 8000 -D bcopy -n $(iters 20000)|same"
            "tcp_am_bw_64k|p2p|tcp lo am_bw 64 KiB zcopy|bw|-t am_bw -x tcp -d lo -s 65536 -D zcopy -n $(iters 5000)|same"
            "tcp_put_bw_1m|p2p|tcp lo put_bw 1 MiB zcopy|bw|-t put_bw -x tcp -d lo -s 1048576 -D zcopy -n $(iters 500)|same"
        )
    fi
fi
if want verbs; then
    # HOOK(verbs): rc_verbs / ud_verbs inside the soft-RoCE VM (testbed/). Enable with
    # RUCX_BENCH_VERBS_DEV=<dev:port> (e.g. rxe0:1) once uct-ib registers rc_verbs/ud_verbs;
    # same cases as tcp with -x rc_verbs / -x ud_verbs -d $RUCX_BENCH_VERBS_DEV.
    if [ -n "${RUCX_BENCH_VERBS_DEV:-}" ]; then
        for tl in rc_verbs ud_verbs; do
            CASE_LIST+=(
                "${tl}_am_lat|p2p|$tl am_lat 8 B short|lat|-t am_lat -x $tl -d $RUCX_BENCH_VERBS_DEV -s 8 -n $(iters 100000)|same"
                "${tl}_am_bw|p2p|$tl am_bw 8000 B bcopy|bw|-t am_bw -x $tl -d $RUCX_BENCH_VERBS_DEV -s 8000 -D bcopy -n $(iters 100000)|same"
            )
        done
    else
        note "verbs cases skipped: set RUCX_BENCH_VERBS_DEV inside the soft-RoCE VM (hook in bench/compare.sh)"
    fi
fi
if want eps; then
    # HOOK(eps): memory a connected tcp ep costs and the time to connect 1000 eps on loopback
    # tcp — to be measured (rucx and UCX alike) once the tcp transport exists.
    note "ep memory / 1000-ep connect time: not measured yet (hook in bench/compare.sh, needs tcp)"
fi

declare -A VAL PCT FAILED
run_case() { # tool id mode args
    local tool=$1 id=$2 mode=$3; shift 3
    local row
    if [ "$mode" = loop ]; then row=$(run_loopback "$tool" "$@"); else row=$(run_p2p "$tool" "$@"); fi
    echo "$row"
}

echo "running ${#CASE_LIST[@]} cases x $ROUNDS rounds (UCX and rucx alternating) ..." >&2
for round in $(seq 1 "$ROUNDS"); do
    for c in "${CASE_LIST[@]}"; do
        IFS='|' read -r id mode label kind uargs rargs <<<"$c"
        [ "$rargs" = same ] && rargs=$uargs
        # Alternate who goes first, so neither always runs on a warmer machine.
        if [ $((round % 2)) = 1 ]; then order="ucx rucx"; else order="rucx ucx"; fi
        for who in $order; do
            # A tool that failed a case once is not retried (keeps a broken build from costing
            # rounds x timeout).
            if [ -n "${FAILED[$id,$who]:-}" ]; then continue; fi
            if [ "$who" = ucx ]; then row=$(run_case "$UCX" "$id" "$mode" $uargs); else row=$(run_case "$RUCX" "$id" "$mode" $rargs); fi
            if [ "$row" = FAIL ]; then
                FAILED[$id,$who]=1
                note "$label: $who failed (see $LOG); not retried"
            fi
            col=4; [ "$kind" = bw ] && col=6
            VAL[$id,$who]+="$(field "$row" $col) "
            PCT[$id,$who]+="$(field "$row" 2) "
            printf '  round %d %-44s %-5s %s\n' "$round" "$label" "$who" "$row" >&2
        done
    done
done

# Floor: the same kernel path with no transport.
FLOOR_ROWS=()
if want floor; then
    for spec in "lat|tcp floor: socket ping-pong 8 B|lat -s 8 -n $(iters 20000)" "bw|tcp floor: socket stream 64 KiB|stream -s 65536 -n $(iters 20000)"; do
        IFS='|' read -r kind label args <<<"$spec"
        vals="" pcts=""
        for round in $(seq 1 "$ROUNDS"); do
            row=$(timeout -k 5 "$TO" "$FLOOR" $args 2>>"$LOG" | grep -E '^[0-9]' | tail -1)
            row=${row:-FAIL}
            col=4; [ "$kind" = bw ] && col=6
            vals+="$(field "$row" $col) "; pcts+="$(field "$row" 2) "
            printf '  round %d %-44s %s\n' "$round" "$label" "$row" >&2
        done
        unit="µs (RTT/2)"; [ "$kind" = bw ] && unit="MB/s"
        prec=3; [ "$kind" = bw ] && prec=2
        p="$(median 3 $pcts)"; [ "$kind" = bw ] && p="-"
        FLOOR_ROWS+=("| $label | $unit | $(median $prec $vals) | $p |")
    done
fi

# ------------------------------------------------------------------ table
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b != "n/a" && a != "n/a") printf "%.2f", b / a; else print "n/a" }'; }
TABLE=$(
    echo "| case | unit | UCX $UCX_VERSION | rucx | rucx/UCX | UCX p50 | rucx p50 |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for c in "${CASE_LIST[@]}"; do
        IFS='|' read -r id mode label kind uargs rargs <<<"$c"
        prec=3; [ "$kind" = bw ] && prec=2
        u=$(median $prec ${VAL[$id,ucx]}); r=$(median $prec ${VAL[$id,rucx]})
        if [ "$kind" = lat ]; then
            unit="µs (lower is better)"; up=$(median 3 ${PCT[$id,ucx]}); rp=$(median 3 ${PCT[$id,rucx]})
        else
            unit="MB/s (higher is better)"; up="-"; rp="-"
        fi
        echo "| $label | $unit | $u | $r | $(ratio "$u" "$r") | $up | $rp |"
    done
    if [ ${#FLOOR_ROWS[@]} -gt 0 ]; then
        echo
        echo "| floor (no transport) | unit | median | p50 |"
        echo "|---|---|---:|---:|"
        printf '%s\n' "${FLOOR_ROWS[@]}"
    fi
    if [ ${#NOTES[@]} -gt 0 ]; then
        echo
        for n in "${NOTES[@]}"; do echo "- $n"; done
    fi
)
MACHINE="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs, $(uname -sr), load avg $(cut -d' ' -f1-3 /proc/loadavg)"
HEAD="Run $(date -u '+%Y-%m-%d %H:%M UTC') on: $MACHINE; $(rustc --version 2>/dev/null); $ROUNDS rounds per case, medians; latency = overall average (RTT/2), bandwidth = overall MB/s (MiB/s)."
echo
echo "$HEAD"
echo
echo "$TABLE"

if [ "$WRITE" = 1 ]; then
    DOC=$ROOT/docs/benchmarks.md
    BLOCK=$(printf '<!-- results:begin (written by bench/compare.sh --write) -->\n%s\n\n%s\n<!-- results:end -->' "$HEAD" "$TABLE")
    if [ -f "$DOC" ] && grep -q '<!-- results:begin' "$DOC"; then
        awk -v block="$BLOCK" '
            /<!-- results:begin/ { print block; skip = 1; next }
            /<!-- results:end -->/ { skip = 0; next }
            !skip { print }' "$DOC" >"$DOC.tmp" && mv "$DOC.tmp" "$DOC"
    else
        printf '# Benchmarks\n\n%s\n' "$BLOCK" >>"$DOC"
    fi
    echo "written to $DOC" >&2
fi
echo "(log of stderr: $LOG)" >&2
