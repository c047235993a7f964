#!/usr/bin/env bash
# bench/compare.sh — rucx next to UCX 1.13, same machine, same run.
#
# For every case it runs UCX's `ucx_perftest` and rucx's `rucx-perftest` (same options, same
# measurement method) alternately, several rounds, takes the median of each and prints one
# markdown table: case, unit, UCX, rucx, rucx/UCX, plus the 50th-percentile latency (robust on
# a busy machine). The TCP floor (a bare non-blocking socket, bench/src/bin/socket-floor.rs)
# shows what the kernel alone costs; it runs in every round, next to the tcp cases, once with
# the system's congestion control (what UCX uses) and once with reno (what rucx's tcp uses on
# loopback, RUCX_TCP_CONGESTION=auto).
#
# verbs: rc_verbs / ud_verbs need RDMA, so on a host without it the script boots the soft-RoCE
# VM once (testbed/rxe-vm.sh --smp 4) and runs itself there (--cases verbs[,eps] --no-build),
# alternating UCX and rucx as here; its rows join this table. Inside the VM (RXE_VM=1) the verbs
# device is $RUCX_BENCH_VERBS_DEV (default rxe0:1); both tools use GID index 0 there (UCX 1.13's
# ud_verbs works on rxe only with it). The VM is emulated (TCG): compare ratios, not numbers.
# eps: ep-cost (bench/src/bin/ep-cost.rs) and bench/c/ep-cost-ucx.c: the memory, descriptors and
# connection time of endpoints (1000 on loopback tcp; 200 per verbs transport in the VM); the
# same for UCP endpoints (bench/src/bin/ucp-ep-cost.rs, bench/c/ucp-ep-cost-ucx.c): 1000 over
# tcp on loopback, and 200 over rc in the VM (with verbs), rows "ucp/tcp" and "ucp/rc".
#
# ucp: the protocol layer's tests (tag_lat, ucp_am_lat, tag_bw, ucp_am_bw, ucp_put_bw, ucp_get,
# ucp_fadd) between two processes over tcp on loopback, UCX_TLS=tcp next to RUCX_TLS=tcp; in the
# VM (with verbs) tag_lat and tag_bw over rc (UCX_TLS=rc / RUCX_TLS=rc).
#
# sm: posix and sysv FIFOs and cma put/get between two processes of one host, as
# ucx_perftest -x posix/sysv/cma.
#
# intra: tag_lat 8 B and tag_bw 1 MiB between two processes on this host with every transport
# allowed (UCX_TLS / RUCX_TLS unset): each tool's own choice (both: shared memory).
#
# ucp and intra also run rucx's tag_lat 8 B and tag_bw 1 MiB with the ofi plugin
# (libuct_ofi.so, built for them) loaded next to the same cases with it left out
# (RUCX_MODULES=^ofi, in the UCX column): a plugin whose transports are not selected, or only
# duplicate native ones, must cost nothing (rucx/UCX 1.00 on those lines).
#
# ofi: the libfabric transport (libuct_ofi.so) between two processes on loopback: tcp;ofi_rxm and
# shm am_lat next to libfabric's own fi_pingpong (its usec/xfer, half a round trip, fills the UCX
# column), and tcp;ofi_rxm am_bw 64 KiB next to UCX's tcp am_bw zcopy. With verbs, in the VM:
# verbs;ofi_rxm and verbs (connected endpoints) am_lat next to rucx's own rc_verbs am_lat (the
# target's reference: the UCX column holds rucx there) and next to fi_pingpong over each.
#
# Usage: bench/compare.sh [--rounds N] [--quick] [--cases self,tcp,sm,ucp,intra,floor,verbs,eps,ofi]
#                         [--pin] [--nice | --rt] [--write] [--timeout S]
#   --quick   2 rounds, a fifth of the iterations (a smoke run)
#   --pin     loopback runs on CPU 0; server on CPU 0, client on CPU 1 (taskset)
#   --nice    run the measured processes at nice -20 (root): on a machine shared with compilers
#             the busy-polling sides are preempted less often (EEVDF still gives others slices)
#   --rt      run them SCHED_FIFO (chrt -f 10, root): not preempted by other work, so the average
#             equals the typical iteration; the kernel's RT throttling (95%) keeps the host usable.
#             --nice, --rt and --pin also apply inside the VM (the verbs cases).
#   --no-build  use the binaries already in $CARGO_TARGET_DIR/release (the VM run uses this)
#   --write   also put the table, machine and date into docs/benchmarks.md (between markers)
# Every command runs under `timeout`; a failed run is reported, never waited for.
set -uo pipefail

ROUNDS=5
QUICK=0
PIN=0
NICE=0
WRITE=0
BUILD=1
TO=60
CASES="self,tcp,sm,ucp,intra,floor,verbs,eps,ofi"
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --quick) QUICK=1; ROUNDS=2; shift ;;
        --pin) PIN=1; shift ;;
        --nice) NICE=1; shift ;;
        --rt) NICE=2; shift ;;
        --write) WRITE=1; shift ;;
        --no-build) BUILD=0; shift ;;
        --timeout) TO="$2"; shift 2 ;;
        --cases) CASES="$2"; shift 2 ;;
        -h|--help) sed -n '2,54p' "$0"; exit 0 ;;
        *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
RUCX=$TARGET/release/rucx-perftest
FLOOR=$TARGET/release/socket-floor
EPCOST=$TARGET/release/ep-cost
EPCOST_UCX=$TARGET/release/ep-cost-ucx
UCPCOST=$TARGET/release/ucp-ep-cost
UCPCOST_UCX=$TARGET/release/ucp-ep-cost-ucx
UCX=ucx_perftest
IN_VM=${RXE_VM:-0}
LOG=$(mktemp -t rucx-bench.XXXXXX)
PORT=$((14000 + $$ % 1000 * 2))
# Each two-process run gets its own port (runs happen in subshells, so the counter is a file):
# a server that reuses the previous run's port can meet its TIME_WAIT leftovers.
PORT_FILE=$(mktemp -t rucx-bench-port.XXXXXX)
echo "$PORT" >"$PORT_FILE"
next_port() { local p; p=$(($(cat "$PORT_FILE") + 1)); [ "$p" -gt 60000 ] && p=14000; echo "$p" >"$PORT_FILE"; echo "$p"; }
# The CSV row of `-f -v` (both tools pad the iteration count to 4 columns: "  10,...").
csv_row() { grep -E '^ *[0-9]' | tail -1 | sed 's/^ *//'; }
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
# verbs on a host without RDMA: through the VM (after everything else, which it would disturb).
VM_VERBS=0
if want verbs && [ "$IN_VM" != 1 ] && [ -z "${RUCX_BENCH_VERBS_DEV:-}" ]; then
    if [ -x "$ROOT/testbed/rxe-vm.sh" ] && command -v qemu-system-x86_64 >/dev/null 2>&1; then
        VM_VERBS=1
    else
        note "verbs cases skipped: no RDMA device and no soft-RoCE VM (testbed/rxe-vm.sh, qemu-system-x86)"
    fi
