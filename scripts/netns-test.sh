#!/usr/bin/env bash
# netns-test.sh - rucx over tcp between two "hosts": two network namespaces joined by a veth pair
# (192.0.2.1/24 and 192.0.2.2/24, the TEST-NET-1 documentation range).
#
# Usage (as root): scripts/netns-test.sh [--no-build] [--bin-dir DIR] [--keep-logs]
#   --no-build    use the binaries already built (default: cargo build them first)
#   --bin-dir D   where uct_hello_world, tcp_peer and rucx-perftest are
#                 (default: ${CARGO_TARGET_DIR:-target}/debug and its examples/)
#   --keep-logs   keep the per-test logs (their folder is printed)
#
# Tests: uct_hello_world server in one namespace, client in the other, with -i, -b and -z
# (tcp, and ofi's tcp;ofi_rxm when libuct_ofi.so is built);
# a verified bulk stream (examples/tcp_peer); rucx-perftest am_bw / put_bw when built; and the
# link cut in the middle of a stream, which must end both sides with an error reported by the
# transport (error handler or failed send) - not a hang, and not only the peers' own idle
# timeout. Every command runs under `timeout`; the namespaces and veth are removed on exit.
# Prints "N passed, N failed" and exits 1 if anything failed (2: cannot set up).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=1
KEEP=0
BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --bin-dir) BIN="$2"; shift ;;
    --keep-logs) KEEP=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" != 0 ]; then
  echo "netns-test.sh needs root (ip netns, veth)" >&2
  exit 2
fi
command -v ip >/dev/null || { echo "needs iproute2 (ip)" >&2; exit 2; }

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[ -n "$BIN" ] || BIN=$TARGET/debug
if [ "$BUILD" = 1 ]; then
  echo "== building uct_hello_world, tcp_peer, rucx-perftest"
  (cd "$ROOT" && timeout 1800 cargo build -q -p rucx --example uct_hello_world --example tcp_peer) || {
    echo "build failed" >&2; exit 2; }
  (cd "$ROOT" && timeout 1800 cargo build -q -p rucx-tools --bin rucx-perftest) || echo "note: rucx-perftest did not build; its tests are skipped"
fi
find_bin() { for d in "$BIN" "$BIN/examples"; do [ -x "$d/$1" ] && { echo "$d/$1"; return 0; }; done; return 1; }
HW=$(find_bin uct_hello_world) || { echo "uct_hello_world not found in $BIN" >&2; exit 2; }
PEER=$(find_bin tcp_peer) || { echo "tcp_peer not found in $BIN" >&2; exit 2; }
PERF=$(find_bin rucx-perftest) || PERF=""
# Transport plugins built beside the binaries (used when tcp is not built in).
export RUCX_MODULE_DIR="$BIN:$BIN/deps${RUCX_MODULE_DIR:+:$RUCX_MODULE_DIR}"

# Unique names (interface names are at most 15 characters). Both ends get the same name inside
# their namespaces (as two hosts' eth0 would), because rucx-perftest's server uses the device
# name the client sends it.
TAG=$$
NS_A=rucx-a-$TAG
NS_B=rucx-b-$TAG
DEV=rxv$TAG
VA=$DEV
VB=$DEV
IP_A=192.0.2.1
IP_B=192.0.2.2
LOG=$(mktemp -d /tmp/rucx-netns.XXXXXX)
PIDS=()
PASS=0
FAIL=0
SKIP=0

cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # What runs inside (a `timeout` wrapper's child outlives its SIGKILL) goes too.
  for ns in "$NS_A" "$NS_B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip link del "rxa$TAG" 2>/dev/null
  if [ "$KEEP" = 1 ]; then echo "logs kept in $LOG"; else rm -rf "$LOG"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS: $*"; PASS=$((PASS + 1)); }
fail() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }
skip() { echo "SKIP: $*"; SKIP=$((SKIP + 1)); }
show() { echo "---- $1"; tail -n 25 "$1" | sed 's/^/    /'; }
in_a() { ip netns exec "$NS_A" "$@"; }
in_b() { ip netns exec "$NS_B" "$@"; }

# Waits up to $2 seconds for file $1 to contain a line matching $3 (gives up early when the
# optional process $4 has exited).
wait_for() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    grep -q -- "$3" "$1" 2>/dev/null && return 0
    [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null && { grep -q -- "$3" "$1" 2>/dev/null; return $?; }
    sleep 0.1
  done
  return 1
}

# Waits up to $2 seconds for file $1 to contain $4 lines matching $3.
wait_lines() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ "$(grep -c -- "$3" "$1" 2>/dev/null)" -ge "$4" ] && return 0
    sleep 0.1
  done
  return 1
}

# Exit status of background pid $1, waiting at most $2 seconds (then killed: 124).
reap() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if ! kill -0 "$1" 2>/dev/null; then wait "$1"; return $?; fi
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
  return 124
}

