#!/usr/bin/env bash
# vm-conformance.sh - the transport conformance suite (tests/conformance) on the verbs
# transports, through the ib plugin, inside one Soft-RoCE VM boot.
#
# Usage: testbed/vm-conformance.sh [--timeout S] [FILTER]   (default filter: verbs)
# Builds the plugins (libuct_ib.so among them: a target whose module is missing fails) and the
# conformance test binary (tests/conformance/main.rs) on the host, then runs the binary in the
# VM with RUCX_MODULE_DIR pointing at the plugins. Exit status: the test binary's (124/125 from
# rxe-vm.sh on timeout / VM failure).
set -euo pipefail
TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$TB_DIR/.." && pwd -P)
TIMEOUT=1500
if [ "${1:-}" = --timeout ]; then TIMEOUT=$2; shift 2; fi
FILTER=${1:-verbs}
cd "$ROOT"
cargo build -q -p uct-ib-plugin -p uct-self-plugin -p uct-tcp-plugin
JSON=$(mktemp /tmp/vm-conformance.XXXXXX)
trap 'rm -f "$JSON"' EXIT
cargo test -q -p rucx --test conformance --no-run --message-format=json >"$JSON"
BIN=$(grep -o '"executable":"[^"]*conformance[^"]*"' "$JSON" | cut -d'"' -f4 | tail -1)
[ -x "$BIN" ] || { echo "vm-conformance.sh: conformance binary not built" >&2; exit 1; }
PLUGINS=$(dirname "$(dirname "$BIN")")
# Short failure timeouts so the peer-failure tests finish quickly on rxe.
exec bash "$TB_DIR/rxe-vm.sh" --timeout "$TIMEOUT" -- \
  env RUCX_MODULE_DIR="$PLUGINS" RUCX_IB_TIMEOUT="${RUCX_IB_TIMEOUT:-100ms}" \
  "$BIN" "$FILTER" --test-threads=1