fi
if [ "$BUILD" = 1 ]; then
    echo "building rucx-perftest, socket-floor and ep-cost (release) ..." >&2
    # two builds: `--bin` would limit rucx-bench to a binary of that name (none: no floor, no ep-cost)
    (cd "$ROOT" && timeout 1800 cargo build --release -q -p rucx-tools --bin rucx-perftest &&
        timeout 1800 cargo build --release -q -p rucx-bench --bins) ||
        { echo "compare.sh: build failed" >&2; exit 1; }
    if { want ofi || want ucp || want intra; } && [ "$IN_VM" != 1 ] || { want ofi && [ "$VM_VERBS" = 1 ]; }; then
        echo "building uct-ofi (release: libuct_ofi.so, the libfabric plugin) ..." >&2
        (cd "$ROOT" && timeout 1800 cargo build --release -q -p uct-ofi-plugin) ||
            { note "ofi cases and ofi-plugin lines skipped: cargo build -p uct-ofi-plugin failed (needs libfabric-dev)"; CASES=${CASES//ofi/}; }
    fi
    if [ "$VM_VERBS" = 1 ]; then
        echo "building uct-ib (release: libuct_ib.so, the verbs plugin) ..." >&2
        (cd "$ROOT" && timeout 1800 cargo build --release -q -p uct-ib-plugin) ||
            { note "verbs cases skipped: cargo build -p uct-ib-plugin failed (scripts/install-deps.sh installs what it needs)"; VM_VERBS=0; }
    fi
    if want eps; then
        cc -O2 -o "$EPCOST_UCX" "$ROOT/bench/c/ep-cost-ucx.c" -luct -lucs 2>>"$LOG" ||
            note "UCX ep cost not measured: cc bench/c/ep-cost-ucx.c -luct -lucs failed (libucx-dev missing?)"
        cc -O2 -o "$UCPCOST_UCX" "$ROOT/bench/c/ucp-ep-cost-ucx.c" -lucp -lucs 2>>"$LOG" ||
            note "UCX UCP ep cost not measured: cc bench/c/ucp-ep-cost-ucx.c -lucp -lucs failed (libucx-dev missing?)"
    fi
fi

SCALE=1
[ "$QUICK" = 1 ] && SCALE=5
iters() { echo $(( $1 / SCALE > 0 ? $1 / SCALE : 1 )); }

# The command prefix of a measured process: CPU $1 under --pin, nice -20 under --nice.
prio() { case "$NICE" in 1) echo "nice -n -20" ;; 2) echo "chrt -f 10" ;; esac; }
# (--rt ignores --pin: UCX's async thread, pinned to its main thread's CPU at the same FIFO
# priority, never runs there, and ucx_perftest's server dies.)
cpu() { echo "$(prio) $(if [ "$PIN" = 1 ] && [ "$NICE" != 2 ]; then echo "taskset -c $1"; fi)"; }

# One CSV result row ("iters,pct,avg,overall,bw,bw_overall,mr,mr_overall") or "FAIL".
run_loopback() { # tool args...
    local tool=$1; shift
    local out
    out=$(timeout -k 5 "$TO" $(cpu 0) "$tool" -l "$@" -f -v 2>>"$LOG" | csv_row)
    echo "${out:-FAIL}"
}

run_p2p() { # tool args...
    local tool=$1; shift
    local PORT
    PORT=$(next_port)
    timeout -k 5 "$TO" $(cpu 0) "$tool" -p "$PORT" >/dev/null 2>>"$LOG" &
    local spid=$! i out
    for i in $(seq 1 100); do
        ss -ltnH "sport = :$PORT" 2>/dev/null | grep -q . && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.05
    done
    out=$(timeout -k 5 "$TO" $(cpu 1) "$tool" 127.0.0.1 -p "$PORT" "$@" -f -v 2>>"$LOG" | csv_row)
    wait "$spid" 2>/dev/null
    echo "${out:-FAIL}"
}

# fi_pingpong, the reference of the ofi latency cases: its result as a perftest CSV row (usec/xfer
# is half a round trip, like am_lat's latency; message rate = 1e6 / usec).
run_fipp() { # fi_pingpong args...
    local PORT spid out
    PORT=$(next_port)
    timeout -k 5 "$TO" $(cpu 0) fi_pingpong -B "$PORT" "$@" >/dev/null 2>>"$LOG" &
    spid=$!
    sleep 0.3
    out=$(timeout -k 5 "$TO" $(cpu 1) fi_pingpong -P "$PORT" "$@" "$FIPP_ADDR" 2>>"$LOG" |
        awk '$1 ~ /^[0-9]+$/ && NF >= 8 && $7 + 0 > 0 {
            printf "%s,%s,%s,%s,%s,%s,%.3f,%.3f\n", $2, $7, $7, $7, $6, $6, 1e6 / $7, 1e6 / $7 }' | tail -1)
    wait "$spid" 2>/dev/null
    echo "${out:-FAIL}"
}

# The address fi_pingpong's client connects to (verbs: the rxe device's IP).
FIPP_ADDR=127.0.0.1

