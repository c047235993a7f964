#!/usr/bin/env bash
# vm-conformance.sh - the transport-parametrized suites (tests/conformance for uct, tests/ucp
# for ucp) on the verbs transports, through the ib plugin, inside one Soft-RoCE VM boot.
#
# Usage: testbed/vm-conformance.sh [--debug] [--timeout S] [FILTER]   (default filter: verbs)
# Builds the plugins (libuct_ib.so among them: a target whose module is missing fails) and both
# test binaries on the host, then runs each in the VM with RUCX_MODULE_DIR pointing at the
# plugins. Release builds by default: under TCG a debug build runs the same suite 2.5x slower
# (--debug builds and runs the debug profile). Exit status: 0 when both passed, 1 when either failed (124/125 from rxe-vm.sh on
# timeout / VM failure).
set -euo pipefail
TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$TB_DIR/.." && pwd -P)
TIMEOUT=1500
PROFILE=(--release)
while [ $# -gt 0 ]; do
  case $1 in
    --debug) PROFILE=(); shift ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    *) break ;;
  esac
done
FILTER=${1:-verbs}
cd "$ROOT"
cargo build -q "${PROFILE[@]}" -p uct-ib-plugin -p uct-self-plugin -p uct-tcp-plugin -p uct-ofi-plugin
JSON=$(mktemp /tmp/vm-conformance.XXXXXX)
trap 'rm -f "$JSON"' EXIT
cargo test -q "${PROFILE[@]}" -p rucx --test conformance --test ucp --no-run --message-format=json >"$JSON"
bin_of() { grep -o "\"executable\":\"[^\"]*/$1-[^\"]*\"" "$JSON" | cut -d'"' -f4 | tail -1; }
CONF=$(bin_of conformance)
UCP=$(bin_of ucp)
for b in "$CONF" "$UCP"; do
  [ -x "$b" ] || { echo "vm-conformance.sh: a test binary was not built ($b)" >&2; exit 1; }
done
PLUGINS=$(dirname "$(dirname "$CONF")")
# Short failure timeouts so the peer-failure tests finish quickly on rxe. FI_UNIVERSE_SIZE: RxM
# (libfabric 1.17) sizes its verbs CQ by it, and the default (256) exceeds rxe's max_cqe (ofi
# targets, see docs/ofi.md).
# The suites run side by side (the VM has two vCPUs; each suite runs its tests one at a time
# and mostly keeps one busy), as jobs "binary|filters": with the default filter the UCP suite
# is two jobs (its ofi_verbs targets take as long as rc and ud together). Each output line
# passes through `sed -u` whole (lines of two jobs never mix) with its job appended.
RUNNER='run() {
  local t=${1%%|*} f=${1#*|} t0 rc
  t0=$(date +%s)
  # shellcheck disable=SC2086 # the filters are words
  "$t" $f --test-threads=1 2>&1 | sed -u "s|\$|  [${t##*/} $f]|"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "=== FAILED: ${t##*/} $f"
  echo "=== ${t##*/} $f: $(( $(date +%s) - t0 )) s"
  return "$rc"
}
pids=()
for job in "$@"; do run "$job" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc'
JOBS=("$CONF|$FILTER" "$UCP|$FILTER")
[ "$FILTER" = verbs ] && JOBS=("$CONF|verbs" "$UCP|ofi_verbs" "$UCP|rc_verbs ud_verbs")
exec bash "$TB_DIR/rxe-vm.sh" --timeout "$TIMEOUT" -- \
  env RUCX_MODULE_DIR="$PLUGINS" RUCX_IB_TIMEOUT="${RUCX_IB_TIMEOUT:-100ms}" FI_UNIVERSE_SIZE="${FI_UNIVERSE_SIZE:-16}" \
  bash -c "$RUNNER" runner "${JOBS[@]}"
