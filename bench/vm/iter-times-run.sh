#!/usr/bin/env bash
# iter-times-run.sh - interleaved rc_verbs am_lat ping-pongs of ucx_perftest and one or more
# rucx builds, every process under bench/vm/iter-times.c, for bench/vm/iter-times.py. Runs inside
# the soft-RoCE VM (server on CPU 0, client on CPU 1), e.g.:
#   gcc -O2 -shared -fPIC -o /tmp/it/iter-times.so bench/vm/iter-times.c -ldl
#   testbed/rxe-vm.sh --smp 2 --rw /tmp/it -- bench/vm/iter-times-run.sh /tmp/it/iter-times.so \
#       /tmp/it/out 8 new=target/release old=/tmp/it/old
#   bench/vm/iter-times.py pct /tmp/it/out
# Each NAME=DIR is a rucx build: DIR holds rucx-perftest and the transport plugins (build both:
# `cargo build --release -p uct-ib -p rucx-tools`; a build at the workspace root leaves
# libuct_ib.so as it was).
# A diagnostic tool, not part of the test suite (bench/README.md).
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,12p' "$0"; exit 2; }
SHIM=$(realpath "$1"); OUT=$2; ROUNDS=$3; shift 3
mkdir -p "$OUT"
export UCX_IB_GID_INDEX=0 RUCX_IB_GID_INDEX=0 ITER_TIMES_DIR=$(realpath "$OUT")
# $ITER_TIMES_ARGS: the perftest options (default: rc_verbs am_lat 8 B, 15000 iterations)
read -r -a ARGS <<<"${ITER_TIMES_ARGS:--t am_lat -x rc_verbs -d rxe0:1 -s 8 -n 15000}"
port=20000
run() { # NAME ROUND TOOL [ENV...]
    local name=$1 r=$2 tool=$3; shift 3
    port=$((port + 1))
    env "$@" ITER_TIMES_TAG="$name.$r.srv" LD_PRELOAD="$SHIM" taskset -c 0 "$tool" -p $port >/dev/null 2>&1 &
    local s=$!
    for _ in $(seq 100); do ss -ltnH "sport = :$port" | grep -q . && break; sleep 0.05; done
    local out
    out=$(env "$@" ITER_TIMES_TAG="$name.$r.cli" LD_PRELOAD="$SHIM" taskset -c 1 "$tool" 127.0.0.1 -p $port "${ARGS[@]}" -f -v 2>/dev/null | tail -1)
    wait $s || true
    echo "$name,$r,$out"
}
# The order rotates from round to round: a run's place in its round must not decide its speed.
TOOLS=(ucx "$@")
for r in $(seq 1 "$ROUNDS"); do
    for i in $(seq 0 $((${#TOOLS[@]} - 1))); do
        v=${TOOLS[$(((i + r) % ${#TOOLS[@]}))]}
        if [ "$v" = ucx ]; then
            run ucx "$r" ucx_perftest
        else
            dir=$(realpath "${v#*=}")
            run "${v%%=*}" "$r" "$dir/rucx-perftest" RUCX_MODULE_DIR="$dir"
        fi
    done
done