median() { # precision values... (FAIL ignored)
    local prec=$1; shift
    printf '%s\n' "$@" | grep -v FAIL | sort -g | awk -v p="$prec" '{v[NR]=$1} END {
        if (NR == 0) { print "n/a"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.*f\n", p, m }'
}

field() { echo "$1" | awk -F, -v f="$2" '{print ($1 == "FAIL") ? "FAIL" : $f}'; }
# The measured value of a row: bandwidth (MB/s) as printed; latency (µs) as 1e6 / overall message
# rate, which both tools print with full precision (their latency columns have three decimals,
# too few for self's nanoseconds). For every test, overall_mr = 1 / overall_lat.
value() { # kind row
    echo "$2" | awk -F, -v k="$1" '{ if ($1 == "FAIL" || NF < 8) print "FAIL";
        else if (k == "bw") print $6; else if (k == "mr") print $8;
        else if ($8 + 0 > 0) printf "%.6f\n", 1e6 / $8; else print "FAIL" }'
}
# Digits for a latency median: three, more below 0.1 µs.
lat_prec() { awk -v v="$1" 'BEGIN { print (v != "n/a" && v + 0 < 0.1) ? 4 : 3 }'; }

# ------------------------------------------------------------------ cases
# id|mode|label|kind|ucx options|rucx options   (kind: lat = µs, lower is better; bw = MB/s)
CASE_LIST=()
if want self; then
    CASE_LIST+=(
        "self_am_lat|loop|self am_lat 8 B short|lat|-t am_lat -x self -d memory0 -s 8 -D short -n $(iters 20000000)|same"
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
            "tcp_am_lat_8|p2p|tcp lo am_lat 8 B short|lat|-t am_lat -x tcp -d lo -s 8 -D short -n $(iters 100000)|same"
            "tcp_am_lat_8000|p2p|tcp lo am_lat 8000 B bcopy|lat|-t am_lat -x tcp -d lo -s 8000 -D bcopy -n $(iters 50000)|same"
            "tcp_am_bw_8000|p2p|tcp lo am_bw 8000 B bcopy|bw|-t am_bw -x tcp -d lo -s 8000 -D bcopy -n $(iters 150000)|same"
            "tcp_am_bw_64k|p2p|tcp lo am_bw 64 KiB zcopy|bw|-t am_bw -x tcp -d lo -s 65536 -D zcopy -n $(iters 40000)|same"
            "tcp_put_bw_1m|p2p|tcp lo put_bw 1 MiB zcopy|bw|-t put_bw -x tcp -d lo -s 1048576 -D zcopy -n $(iters 3000)|same"
        )
    fi
fi
if want sm && [ "$IN_VM" != 1 ]; then
    CASE_LIST+=(
        "posix_am_lat_8|p2p|posix am_lat 8 B short|lat|-t am_lat -x posix -d memory -s 8 -D short -n $(iters 1000000)|same"
        "posix_am_bw_8000|p2p|posix am_bw 8000 B bcopy|bw|-t am_bw -x posix -d memory -s 8000 -D bcopy -n $(iters 500000)|same"
        "posix_am_mr_8|p2p|posix am message rate 8 B short|mr|-t am_bw -x posix -d memory -s 8 -D short -n $(iters 2000000)|same"
        "sysv_am_lat_8|p2p|sysv am_lat 8 B short|lat|-t am_lat -x sysv -d memory -s 8 -D short -n $(iters 1000000)|same"
        "cma_put_bw_1m|p2p|cma put_bw 1 MiB zcopy|bw|-t put_bw -x cma -d memory -s 1048576 -D zcopy -n $(iters 20000)|same"
        "cma_get_bw_1m|p2p|cma get 1 MiB zcopy|bw|-t get -x cma -d memory -s 1048576 -D zcopy -n $(iters 20000)|same"
    )
fi
if want ucp && [ "$IN_VM" != 1 ]; then
    CASE_LIST+=(
        "ucp_tag_lat_8|ucp|ucp tcp tag_lat 8 B|lat|-t tag_lat -s 8 -n $(iters 100000)|same"
        "ucp_am_lat_8|ucp|ucp tcp ucp_am_lat 8 B|lat|-t ucp_am_lat -s 8 -n $(iters 100000)|same"
        # UCT's am_lat run like the UCP cases (same priority, same rounds): the base of the
        # "UCP's cost over UCT" line
        "ucp_uct_am_lat_8|ucp|ucp tcp: uct am_lat 8 B short (UCP's base)|lat|-t am_lat -x tcp -d lo -s 8 -D short -n $(iters 100000)|same"
        "ucp_tag_bw_8000|ucp|ucp tcp tag_bw 8000 B|bw|-t tag_bw -s 8000 -n $(iters 150000)|same"
        "ucp_tag_bw_1m|ucp|ucp tcp tag_bw 1 MiB|bw|-t tag_bw -s 1048576 -n $(iters 3000)|same"
        "ucp_am_bw_64k|ucp|ucp tcp ucp_am_bw 64 KiB|bw|-t ucp_am_bw -s 65536 -n $(iters 40000)|same"
        "ucp_put_bw_1m|ucp|ucp tcp ucp_put_bw 1 MiB|bw|-t ucp_put_bw -s 1048576 -n $(iters 3000)|same"
        "ucp_get_1m|ucp|ucp tcp ucp_get 1 MiB|bw|-t ucp_get -s 1048576 -n $(iters 3000)|same"
        "ucp_fadd_8|ucp|ucp tcp ucp_fadd 8 B|mr|-t ucp_fadd -s 8 -n $(iters 100000)|same"
    )
fi
if want intra && [ "$IN_VM" != 1 ]; then
    CASE_LIST+=(
        "intra_tag_lat_8|ucpintra|intra-node tag_lat 8 B (default transports)|lat|-t tag_lat -s 8 -n $(iters 100000)|same"
        "intra_tag_bw_1m|ucpintra|intra-node tag_bw 1 MiB (default transports)|bw|-t tag_bw -s 1048576 -n $(iters 3000)|same"
    )
fi
# A plugin's cost: rucx with the ofi plugin loaded next to rucx without it (UCX column).
if { want ucp || want intra; } && [ "$IN_VM" != 1 ]; then
    if [ -f "$TARGET/release/libuct_ofi.so" ]; then
        want intra && CASE_LIST+=(
            "plug_intra_tag_lat_8|plugintra|intra-node tag_lat 8 B, ofi plugin loaded (UCX col: rucx without it)|lat|-t tag_lat -s 8 -n $(iters 100000)|same"
            "plug_intra_tag_bw_1m|plugintra|intra-node tag_bw 1 MiB, ofi plugin loaded (UCX col: rucx without it)|bw|-t tag_bw -s 1048576 -n $(iters 3000)|same"
        )
        want ucp && CASE_LIST+=(
            "plug_ucp_tag_lat_8|plugucp|ucp tcp tag_lat 8 B, ofi plugin loaded (UCX col: rucx without it)|lat|-t tag_lat -s 8 -n $(iters 100000)|same"
            "plug_ucp_tag_bw_1m|plugucp|ucp tcp tag_bw 1 MiB, ofi plugin loaded (UCX col: rucx without it)|bw|-t tag_bw -s 1048576 -n $(iters 3000)|same"
        )
    else
        note "ofi-plugin lines skipped: $TARGET/release/libuct_ofi.so not built (cargo build --release -p uct-ofi-plugin)"
    fi
