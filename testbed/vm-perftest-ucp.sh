#!/usr/bin/env bash
# vm-perftest-ucp.sh - rucx-perftest's UCP tests over rc_verbs and ud_verbs, inside one
# Soft-RoCE VM boot: each test as two threads with their own workers (-L), a few iterations
# (correctness of the tool, not timing). ud_verbs has no RMA or atomics: those tests must be
# refused there with a message (exit 255), not run.
#
# Usage: testbed/vm-perftest-ucp.sh [--no-build] [--debug] [--timeout S]
# (release build by default: it runs 2.5x faster under TCG; --debug uses the debug profile)
# Prints "N passed, N failed"; exit 0 when all passed, 1 otherwise, 124/125 as rxe-vm.sh, 2 on
# a build or usage error.
set -u -o pipefail

TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$TB_DIR/.." && pwd -P)
BUILD=1
TIMEOUT=900
IN_VM=0
PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --timeout) TIMEOUT=$2; shift ;;
    --in-vm) IN_VM=1 ;;
    --debug) PROFILE=debug ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "vm-perftest-ucp.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
PT=$TARGET/$PROFILE/rucx-perftest

if [ "$IN_VM" = 1 ]; then
  export RUCX_MODULE_DIR=$TARGET/$PROFILE RUCX_NET_DEVICES=rxe0:1 RUCX_LOG_LEVEL=warn
  PASS=0
  FAIL=0
  run() { # tls expect(ok|refused) test size
    local tls=$1 expect=$2 t=$3 s=$4 out rc
    out=$(RUCX_TLS=$tls timeout 120 "$PT" -L -t "$t" -s "$s" -n 20 -w 4 2>&1)
    rc=$?
    if { [ "$expect" = ok ] && [ $rc = 0 ] && echo "$out" | grep -q "^Final: *20 "; } ||
       { [ "$expect" = refused ] && [ $rc = 255 ] && echo "$out" | grep -qi "unsupported\|no .*lane\|not supported"; }; then
      echo "PASS: RUCX_TLS=$tls $t -s $s ($expect)"
      PASS=$((PASS + 1))
    else
      echo "FAIL: RUCX_TLS=$tls $t -s $s: exit $rc, expected $expect"
      echo "$out" | tail -n 15 | sed 's/^/    /'
      FAIL=$((FAIL + 1))
    fi
  }
  for tls in rc ud; do
    for t in tag_lat tag_bw tag_sync_lat tag_sync_bw ucp_am_lat ucp_am_bw stream_lat stream_bw; do
      for s in 8 300000; do run $tls ok $t $s; done
    done
    rma=ok; [ $tls = ud ] && rma=refused
    for t in ucp_put_lat ucp_put_bw ucp_get; do run $tls $rma $t 65536; done
    for t in ucp_add ucp_fadd ucp_swap ucp_cswap; do run $tls $rma $t 8; done
  done
  echo "$PASS passed, $FAIL failed"
  [ "$FAIL" = 0 ]
  exit $?
fi

if [ "$BUILD" = 1 ]; then
  echo "== building libuct_ib.so and rucx-perftest (target $TARGET)"
  FLAG=(); [ "$PROFILE" = release ] && FLAG=(--release)
  (cd "$ROOT" && cargo build -q "${FLAG[@]}" -p uct-ib-plugin -p rucx-tools --bin rucx-perftest) || {
    echo "vm-perftest-ucp.sh: build failed" >&2
    exit 2
  }
fi
[ -x "$PT" ] || { echo "vm-perftest-ucp.sh: $PT not built (drop --no-build)" >&2; exit 2; }
cd "$ROOT" || exit 2
CARGO_TARGET_DIR=$TARGET bash "$TB_DIR/rxe-vm.sh" --timeout "$TIMEOUT" -- \
  bash "$TB_DIR/vm-perftest-ucp.sh" --in-vm $([ "$PROFILE" = debug ] && echo --debug)
