#!/usr/bin/env bash
# ib-hello.sh - uct_hello_world over rc_verbs: server and client in two processes inside one
# Soft-RoCE VM boot, with -i (am_short), -b (am_bcopy) and -z (am_zcopy).
#
# Usage: testbed/ib-hello.sh [--no-build] [--timeout S] [-t TL] [-d DEV]
#   --no-build   use what is already built in ${CARGO_TARGET_DIR:-target}/debug
#   --timeout S  VM time limit (default 600)
#   -t TL -d DEV transport and device (default rc_verbs on rxe0:1)
#
# Builds on the host first (cargo build -p uct-ib-plugin: libuct_ib.so; cargo build -p rucx
# --example uct_hello_world), then boots testbed/rxe-vm.sh once and runs every flavour there with
# RUCX_MODULE_DIR pointing at the plugin. The example connects endpoint to endpoint because
# rc_verbs has no CONNECT_TO_IFACE; the out-of-band TCP exchange goes over the VM's veth
# (192.0.2.1). Prints "N passed, N failed"; exit 0 when all passed, 1 otherwise, 124/125 as
# rxe-vm.sh (timeout / VM failure), 2 on a build or usage error.
set -u -o pipefail

TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$TB_DIR/.." && pwd -P)
TL=rc_verbs
DEV=rxe0:1
BUILD=1
TIMEOUT=600
IN_VM=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --timeout) TIMEOUT=$2; shift ;;
    -t) TL=$2; shift ;;
    -d) DEV=$2; shift ;;
    --in-vm) IN_VM=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "ib-hello.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
HW=$TARGET/debug/examples/uct_hello_world

if [ "$IN_VM" = 1 ]; then
  # ---------------------------------------------------------------- inside the VM
  export RUCX_MODULE_DIR=$TARGET/debug
  LOG=$(mktemp -d /tmp/ib-hello.XXXXXX)
  PASS=0
  FAIL=0
  port=23500
  for flavour in -i -b -z; do
    case $flavour in -i) size=64 ;; *) size=4000 ;; esac
    [ "$TL" = ud_verbs ] && [ "$size" -gt 1000 ] && size=1000 # ud: one packet (rxe MTU 1024)
    port=$((port + 1))
    name="uct_hello_world -t $TL -d $DEV $flavour -s $size"
    timeout 90 "$HW" -t "$TL" -d "$DEV" -p $port $flavour -s $size -T 60 >"$LOG/server$flavour" 2>&1 &
    spid=$!
    for _ in $(seq 300); do
      grep -q "waiting for a client" "$LOG/server$flavour" 2>/dev/null && break
      kill -0 $spid 2>/dev/null || break
      sleep 0.1
    done
    timeout 90 "$HW" -t "$TL" -d "$DEV" -n 192.0.2.1 -p $port $flavour -s $size -T 60 >"$LOG/client$flavour" 2>&1
    crc=$?
    wait $spid
    src=$?
    if [ $src = 0 ] && [ $crc = 0 ] && grep -q "(intact)" "$LOG/server$flavour"; then
      echo "PASS: $name"
      PASS=$((PASS + 1))
    else
      echo "FAIL: $name: server exit $src, client exit $crc"
      for f in server client; do
        echo "---- $f"
        tail -n 25 "$LOG/$f$flavour" | sed 's/^/    /'
      done
      FAIL=$((FAIL + 1))
    fi
  done
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" = 0 ]
  exit $?
fi

# ---------------------------------------------------------------- on the host
if [ "$BUILD" = 1 ]; then
  echo "== building libuct_ib.so and uct_hello_world (target $TARGET)"
  (cd "$ROOT" && cargo build -q -p uct-ib-plugin && cargo build -q -p rucx --example uct_hello_world) || {
    echo "ib-hello.sh: build failed" >&2
    exit 2
  }
fi
[ -x "$HW" ] || { echo "ib-hello.sh: $HW not built (drop --no-build)" >&2; exit 2; }
[ -f "$TARGET/debug/libuct_ib.so" ] || { echo "ib-hello.sh: $TARGET/debug/libuct_ib.so not built" >&2; exit 2; }
cd "$ROOT" || exit 2
CARGO_TARGET_DIR=$TARGET bash "$TB_DIR/rxe-vm.sh" --timeout "$TIMEOUT" --timing -- \
  bash "$TB_DIR/ib-hello.sh" --in-vm -t "$TL" -d "$DEV"