fi
if want ofi && [ "$IN_VM" != 1 ]; then
    if command -v fi_pingpong >/dev/null 2>&1; then
        CASE_LIST+=(
            "ofi_tcp_am_lat_8|fipp|ofi tcp;ofi_rxm am_lat 8 B (UCX col: fi_pingpong tcp rdm 64 B)|lat|-p tcp -e rdm -S 64 -I $(iters 100000)|-t am_lat -x ofi -d tcp;ofi_rxm/lo -s 8 -D short -n $(iters 100000)"
            "ofi_shm_am_lat_8|fipp|ofi shm am_lat 8 B (UCX col: fi_pingpong shm rdm 8 B)|lat|-p shm -e rdm -S 8 -I $(iters 100000)|-t am_lat -x ofi -d shm -s 8 -D short -n $(iters 100000)"
        )
    else
        note "ofi latency cases skipped: fi_pingpong not found (libfabric-bin)"
    fi
    CASE_LIST+=(
        "ofi_tcp_am_bw_64k|ofi|ofi tcp;ofi_rxm am_bw 64 KiB zcopy (UCX col: UCX tcp lo)|bw|-t am_bw -x tcp -d lo -s 65536 -D zcopy -n $(iters 40000)|-t am_bw -x ofi -d tcp;ofi_rxm/lo -s 65536 -D zcopy -n $(iters 40000)"
    )
fi
VERBS_DEV=""
if want verbs && { [ "$IN_VM" = 1 ] || [ -n "${RUCX_BENCH_VERBS_DEV:-}" ]; }; then
    VERBS_DEV=${RUCX_BENCH_VERBS_DEV:-rxe0:1}
    # rucx loads the verbs plugin from the release folder; both tools use the same GID.
    export RUCX_MODULE_DIR=${RUCX_MODULE_DIR:-$TARGET/release}
    if [ "$IN_VM" = 1 ]; then export UCX_IB_GID_INDEX=0 RUCX_IB_GID_INDEX=0; fi
    # ud_verbs: one datagram per message, so at most the path MTU (rxe: 1024) minus headers.
    # Iterations: a run's average in the VM is decided by rare millisecond stalls of the
    # emulator's threads on the host, so VM runs are long (1-3 s each) to catch enough of them.
    CASE_LIST+=(
        "rc_verbs_am_lat|p2p|rc_verbs am_lat 8 B short|lat|-t am_lat -x rc_verbs -d $VERBS_DEV -s 8 -n $(iters 60000)|same"
        "rc_verbs_am_bw|p2p|rc_verbs am_bw 8000 B bcopy|bw|-t am_bw -x rc_verbs -d $VERBS_DEV -s 8000 -D bcopy -n $(iters 20000)|same"
        "ud_verbs_am_lat|p2p|ud_verbs am_lat 8 B short|lat|-t am_lat -x ud_verbs -d $VERBS_DEV -s 8 -n $(iters 20000)|same"
        "ud_verbs_am_bw|p2p|ud_verbs am_bw 1000 B bcopy|bw|-t am_bw -x ud_verbs -d $VERBS_DEV -s 1000 -D bcopy -n $(iters 20000)|same"
    )
    if want ofi; then
        # rxe's IP (testbed/rxe-vm.sh); RxM sizes its verbs CQ by FI_UNIVERSE_SIZE, whose default
        # exceeds rxe's limits (docs/ofi.md)
        FIPP_ADDR=${RUCX_BENCH_VERBS_IP:-192.0.2.1}
        export FI_UNIVERSE_SIZE=${FI_UNIVERSE_SIZE:-16}
        CASE_LIST+=(
            "ofi_verbs_am_lat|rr|ofi verbs;ofi_rxm am_lat 8 B (UCX col: rucx rc_verbs am_lat)|lat|-t am_lat -x rc_verbs -d $VERBS_DEV -s 8 -n $(iters 60000)|-t am_lat -x ofi -d verbs;ofi_rxm/${VERBS_DEV%%:*} -s 8 -D short -n $(iters 60000)"
            "ofi_verbs_msg_am_lat|rr|ofi verbs connected am_lat 8 B (UCX col: rucx rc_verbs am_lat)|lat|-t am_lat -x rc_verbs -d $VERBS_DEV -s 8 -n $(iters 60000)|-t am_lat -x ofi -d verbs/${VERBS_DEV%%:*} -s 8 -D short -n $(iters 60000)"
        )
        command -v fi_pingpong >/dev/null 2>&1 && CASE_LIST+=(
            "ofi_verbs_fipp|fipp|ofi verbs;ofi_rxm am_lat 8 B (UCX col: fi_pingpong verbs;ofi_rxm rdm 64 B)|lat|-p verbs;ofi_rxm -e rdm -S 64 -I $(iters 60000)|-t am_lat -x ofi -d verbs;ofi_rxm/${VERBS_DEV%%:*} -s 8 -D short -n $(iters 60000)"
            "ofi_verbs_msg_fipp|fipp|ofi verbs connected am_lat 8 B (UCX col: fi_pingpong verbs msg 64 B)|lat|-p verbs -e msg -S 64 -I $(iters 60000)|-t am_lat -x ofi -d verbs/${VERBS_DEV%%:*} -s 8 -D short -n $(iters 60000)"
        )
    fi
    if want ucp; then
        CASE_LIST+=(
            "rc_ucp_tag_lat|ucprc|rc_verbs ucp tag_lat 8 B|lat|-t tag_lat -s 8 -n $(iters 20000)|same"
            "rc_ucp_tag_bw|ucprc|rc_verbs ucp tag_bw 1 MiB|bw|-t tag_bw -s 1048576 -n $(iters 300)|same"
        )
    fi
fi