echo "== setting up $NS_A ($DEV $IP_A) <-> $NS_B ($DEV $IP_B)"
setup() {
  ip netns add "$NS_A" && ip netns add "$NS_B" &&
    ip link add "rxa$TAG" type veth peer name "rxb$TAG" &&
    ip link set "rxa$TAG" netns "$NS_A" && ip link set "rxb$TAG" netns "$NS_B" &&
    in_a ip link set "rxa$TAG" name "$DEV" && in_b ip link set "rxb$TAG" name "$DEV" &&
    in_a ip addr add "$IP_A/24" dev "$VA" && in_b ip addr add "$IP_B/24" dev "$VB" &&
    in_a ip link set lo up && in_b ip link set lo up &&
    in_a ip link set "$VA" up && in_b ip link set "$VB" up
}
setup || { echo "cannot create the namespaces/veth pair" >&2; exit 2; }
# Wait for the link (and duplicate address detection) to settle.
for _ in $(seq 50); do
  in_a ip -br addr show "$VA" | grep -q "UP" && in_b ip -br addr show "$VB" | grep -q "UP" && break
  sleep 0.1
done
if command -v ping >/dev/null; then
  timeout 10 ip netns exec "$NS_B" ping -c 1 -W 5 "$IP_A" >/dev/null && echo "ping $IP_B -> $IP_A ok" ||
    echo "note: ping $IP_B -> $IP_A failed"
fi

# Faster dead-peer detection for the link-cut test (keepalive 2 s + 3 x 1 s; TCP_USER_TIMEOUT
# follows them by default).
export RUCX_TCP_KEEPIDLE=2s RUCX_TCP_KEEPINTVL=1s RUCX_TCP_KEEPCNT=3

# ---------------------------------------------------------------- uct_hello_world
port=23400
for flavour in -i -b -z; do
  case $flavour in -i) size=64 ;; *) size=4000 ;; esac
  port=$((port + 1))
  name="uct_hello_world $flavour -s $size ($NS_B -> $NS_A)"
  in_a timeout 60 "$HW" -t tcp -d "$VA" -p $port $flavour -s $size -T 30 >"$LOG/hw-server$flavour" 2>&1 &
  spid=$!
  PIDS+=($spid)
  wait_for "$LOG/hw-server$flavour" 10 "waiting for a client" $spid || sleep 1
  in_b timeout 60 "$HW" -t tcp -d "$VB" -n "$IP_A" -p $port $flavour -s $size -T 30 >"$LOG/hw-client$flavour" 2>&1
  crc=$?
  reap $spid 60
  src=$?
  if [ $src = 0 ] && [ $crc = 0 ] && grep -q "(intact)" "$LOG/hw-server$flavour"; then
    pass "$name"
  else
    fail "$name: server exit $src, client exit $crc"
    show "$LOG/hw-server$flavour"
    show "$LOG/hw-client$flavour"
  fi
done

# ---------------------------------------------------------------- uct_hello_world over ofi
# The ofi transport (plugin libuct_ofi.so, libfabric's tcp;ofi_rxm) across the namespaces; skipped
# when the plugin was not built (cargo build -p uct-ofi-plugin).
if [ -f "$BIN/libuct_ofi.so" ]; then
  for flavour in -i -b -z; do
    case $flavour in -i) size=40 ;; *) size=4000 ;; esac
    port=$((port + 1))
    name="uct_hello_world ofi tcp;ofi_rxm $flavour -s $size ($NS_B -> $NS_A)"
    in_a env RUCX_MODULE_DIR="$BIN" timeout 60 "$HW" -t ofi -d "tcp;ofi_rxm/$VA" -p $port $flavour -s $size -T 30 \
      >"$LOG/ofi-server$flavour" 2>&1 &
    spid=$!
    PIDS+=($spid)
    wait_for "$LOG/ofi-server$flavour" 10 "waiting for a client" $spid || sleep 1
    in_b env RUCX_MODULE_DIR="$BIN" timeout 60 "$HW" -t ofi -d "tcp;ofi_rxm/$VB" -n "$IP_A" -p $port $flavour -s $size \
      -T 30 >"$LOG/ofi-client$flavour" 2>&1
    crc=$?
    reap $spid 60
    src=$?
    if [ $src = 0 ] && [ $crc = 0 ] && grep -q "(intact)" "$LOG/ofi-server$flavour"; then
      pass "$name"
    else
      fail "$name: server exit $src, client exit $crc"
      show "$LOG/ofi-server$flavour"
      show "$LOG/ofi-client$flavour"
    fi
  done
else
  skip "uct_hello_world over ofi: $BIN/libuct_ofi.so not built (cargo build -p uct-ofi-plugin)"
fi

