#!/usr/bin/env bash
# netns-client-server.sh - ucp_client_server between two "hosts": two network namespaces joined
# by a veth pair (192.0.2.1/24 and 192.0.2.2/24, the TEST-NET-1 documentation range), over tcp.
#
# Usage (as root): scripts/netns-client-server.sh [--no-build] [--bin DIR] [--keep-logs]
#   --no-build    use the example already built (default: cargo build it first)
#   --bin D       where ucp_client_server is (default: ${CARGO_TARGET_DIR:-target}/debug/examples)
#   --keep-logs   keep the per-run logs (their folder is printed)
#
# Tests, for each -c mode (stream, tag, am): the server in one namespace, the client in the
# other, with small messages and with messages above the rendezvous threshold; then long
# transfers (each mode; tag and am also mid-rendezvous) whose link is cut mid-way (the server's end of the veth set down: packets stop, no
# connection is closed), which must end both sides within a bounded time with exit status 1
# and the failure named on stderr (keepalive's EndpointTimeout or a transport error), not a
# hang. Every process runs under a deadline; the namespaces are removed on exit.
# Prints "N passed, N failed" and exits 1 if anything failed (2: cannot set up).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=1
KEEP=0
BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    --bin) BIN="$2"; shift ;;
    --keep-logs) KEEP=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" != 0 ]; then
  echo "netns-client-server.sh needs root (ip netns, veth)" >&2
  exit 2
fi
command -v ip >/dev/null || { echo "needs iproute2 (ip)" >&2; exit 2; }

[ -n "$BIN" ] || BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/examples
if [ "$BUILD" = 1 ]; then
  echo "== building ucp_client_server"
  (cd "$ROOT" && timeout 1800 cargo build -q -p rucx --example ucp_client_server) || {
    echo "build failed" >&2; exit 2; }
fi
CS=$BIN/ucp_client_server
[ -x "$CS" ] || { echo "$CS is not built" >&2; exit 2; }

# Interface names are at most 15 characters; both ends get the same name in their namespace
# (as two hosts' eth0 would), so one RUCX_NET_DEVICES serves both sides.
TAG=$$
NS_A=rucx-csa-$TAG
NS_B=rucx-csb-$TAG
DEV=rcs$TAG
IP_A=192.0.2.1
IP_B=192.0.2.2
LOG=$(mktemp -d /tmp/rucx-netns-cs.XXXXXX)
PIDS=()
PASS=0
FAIL=0

# Ends what runs in the namespaces (the examples under `timeout`, which would outlive a
# killed `timeout`), then the namespaces.
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for ns in "$NS_A" "$NS_B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
  ip link del "rca$TAG" 2>/dev/null
  if [ "$KEEP" = 1 ]; then echo "logs kept in $LOG"; else rm -rf "$LOG"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pass() { echo "PASS: $*"; PASS=$((PASS + 1)); }
fail() { echo "FAIL: $*"; FAIL=$((FAIL + 1)); }
show() { echo "---- $1"; tail -n 15 "$1" | sed 's/^/    /'; }
in_a() { ip netns exec "$NS_A" "$@"; }
in_b() { ip netns exec "$NS_B" "$@"; }

# Waits up to $2 seconds for file $1 to have $4 (default 1) lines matching $3; gives up early
# when the optional process $5 has exited.
wait_lines() {
  local i n=${4:-1}
  count() { local c; c=$(grep -ac -- "$3" "$1" 2>/dev/null); [ "${c:-0}" -ge "$n" ]; }
  for ((i = 0; i < $2 * 10; i++)); do
    count "$@" && return 0
    [ -n "${5:-}" ] && ! kill -0 "$5" 2>/dev/null && break
    sleep 0.1
  done
  count "$@"
}

# Stops background pids "$@" (`timeout` passes TERM on to the example it runs).
stop() {
  kill -TERM "$@" 2>/dev/null
  sleep 0.5
  kill -KILL "$@" 2>/dev/null
  wait "$@" 2>/dev/null
}

# Exit status of background pid $1, waiting at most $2 seconds (then stopped: 124).
reap() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if ! kill -0 "$1" 2>/dev/null; then wait "$1"; return $?; fi
    sleep 0.1
  done
  stop "$1"
  return 124
}

echo "== setting up $NS_A ($DEV $IP_A) <-> $NS_B ($DEV $IP_B)"
ip netns add "$NS_A" && ip netns add "$NS_B" &&
  ip link add "rca$TAG" type veth peer name "rcb$TAG" &&
  ip link set "rca$TAG" netns "$NS_A" && ip link set "rcb$TAG" netns "$NS_B" &&
  in_a ip link set "rca$TAG" name "$DEV" && in_b ip link set "rcb$TAG" name "$DEV" &&
  in_a ip addr add "$IP_A/24" dev "$DEV" && in_b ip addr add "$IP_B/24" dev "$DEV" &&
  in_a ip link set lo up && in_b ip link set lo up || { echo "cannot create the namespaces/veth pair" >&2; exit 2; }