declare -A VAL PCT FAILED RR CUR STL
LINE=""
# Host steal: time the hypervisor ran something else on our vCPUs (/proc/stat "steal", in
# USER_HZ ticks, all CPUs). A ping-pong stalls whenever either side's vCPU is stolen, so a run's
# overall latency grows with it; shown per case so that an unlucky round can be told from a
# slower tool. The soft-RoCE VM's guest (TCG: no paravirtual steal clock) shows "-".
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
steal_now() { echo "$(awk '/^cpu /{print $9; exit}' /proc/stat 2>/dev/null || echo 0) $(date +%s%N)"; }
steal_since() { # "ticks ns" from steal_now: steal since then, as % of all CPUs' time
    awk -v a="$1" -v b="$(steal_now)" -v hz="$CLK_TCK" -v n="$(nproc)" 'BEGIN { split(a, x, " "); split(b, y, " ")
        ns = y[2] - x[2]; if (ns <= 0) { print "FAIL"; exit }
        printf "%.2f\n", 100 * (y[1] - x[1]) / hz * 1e9 / (ns * n) }'
}
run_case() { # tool id mode args   (called in a subshell: the exports stay here)
    local tool=$1 id=$2 mode=$3; shift 3
    local row
    # UCP cases over tcp and rc run at nice -20 under --rt too: UCX's UCP accepts tcp
    # connections on its async thread, which under SCHED_FIFO waits behind its own
    # busy-polling main thread at the same priority when both are on one CPU; the peer then
    # waits for the connection's ACK until the run times out (seen in most --rt rounds; also
    # with -A signal).
    case "$mode" in ucp|ucprc|plugucp) [ "$NICE" = 2 ] && NICE=1 ;; esac
    case "$mode" in
        # Both columns are rucx, loading plugins from the release folder; the UCX column's
        # leaves the ofi plugin out.
        plugintra | plugucp)
            if [ "$mode" = plugucp ]; then mode=ucp; else mode=ucpintra; fi
            export RUCX_MODULE_DIR=$TARGET/release
            if [ "$tool" = "$UCX" ]; then export RUCX_MODULES=^ofi; else unset RUCX_MODULES; fi
            tool=$RUCX ;;
    esac
    case "$mode" in
        ucp) export UCX_TLS=tcp UCX_NET_DEVICES=lo RUCX_TLS=tcp RUCX_NET_DEVICES=lo; mode=p2p ;;
        # Both tools choose: shared memory between the two local processes (tcp only on lo).
        ucprc) export UCX_TLS=rc UCX_NET_DEVICES="$VERBS_DEV" RUCX_TLS=rc RUCX_NET_DEVICES="$VERBS_DEV"; mode=p2p ;;
        ucpintra) unset UCX_TLS UCX_NET_DEVICES RUCX_TLS RUCX_NET_DEVICES; mode=p2p ;;
    esac
    case "$mode" in
        # rucx finds libuct_ofi.so in the release folder; 64 KiB AMs need 64 KiB buffers, and
        # RxM sends them eagerly only below its buffer size (above: rendezvous, see docs/ofi.md).
        # The VM's cases are 8 B latencies, with the providers' defaults.
        fipp | ofi | rr) export RUCX_MODULE_DIR=${RUCX_MODULE_DIR:-$TARGET/release}
            [ "$IN_VM" = 1 ] || export RUCX_OFI_SEG_SIZE=72k FI_OFI_RXM_BUFFER_SIZE=${FI_OFI_RXM_BUFFER_SIZE:-73728} ;;
    esac
    if [ "$mode" = fipp ] && [ "$tool" = "$UCX" ]; then row=$(run_fipp "$@"); mode=done; fi
    # rr: the reference column is rucx itself (another transport), not UCX
    if [ "$mode" = rr ]; then tool=$RUCX; mode=p2p; fi
    if [ "$mode" = loop ]; then row=$(run_loopback "$tool" "$@"); elif [ "$mode" != done ]; then row=$(run_p2p "$tool" "$@"); fi
    echo "$row"
}

FLOOR_SPECS=(
    "floor_lat|lat|tcp floor: socket ping-pong 8 B|lat -s 8 -n $(iters 100000)"
    "floor_bw|bw|tcp floor: socket stream 64 KiB|stream -s 65536 -n $(iters 40000)"
    "floor_lat_reno|lat|tcp floor: socket ping-pong 8 B, reno|lat -s 8 -n $(iters 100000) --cc reno"
    "floor_bw_reno|bw|tcp floor: socket stream 64 KiB, reno|stream -s 65536 -n $(iters 40000) --cc reno"
    "floor_memcpy_8000|bw|memory floor: memcpy 8000 B|memcpy -s 8000 -n $(iters 2000000)"
    "floor_memcpy_1m|bw|memory floor: memcpy 1 MiB|memcpy -s 1048576 -n $(iters 20000)"
)
echo "running ${#CASE_LIST[@]} cases x $ROUNDS rounds (UCX and rucx alternating) ..." >&2
for round in $(seq 1 "$ROUNDS"); do
    # The floor: the same kernel path with no transport, in the same rounds as the tcp cases.
    if want floor && [ "$IN_VM" != 1 ]; then
        for spec in "${FLOOR_SPECS[@]}"; do
            IFS='|' read -r fid kind label args <<<"$spec"
            s0=$(steal_now)
            row=$(timeout -k 5 "$TO" $(prio) "$FLOOR" $args 2>>"$LOG" | csv_row)
            row=${row:-FAIL}
            VAL[$fid,floor]+="$(value "$kind" "$row") "; PCT[$fid,floor]+="$(field "$row" 2) "
            STL[$fid,floor]+="$(steal_since "$s0") "
            printf '  round %d %-44s floor %s\n' "$round" "$label" "$row" >&2
        done
        # Where the host put the two vCPUs this round (one die or across dies): a cache line's
        # one-way time between CPUs 0 and 1, which the two-process tcp cases depend on.
        row=$(timeout -k 5 "$TO" "$FLOOR" line 2>>"$LOG" | csv_row)
        LINE+="$(field "${row:-FAIL}" 2) "
        printf '  round %d %-44s floor %s\n' "$round" "vCPU placement: cache line one way (us)" "${row:-FAIL}" >&2
    fi
    for c in "${CASE_LIST[@]}"; do
        IFS='|' read -r id mode label kind uargs rargs <<<"$c"
        [ "$rargs" = same ] && rargs=$uargs
        # Alternate who goes first, so neither always runs on a warmer machine.
        if [ $((round % 2)) = 1 ]; then order="ucx rucx"; else order="rucx ucx"; fi
        for who in $order; do
            # A tool that failed a case twice is not run on it again (keeps a broken build from
            # costing rounds x timeout); one failure may be the host (heavy contention can fail
            # a case of either tool).
            if [ "${FAILED[$id,$who]:-0}" -ge 2 ]; then continue; fi
            s0=$(steal_now)
            if [ "$who" = ucx ]; then row=$(run_case "$UCX" "$id" "$mode" $uargs); else row=$(run_case "$RUCX" "$id" "$mode" $rargs); fi
            if [ "$row" = FAIL ]; then
                FAILED[$id,$who]=$((${FAILED[$id,$who]:-0} + 1))
                if [ "${FAILED[$id,$who]}" -ge 2 ]; then
                    note "$label: $who failed again (see $LOG); not run again"
                else
                    note "$label: $who failed in round $round (see $LOG); tried again next round"
                fi
            fi
            CUR[$who]=$(value "$kind" "$row")
            VAL[$id,$who]+="${CUR[$who]} "
            PCT[$id,$who]+="$(field "$row" 2) "
            STL[$id,$who]+="$(steal_since "$s0") "
            printf '  round %d %-44s %-5s %s\n' "$round" "$label" "$who" "$row" >&2
        done
        # This round's rucx/UCX: the two ran seconds apart, so slow drifts of the machine's
        # speed over minutes cancel out.
        RR[$id]+="$(awk -v u="${CUR[ucx]:-FAIL}" -v r="${CUR[rucx]:-FAIL}" 'BEGIN { if (u + 0 > 0 && r + 0 > 0) printf "%.4f", r / u; else print "FAIL" }') "
        CUR=()
    done
