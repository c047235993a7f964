#!/usr/bin/env bash
# The whole rucx test suite, as the README and CI run it:
#   1. installs the system packages it needs (scripts/install-deps.sh, idempotent);
#   2. builds everything (the testbed's TCG plugins included) and runs every crate's unit and
#      integration tests on the host (RDMA tests skip themselves there: the host kernel has
#      no InfiniBand);
#   3. runs the release demo, the network-namespace multi-host tests (uct and tcp_peer in
#      scripts/netns-test.sh, ucp_client_server with a link cut in scripts/netns-client-server.sh),
#      the hostile-peer soak (scripts/soak.sh) and the fuzz bodies;
#   4. boots the soft-RoCE VM (testbed/) and runs the verbs transports' tests and demos there,
#      built in release (TCG runs debug code 2.5x slower; this is also the release test run).
# Ends with one line `N passed, N failed` summing every test run, and exits non-zero if any
# step failed. Options: --no-vm skips step 4, --quick skips steps 3 and 4.
set -uo pipefail
cd "$(dirname "$0")/.."
VM=1 EXTRA=1
for a in "$@"; do
  case $a in
    --no-vm) VM=0 ;;
    --quick) VM=0 EXTRA=0 ;;
    *) echo "usage: scripts/test.sh [--no-vm|--quick]" >&2; exit 2 ;;
  esac
done
export CARGO_TERM_COLOR=never RUST_BACKTRACE=1
LOG=$(mktemp /tmp/rucx-test.XXXXXX)
trap 'rm -f "$LOG"' EXIT
failed_steps=()
total_pass=0 total_fail=0

# Runs a step, echoing its output, and adds up the test counts it prints (cargo's
# "test result:" lines and our scripts' "N passed, N failed" lines).
step() {
  local name=$1; shift
  echo; echo "=== [$name] $*"
  local t0=$SECONDS rc
  "$@" 2>&1 | tee "$LOG"
  rc=${PIPESTATUS[0]}
  local p f
  p=$(grep -E '^test result:' "$LOG" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1/' | paste -sd+ - | bc 2>/dev/null)
  f=$(grep -E '^test result:' "$LOG" | sed -E 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\2/' | paste -sd+ - | bc 2>/dev/null)
  local sp sf
  sp=$(grep -E '^[A-Za-z-]*:? ?[0-9]+ passed, [0-9]+ failed' "$LOG" | tail -1 | sed -E 's/.*\b([0-9]+) passed, ([0-9]+) failed.*/\1/')
  sf=$(grep -E '^[A-Za-z-]*:? ?[0-9]+ passed, [0-9]+ failed' "$LOG" | tail -1 | sed -E 's/.*\b([0-9]+) passed, ([0-9]+) failed.*/\2/')
  total_pass=$((total_pass + ${p:-0} + ${sp:-0}))
  total_fail=$((total_fail + ${f:-0} + ${sf:-0}))
  if [ "$rc" -ne 0 ]; then
    failed_steps+=("$name")
    # a failing step without test counts still counts as one failure
    [ -z "${f}${sf}" ] && total_fail=$((total_fail + 1))
    echo "=== [$name] FAILED (exit $rc, $((SECONDS - t0)) s)"
  else
    echo "=== [$name] ok ($((SECONDS - t0)) s)"
  fi
}

step deps bash scripts/install-deps.sh
command -v bc >/dev/null || apt-get install -y -qq bc >/dev/null
step build cargo build --workspace --all-targets
# rust-version is the real minimum: no std API newer than it (clippy's incompatible_msrv)
step msrv cargo clippy --workspace --all-targets -- -A clippy::all -D clippy::incompatible_msrv
# every crate's unit, integration and doc tests (the API examples of ucs, uct and ucp)
step test cargo test --workspace --no-fail-fast
# the optional tokio integration (ucp::tokio, the ucp_async example and its test): not in the
# default features, so the steps above leave it out
step tokio bash -c 'cargo clippy -p ucp -p rucx --features ucp/tokio,rucx/tokio --lib --example ucp_async --test ucp_async -- -A clippy::all -D clippy::incompatible_msrv &&
  cargo build -p rucx --features tokio --example ucp_async --example ucp_async_server &&
  cargo test -p rucx --features tokio --test ucp_async &&
  cargo test -p ucp --features tokio --doc'
# the API docs with every feature: missing docs and broken intra-doc links are errors; with a
# nightly toolchain also as docs.rs builds them (`--cfg docsrs` marks feature-gated items)
step docs bash -c 'RUSTDOCFLAGS="-D warnings" cargo doc -p ucs -p uct -p ucp --no-deps --all-features &&
  if rustup toolchain list 2>/dev/null | grep -q "^nightly"; then
    RUSTDOCFLAGS="--cfg docsrs -D warnings" cargo +nightly doc -p ucs -p uct -p ucp --no-deps --all-features; fi'
# the testbed's TCG plugins (diagnostics, not run here) must keep compiling
step plugins bash -c 'for f in bench/vm/tcg-count.c bench/vm/tcg-syscall-times.c; do
  cc -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -o /dev/null "$f" -lpthread || exit 1; done'
if [ $EXTRA = 1 ]; then
  step demo cargo run --release --example ucp_hello_world
  # every crate's unit tests optimized (the VM steps run the integration suites in release)
  step release cargo test --release --workspace --lib
  # the README's example as a new crate depending on rucx, with rucx's warnings on its stderr
  step fresh-crate bash scripts/fresh-crate.sh
  [ -f scripts/netns-test.sh ] && step netns bash scripts/netns-test.sh
  step netns-cs bash scripts/netns-client-server.sh
  step soak bash scripts/soak.sh
fi
if [ $VM = 1 ]; then
  step vm-prepare bash testbed/rxe-vm.sh --prepare
  step vm-ib bash testbed/cargo-test-in-vm.sh --timeout 1500 --release -p uct-ib-verbs -p uct-ib -- --test-threads=1
  step vm-conformance bash testbed/vm-conformance.sh verbs
  step vm-hello-rc bash testbed/ib-hello.sh -t rc_verbs -d rxe0:1
  step vm-hello-ud bash testbed/ib-hello.sh -t ud_verbs -d rxe0:1
  step vm-perftest-ucp bash testbed/vm-perftest-ucp.sh
fi

echo
if [ ${#failed_steps[@]} -gt 0 ]; then
  echo "failed steps: ${failed_steps[*]}"
fi
echo "$total_pass passed, $total_fail failed"
[ ${#failed_steps[@]} -eq 0 ]