# Brings both ends up and waits until they are; forgets the neighbours a cut left unreachable.
link_up() {
  in_a ip link set "$DEV" up && in_b ip link set "$DEV" up || return 1
  in_a ip neigh flush dev "$DEV" 2>/dev/null
  in_b ip neigh flush dev "$DEV" 2>/dev/null
  for _ in $(seq 50); do
    in_a ip -br link show "$DEV" | grep -q "LOWER_UP" && in_b ip -br link show "$DEV" | grep -q "LOWER_UP" && break
    sleep 0.1
  done
  command -v ping >/dev/null || return 0
  for _ in $(seq 10); do
    in_b ping -c 1 -W 1 "$IP_A" >/dev/null 2>&1 && return 0
  done
  return 1
}
link_up || { echo "the veth pair does not come up" >&2; exit 2; }

export RUCX_TLS=tcp RUCX_NET_DEVICES=$DEV
# The example's default keepalive (1 s, three missed intervals) is what ends a cut link's
# peers; the transport's own TCP keepalive is left at its default.
unset RUCX_KEEPALIVE_INTERVAL

# Starts a server in A (port $1, then the example's options); sets SPID; its output goes to
# $LOG/$name-server{,.err}.
start_server() {
  local name=$1; shift
  in_a timeout 120 "$CS" -l "$IP_A" --once "$@" >"$LOG/$name-server" 2>"$LOG/$name-server.err" &
  SPID=$!
  PIDS+=($SPID)
  wait_lines "$LOG/$name-server" 10 "waiting for a connection" 1 $SPID
}

port=24400
# ---------------------------------------------------------------- transfers
for mode in stream tag am; do
  for run in "-i 2000 -s 16" "-i 20 -s 1000000"; do
    port=$((port + 1))
    name="$mode-${run// /}"
    desc="ucp_client_server -c $mode $run ($NS_B -> $NS_A)"
    # shellcheck disable=SC2086
    if ! RUCX_RNDV_THRESH=65536 start_server "$name" -p $port -c $mode $run; then
      fail "$desc: the server did not start"; show "$LOG/$name-server.err"; stop $SPID; continue
    fi
    # shellcheck disable=SC2086
    RUCX_RNDV_THRESH=65536 in_b timeout 120 "$CS" -a "$IP_A" -p $port -c $mode $run \
      >"$LOG/$name-client" 2>&1
    crc=$?
    reap $SPID 60
    src=$?
    if [ $src = 0 ] && [ $crc = 0 ] && grep -q "all intact" "$LOG/$name-server"; then
      pass "$desc: $(grep -o '([a-z ]*)' "$LOG/$name-client" | head -1 | tr -d '()')"
    else
      fail "$desc: server exit $src, client exit $crc"
      show "$LOG/$name-server"; show "$LOG/$name-server.err"; show "$LOG/$name-client"
    fi
  done
done

# ---------------------------------------------------------------- link cut mid-transfer
# Exit status 1 with a UCS_ERR_* on stderr: the failure was detected and reported; 124: hung.
verdict() {
  case $1 in
    1) grep -o 'UCS_ERR_[A-Z_]*' "$2" | tail -1 | grep . || echo "exit 1 without a named failure" ;;
    124) echo "HUNG (killed after the deadline)" ;;
    *) echo "exit $1" ;;
  esac
}
# Each -c mode with eager messages, and tag and am mid-rendezvous.
for cut in "stream 4096" "tag 4096" "am 4096" "tag 200000" "am 200000"; do
  read -r mode size <<<"$cut"
  port=$((port + 1))
  name="cut-$mode-$size"
  desc="link cut mid-transfer -c $mode -s $size"
  if ! link_up; then fail "$desc: the link does not come back up"; continue; fi
  export RUCX_RNDV_THRESH=65536
  if ! start_server "$name" -p $port -c $mode -i 1000000000 -s $size; then
    fail "$desc: the server did not start"; show "$LOG/$name-server.err"; stop $SPID; continue
  fi
  in_b timeout 120 "$CS" -a "$IP_A" -p $port -c $mode -i 1000000000 -s $size \
    >"$LOG/$name-client" 2>"$LOG/$name-client.err" &
  CPID=$!
  PIDS+=($CPID)
  unset RUCX_RNDV_THRESH
  # The server's second progress line (2000 messages in; rendezvous: its first, and a second
  # more) says the transfer is on; the client's first one names the protocol.
  lines=2
  [ "$size" -ge 65536 ] && lines=1
  if wait_lines "$LOG/$name-server" 60 "received $size bytes" $lines $SPID; then
    [ $lines = 1 ] && sleep 1
  else
    fail "$desc: the transfer did not get going"
    show "$LOG/$name-server"; show "$LOG/$name-server.err"; show "$LOG/$name-client.err"
    stop $SPID $CPID
    continue
  fi
  proto=$(grep -o '([a-z ]*)' "$LOG/$name-client" | head -1 | tr -d '()')
  in_a ip link set "$DEV" down
  t0=$SECONDS
  reap $CPID 30
  crc=$?
  reap $SPID 30
  src=$?
  vc=$(verdict $crc "$LOG/$name-client.err")
  vs=$(verdict $src "$LOG/$name-server.err")
  took=$((SECONDS - t0))
  if [ $crc = 1 ] && [ $src = 1 ] && grep -q UCS_ERR_ "$LOG/$name-client.err" && grep -q UCS_ERR_ "$LOG/$name-server.err"; then
    pass "$desc ($proto): client: $vc; server: $vs (both within ${took}s)"
  else
    fail "$desc ($proto): client: $vc; server: $vs"
    show "$LOG/$name-server.err"; show "$LOG/$name-client.err"
  fi
done

echo
echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