done

# Floor rows and ep-cost rows are built after the rounds (see the loop above).
FLOOR_ROWS=()
if want floor && [ "$IN_VM" != 1 ]; then
    for spec in "${FLOOR_SPECS[@]}"; do
        IFS='|' read -r fid kind label args <<<"$spec"
        unit="µs (RTT/2)"; [ "$kind" = bw ] && unit="MB/s"
        prec=3; [ "$kind" = bw ] && prec=2
        p="$(median 3 ${PCT[$fid,floor]:-})"; [ "$kind" = bw ] && p="-"
        FLOOR_ROWS+=("| $label | $unit | $(median $prec ${VAL[$fid,floor]:-}) | $p | $(median 1 ${STL[$fid,floor]:-}) |")
    done
fi

# Endpoint cost: ep-cost (rucx) and ep-cost-ucx, alternating, medians per column. With "ucp",
# UCP endpoints (ucp-ep-cost, ucp-ep-cost-ucx; transports through RUCX_TLS / UCX_TLS), row
# "ucp/<transport>".
EPS_ROWS=()
ep_cost_rows() { # transport device n [ucp]
    local tl=$1 dev=$2 n=$3 ucp=${4:-} round who row label=$1
    [ -n "$ucp" ] && label="ucp/$tl"
    declare -A E
    for round in $(seq 1 "$ROUNDS"); do
        for who in ucx rucx; do
            local bin=$EPCOST; [ "$who" = ucx ] && bin=$EPCOST_UCX
            local cmd=("$bin" -x "$tl" -d "$dev")
            if [ -n "$ucp" ]; then
                bin=$UCPCOST; [ "$who" = ucx ] && bin=$UCPCOST_UCX
                cmd=(env UCX_TLS="$tl" UCX_NET_DEVICES="$dev" RUCX_TLS="$tl" RUCX_NET_DEVICES="$dev" "$bin")
            fi
            [ -x "$bin" ] || continue
            # Two rounds in one process, the second counted: the first also pays for the
            # allocator's own growth (resident pages), which is not the endpoints' cost.
            row=$(timeout -k 5 "$TO" "${cmd[@]}" -n "$n" -r 2 2>>"$LOG" | grep -E "^$who," | tail -1)
            printf '  round %d ep cost %-10s %-5s %s\n' "$round" "$label" "$who" "${row:-FAIL}" >&2
            [ -n "$row" ] || continue
            IFS=, read -r _ _ _ ms heap rss fd <<<"$row"
            E[$who,ms]+="$ms "; E[$who,heap]+="$heap "; E[$who,rss]+="$rss "; E[$who,fd]+="$fd "
        done
    done
    local um rm uh rh
    um=$(median 1 ${E[ucx,ms]:-}); rm=$(median 1 ${E[rucx,ms]:-})
    uh=$(median 0 ${E[ucx,heap]:-}); rh=$(median 0 ${E[rucx,heap]:-})
    EPS_ROWS+=("| $label | $n | $um | $rm | $(ratio "$um" "$rm") | $uh | $rh | $(ratio "$uh" "$rh") | $(median 0 ${E[ucx,rss]:-}) | $(median 0 ${E[rucx,rss]:-}) | $(median 2 ${E[ucx,fd]:-}) / $(median 2 ${E[rucx,fd]:-}) |")
}
# Rounds in which rucx did better than UCX, "k/n": with n rounds, a k near n/2 says parity
# (9 rounds: two equal tools give 2-7 in 96 runs of 100; 0-1 or 8-9 is a difference, sign test).
ahead() { # kind ratios...
    local kind=$1; shift
    printf '%s\n' "$@" | grep -v FAIL | awk -v k="$kind" '
        { n++; if ((k == "lat" && $1 < 1) || (k != "lat" && $1 > 1)) a++ }
        END { if (n) printf "%d/%d", a, n; else print "n/a" }'
}
# Distribution-free confidence interval of the median per-round ratio: the k-th smallest and
# k-th largest of the n rounds, k the largest with 2 P(Binomial(n, 1/2) < k) <= 5% (9 rounds:
# 2nd and 8th, 96%; up to 8 rounds k = 1, the whole range, which is under 95% below 6 rounds).
# Prints "lo-hi side coverage%": side says where the interval lies against `ref` (ahead / parity
# / behind, for rucx), the sign test in words.
# tcp am_lat 8 B against floor case $1 (medians, and per round: rucx over the floor of the same
# round, its CI against 1.10): "rucx/floor UCX/floor p50-rucx/floor p50-UCX/floor CI side".
floor_ratios() {
    local fid=$1 f r p
    f=$(median 6 ${VAL[$fid,floor]:-})
    p=$(median 3 ${PCT[$fid,floor]})
    r=$(paste -d' ' <(printf '%s\n' ${VAL[$fid,floor]}) <(printf '%s\n' ${VAL[tcp_am_lat_8,rucx]}) |
        awk '$1 + 0 > 0 && $2 + 0 > 0 { printf "%.4f ", $2 / $1 }')
    echo "$(ratio "$f" "$(median 6 ${VAL[tcp_am_lat_8,rucx]})") $(ratio "$f" "$(median 6 ${VAL[tcp_am_lat_8,ucx]:-})")" \
        "$(ratio "$p" "$(median 3 ${PCT[tcp_am_lat_8,rucx]})") $(ratio "$p" "$(median 3 ${PCT[tcp_am_lat_8,ucx]:-})")" \
        "$(ci lat 1.10 $r)"
}