# ---------------------------------------------------------------- bulk stream (tcp_peer)
# Starts a tcp_peer receiver in A; sets RX_PID; its address goes to $LOG/$1.addr.
start_receiver() {
  rm -f "$LOG/$1.addr"
  in_a timeout 150 "$PEER" --dev "$VA" --expect-end 1 --idle-timeout 60 --lifetime 140 \
    --report-every 2000 --addr-file "$LOG/$1.addr" >"$LOG/$1-rx" 2>&1 &
  RX_PID=$!
  PIDS+=($RX_PID)
  wait_for "$LOG/$1.addr" 20 ":" $RX_PID
}

N=20000
if start_receiver bulk; then
  in_b timeout 150 "$PEER" --dev "$VB" --connect "$(cat "$LOG/bulk.addr")" --hello --send $N --idle-timeout 60 \
    --lifetime 140 >"$LOG/bulk-tx" 2>&1
  trc=$?
  reap $RX_PID 60
  rrc=$?
  if [ $trc = 0 ] && [ $rrc = 0 ] && grep -q "RUCXPEER received $N" "$LOG/bulk-rx"; then
    pass "bulk stream of $N verified messages (am_short/bcopy/zcopy mix) $NS_B -> $NS_A"
  else
    fail "bulk stream: sender exit $trc, receiver exit $rrc"
    show "$LOG/bulk-tx"
    show "$LOG/bulk-rx"
  fi
else
  fail "bulk stream: the receiver printed no address"
  show "$LOG/bulk-rx"
fi

# ---------------------------------------------------------------- rucx-perftest
if [ -n "$PERF" ]; then
  for t in "am_bw -D bcopy -s 4096 -n 20000" "put_bw -D zcopy -s 65536 -n 2000"; do
    port=$((port + 1))
    in_a timeout 90 "$PERF" -x tcp -d "$VA" -p $port >"$LOG/perf-server" 2>&1 &
    spid=$!
    PIDS+=($spid)
    sleep 1
    # shellcheck disable=SC2086
    in_b timeout 90 "$PERF" "$IP_A" -x tcp -d "$VB" -p $port -t $t >"$LOG/perf-client" 2>&1
    crc=$?
    reap $spid 30
    src=$?
    if [ $crc = 0 ] && [ $src = 0 ]; then
      pass "rucx-perftest -t $t"
    else
      fail "rucx-perftest -t $t: server exit $src, client exit $crc"
      show "$LOG/perf-server"
      show "$LOG/perf-client"
    fi
  done
else
  skip "rucx-perftest not built"
fi

# ---------------------------------------------------------------- link cut mid-stream (last)
# Exit codes of tcp_peer: 3 error handler fired, 8 a send failed (both: the transport noticed);
# 4 only the peer's own idle timeout ended it (the transport did not notice).
if start_receiver cut; then
  in_b timeout 150 "$PEER" --dev "$VB" --connect "$(cat "$LOG/cut.addr")" --hello --send inf --idle-timeout 60 \
    --lifetime 140 --report-every 2000 >"$LOG/cut-tx" 2>&1 &
  TX_PID=$!
  PIDS+=($TX_PID)
  # Two progress lines from the receiver: at least 4000 messages arrived, the stream is on.
  if wait_for "$LOG/cut-rx" 30 "progress sent=0 received=" && wait_lines "$LOG/cut-rx" 30 "RUCXPEER progress" 2; then
    echo "cutting the link (deleting the veth pair) mid-stream"
    in_a ip link del "$VA"
    reap $TX_PID 90
    trc=$?
    reap $RX_PID 90
    rrc=$?
    verdict() {
      case $1 in
        3) echo "error handler: $(grep -o 'RUCXPEER error.*' "$2" | head -1)" ;;
        8) echo "send failed: $(grep -o 'RUCXPEER send-error.*' "$2" | head -1)" ;;
        4) echo "NOT detected by the transport (the peer's 60 s idle timeout ended it)" ;;
        124) echo "HUNG (killed by timeout)" ;;
        *) echo "exit $1" ;;
      esac
    }
    vt=$(verdict $trc "$LOG/cut-tx")
    vr=$(verdict $rrc "$LOG/cut-rx")
    if [[ $trc =~ ^(3|8)$ ]] && [[ $rrc =~ ^(3|8)$ ]]; then
      pass "link cut: sender: $vt; receiver: $vr"
    else
      fail "link cut: sender: $vt; receiver: $vr"
      show "$LOG/cut-tx"
      show "$LOG/cut-rx"
    fi
  else
    fail "link cut: the stream did not get going"
    show "$LOG/cut-tx"
    show "$LOG/cut-rx"
  fi
else
  fail "link cut: the receiver printed no address"
  show "$LOG/cut-rx"
fi

echo
echo "$PASS passed, $FAIL failed"
[ "$SKIP" = 0 ] || echo "($SKIP skipped)"
[ "$FAIL" = 0 ]
