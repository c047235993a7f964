#!/usr/bin/env bash
# cargo-test-in-vm.sh - build test binaries on the host, run them all inside ONE rxe VM.
#
# Usage: testbed/cargo-test-in-vm.sh [--timeout S] [CARGO-TEST-ARGS...] [-- TEST-BINARY-ARGS...]
#   e.g. testbed/cargo-test-in-vm.sh -p uct-ib -- --test-threads=1
#
# Runs `cargo test --no-run --message-format=json CARGO-TEST-ARGS` on the host (native speed;
# cargo itself is slow under TCG), then boots testbed/rxe-vm.sh once and runs every test
# executable with TEST-BINARY-ARGS in the current directory. Exit status: 0 when all passed,
# 1 when any failed, 124/125 as rxe-vm.sh (timeout / VM failure).
# Environment: CARGO (default cargo), plus everything rxe-vm.sh reads.
set -euo pipefail
TB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
TIMEOUT=1800
if [ "${1:-}" = --timeout ]; then
  [ $# -ge 2 ] || { echo "cargo-test-in-vm.sh: --timeout needs seconds" >&2; exit 2; }
  TIMEOUT=$2
  shift 2
fi
CARGO_ARGS=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do CARGO_ARGS+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
TEST_ARGS=("$@")

# build on the host; compiler messages go to stderr, the JSON lines to a file
JSON=$(mktemp /tmp/cargo-test-in-vm.XXXXXX)
trap 'rm -f "$JSON"' EXIT
if ! "${CARGO:-cargo}" test --no-run --message-format=json "${CARGO_ARGS[@]}" >"$JSON"; then
  grep -o '"rendered":"[^"]*"' "$JSON" | head -20 | sed 's/\\n/\n/g' >&2 || true
  echo "cargo-test-in-vm.sh: the host build failed" >&2
  exit 1
fi
mapfile -t BINS < <(grep -o '"executable":"[^"]*"' "$JSON" | cut -d'"' -f4)
if [ ${#BINS[@]} -eq 0 ]; then
  echo "cargo-test-in-vm.sh: no test executables were built (did the build fail?)" >&2
  exit 1
fi
echo "cargo-test-in-vm.sh: running ${#BINS[@]} test binaries in the rxe VM" >&2

# inside the VM: run each binary, keep going after a failure, report at the end
RUNNER='n=$1; shift; bins=("${@:1:$n}"); shift "$n"; rc=0
for t in "${bins[@]}"; do
  echo "=== ${t##*/}"
  "$t" "$@" || { echo "=== FAILED: ${t##*/}"; rc=1; }
done
exit $rc'
bash "$TB_DIR/rxe-vm.sh" --timeout "$TIMEOUT" --timing -- \
  bash -c "$RUNNER" runner "${#BINS[@]}" "${BINS[@]}" "${TEST_ARGS[@]}"