ci() { # kind ref ratios...
    local kind=$1 ref=$2; shift 2
    printf '%s\n' "$@" | grep -v FAIL | sort -g | awk -v kind="$kind" -v ref="$ref" '
        { v[++n] = $1 }
        END {
            if (!n) { print "n/a n/a n/a"; exit }
            k = 1; c = 1; tail = 1 / 2 ^ n; cov = 1 - 2 * tail  # c = C(n, j), tail = P(B <= j)
            for (j = 1; j < n / 2; j++) {
                c = c * (n - j + 1) / j; tail += c / 2 ^ n
                if (2 * tail > 0.05) break
                k = j + 1; cov = 1 - 2 * tail
            }
            lo = v[k]; hi = v[n + 1 - k]
            if (kind == "lat") { good = (hi < ref); bad = (lo > ref) } else { good = (lo > ref); bad = (hi < ref) }
            printf "%.2f-%.2f %s %.0f\n", lo, hi, good ? "ahead" : (bad ? "behind" : "parity"), 100 * cov
        }'
}
# The target's verdict on the median per-round ratio (each round's two runs were seconds apart;
# the ratio of the two tools' medians compares different machine speeds when their medians fall
# in different rounds), with the CI's word on the rounds.
verdict() { # kind ratio side
    local met
    met=$(awk -v k="$1" -v r="$2" 'BEGIN { if (r == "n/a") print "n/a"; else if ((k == "lat" && r <= 1) || (k != "lat" && r >= 1)) print "met"; else print "missed" }')
    echo "$met ($3)"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b != "n/a" && a != "n/a") printf "%.2f", b / a; else print "n/a" }'; }
if want eps; then
    if [ "$IN_VM" = 1 ]; then
        ep_cost_rows rc_verbs "$VERBS_DEV" 200
        ep_cost_rows ud_verbs "$VERBS_DEV" 200
        ep_cost_rows rc "$VERBS_DEV" 200 ucp
    else
        ep_cost_rows tcp lo 1000
        ep_cost_rows self memory0 1000
        ep_cost_rows tcp lo 1000 ucp
    fi
fi

# verbs through the VM: one boot, this script inside, its rows taken over.
VERBS_ROWS=()
if [ "$VM_VERBS" = 1 ]; then
    vm_cases=verbs; want ucp && vm_cases+=,ucp; want eps && vm_cases+=,eps; want ofi && vm_cases+=,ofi
    vm_args=(--cases "$vm_cases" --rounds "$ROUNDS" --no-build --timeout "$TO")
    [ "$QUICK" = 1 ] && vm_args+=(--quick)
    # the measured processes in the guest get the same priority and placement as here
    case "$NICE" in 1) vm_args+=(--nice) ;; 2) vm_args+=(--rt) ;; esac
    [ "$PIN" = 1 ] && vm_args+=(--pin)
    echo "running the verbs cases in the soft-RoCE VM (one boot) ..." >&2
    VM_OUT=$(cd "$ROOT" && timeout -k 10 3600 testbed/rxe-vm.sh --smp 4 --timeout 3000 -- \
        env CARGO_TARGET_DIR="$TARGET" bench/compare.sh "${vm_args[@]}" 2>>"$LOG")
    vm_rc=$?
    echo "$VM_OUT" >>"$LOG"
    while IFS= read -r l; do VERBS_ROWS+=("$l"); done < <(echo "$VM_OUT" | grep -E '^\| ((rc|ud)_verbs|ofi verbs)[ ;]')
    while IFS= read -r l; do EPS_ROWS+=("$l"); done < <(echo "$VM_OUT" | grep -E '^\| ((rc|ud)_verbs|ucp/rc) \| ')
    while IFS= read -r l; do note "VM: ${l#- }"; done < <(echo "$VM_OUT" | grep -E '^- ')
    [ ${#VERBS_ROWS[@]} -gt 0 ] || note "verbs cases failed in the VM (exit $vm_rc; see $LOG)"
fi

# ------------------------------------------------------------------ table
TABLE=$(
    echo "| case | unit | UCX $UCX_VERSION | rucx | rucx/UCX | per-round rucx/UCX | per-round CI | rounds rucx ahead | target (rounds) | UCX p50 | rucx p50 | host steal % UCX / rucx |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"
    for c in "${CASE_LIST[@]}"; do
        IFS='|' read -r id mode label kind uargs rargs <<<"$c"
        # Ratios from the unrounded medians; the table shows them rounded.
        u6=$(median 6 ${VAL[$id,ucx]}); r6=$(median 6 ${VAL[$id,rucx]})
        prec=2; [ "$kind" = lat ] && prec=$(lat_prec "$u6")
        u=$(median $prec $u6); r=$(median $prec $r6)
        if [ "$kind" = lat ]; then
            unit="µs (lower is better)"; up=$(median 3 ${PCT[$id,ucx]}); rp=$(median 3 ${PCT[$id,rucx]})
        elif [ "$kind" = mr ]; then
            unit="msg/s (higher is better)"; up="-"; rp="-"; u=$(median 0 $u6); r=$(median 0 $r6)
        else
            unit="MB/s (higher is better)"; up="-"; rp="-"
        fi
        rt=$(ratio "$u6" "$r6"); rr=$(median 6 ${RR[$id]:-}); read -r range side _ <<<"$(ci "$kind" 1 ${RR[$id]:-})"
        stl="$(median 1 ${STL[$id,ucx]:-}) / $(median 1 ${STL[$id,rucx]:-})"; [ "$IN_VM" = 1 ] && stl="-"
        echo "| $label | $unit | $u | $r | $rt | $(median 2 ${RR[$id]:-}) | $range | $(ahead "$kind" ${RR[$id]:-}) | $(verdict "$kind" "$rr" "$side") | $up | $rp | $stl |"
    done
    if [ ${#VERBS_ROWS[@]} -gt 0 ]; then
        printf '%s\n' "${VERBS_ROWS[@]}"
    fi
    # UCP's cost over UCT: ucp_am_lat minus am_lat, 8 B over tcp, per tool: the median of
    # each round's difference (the two ran seconds apart, at the same priority).
    if [ -n "${VAL[ucp_am_lat_8,rucx]:-}" ] && [ -n "${VAL[ucp_uct_am_lat_8,rucx]:-}" ]; then
        cost() {
            local d
            d=$(paste -d' ' <(printf '%s\n' ${VAL[ucp_am_lat_8,$1]:-}) <(printf '%s\n' ${VAL[ucp_uct_am_lat_8,$1]:-}) |
                awk '$1 + 0 > 0 && $2 + 0 > 0 { printf "%.4f\n", $1 - $2 }')
            [ -n "$d" ] && median 3 $d || echo n/a
        }
        echo
        echo "UCP's cost over UCT (ucp_am_lat - am_lat, 8 B, tcp, median of the rounds' differences; target: rucx's <= UCX's and <= 0.05 µs): UCX $(cost ucx) µs, rucx $(cost rucx) µs."
    fi
    if [ ${#FLOOR_ROWS[@]} -gt 0 ]; then
        echo
        echo "| floor (no transport) | unit | median | p50 | host steal % |"
        echo "|---|---|---:|---:|---:|"
        printf '%s\n' "${FLOOR_ROWS[@]}"
        if [ -n "${LINE:-}" ]; then
            one=$(printf '%s\n' $LINE | awk '$1 + 0 > 0 && $1 + 0 < 0.06 { n++ } END { print n + 0 }')
            echo
            echo "vCPU placement (socket-floor line: a cache line between CPUs 0 and 1, one way, per round): median $(median 3 $LINE) µs; rounds with both vCPUs on one die (< 0.06 µs): $one of $(printf '%s\n' $LINE | grep -c .)."
        fi
        fl=$(median 6 ${VAL[floor_lat,floor]:-})
        if [ -n "${VAL[tcp_am_lat_8,rucx]:-}" ] && [ "$fl" != n/a ]; then
            read -r rr ur rp up frange fside _ <<<"$(floor_ratios floor_lat)"
            case "$fside" in ahead) fside="below (met)" ;; behind) fside="above (missed)" ;; parity) fside="contains it" ;; esac
            echo
            echo "tcp am_lat 8 B against the floor (target rucx/floor <= 1.10): rucx/floor $rr, UCX/floor $ur; p50: rucx/floor $rp, UCX/floor $up; per round rucx/floor CI $frange, against 1.10: $fside."
            # The same against the floor with rucx's congestion control on loopback (reno).
            if [ "$(median 6 ${VAL[floor_lat_reno,floor]:-})" != n/a ]; then
                read -r rr ur rp _ frange fside _ <<<"$(floor_ratios floor_lat_reno)"
                case "$fside" in ahead) fside="below" ;; behind) fside="above" ;; parity) fside="contains it" ;; esac
                echo
                echo "The same against the reno floor (rucx's tcp uses reno on loopback, UCX the system's default): rucx/floor $rr, UCX/floor $ur; p50: rucx/floor $rp; per round rucx/floor CI $frange, against 1.10: $fside."
            fi
        fi
    fi
    # Shared memory against its floors: a cache line's one-way trip between the CPUs (the
    # placement probe) and a cache-hot memcpy of the message size.
    if [ -n "${VAL[posix_am_lat_8,rucx]:-}" ] && [ -n "${LINE:-}" ]; then
        sm_floor() { # case floor-values...
            local c=$1; shift
            local f; f=$(median 6 "$@")
            echo "rucx $(ratio "$f" "$(median 6 ${VAL[$c,rucx]:-})"), UCX $(ratio "$f" "$(median 6 ${VAL[$c,ucx]:-})")"
        }
        echo
        echo "Shared memory against its floors (tool/floor, medians): posix am_lat 8 B / cache line one way: $(sm_floor posix_am_lat_8 $LINE); posix am_bw 8000 B / memcpy 8000 B: $(sm_floor posix_am_bw_8000 ${VAL[floor_memcpy_8000,floor]:-}); cma put_bw 1 MiB / memcpy 1 MiB: $(sm_floor cma_put_bw_1m ${VAL[floor_memcpy_1m,floor]:-}); cma get 1 MiB / memcpy 1 MiB: $(sm_floor cma_get_bw_1m ${VAL[floor_memcpy_1m,floor]:-})."
    fi
    if [ ${#EPS_ROWS[@]} -gt 0 ]; then
        echo
        echo "| endpoints (both ends, one process) | eps | UCX connect ms | rucx connect ms | rucx/UCX | UCX heap B/ep | rucx heap B/ep | rucx/UCX | UCX RSS B/ep | rucx RSS B/ep | fds/ep UCX / rucx |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        printf '%s\n' "${EPS_ROWS[@]}"
    fi
    if [ ${#NOTES[@]} -gt 0 ]; then
        echo
        for n in "${NOTES[@]}"; do echo "- $n"; done
    fi
)
MACHINE="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs, $(uname -sr), load avg $(cut -d' ' -f1-3 /proc/loadavg)"
HEAD="Run $(date -u '+%Y-%m-%d %H:%M UTC') on: $MACHINE; $(rustc --version 2>/dev/null); $ROUNDS rounds per case, medians; latency = overall average (RTT/2), bandwidth = overall MB/s (MiB/s); per-round rucx/UCX = median of each round's ratio; per-round CI = a distribution-free $(ci bw 1 $(seq 1 "$ROUNDS") | cut -d' ' -f3)% confidence interval of that median (order statistics of the rounds' ratios); target = met or missed by the per-round rucx/UCX, with where the CI lies against 1.0 (ahead, parity: contains 1.0, behind); host steal = median share of all CPUs' time the hypervisor took during each tool's runs$([ "$NICE" = 2 ] && echo "; measured processes SCHED_FIFO (--rt)")."
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
rm -f "$PORT_FILE"
echo "(log of stderr: $LOG)" >&2
