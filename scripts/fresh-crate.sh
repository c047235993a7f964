#!/usr/bin/env bash
# fresh-crate.sh - the README's embedding example as a user meets it: a new crate outside this
# workspace that depends on rucx exactly as "Depending on it" says, with the README's first
# Rust block as its main.rs and no logging setup of its own. Checks that it builds and runs,
# and that rucx's warnings reach its stderr once each (an unknown RUCX_* variable with its
# "did you mean", a transport it cannot use), that RUCX_LOG_LEVEL=debug shows debug lines and
# RUCX_LOG_LEVEL=error hides the warnings. Ends with `fresh-crate: N passed, N failed`.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
APP=$ROOT/target/fresh-crate
rm -rf "$APP" && mkdir -p "$APP/src"
cat > "$APP/Cargo.toml" <<TOML
[package]
name = "freshapp"
version = "0.1.0"
edition = "2021"

[dependencies]
rucx = { path = "$ROOT" }

[workspace]
TOML
# The first ```rust block of the README, verbatim.
awk '/^```rust$/ {on=1; next} on && /^```$/ {exit} on {print}' "$ROOT/README.md" > "$APP/src/main.rs"
[ -s "$APP/src/main.rs" ] || { echo "fresh-crate: no rust block in README.md"; echo "fresh-crate: 0 passed, 1 failed"; exit 1; }
cp "$ROOT/Cargo.lock" "$APP/"   # the versions the workspace tested, not whatever is newest
export CARGO_TARGET_DIR=$ROOT/target
pass=0 fail=0
ok() { echo "  ok: $1"; pass=$((pass + 1)); }
bad() { echo "  FAILED: $1"; fail=$((fail + 1)); }
if ! cargo build --quiet --manifest-path "$APP/Cargo.toml" --bin freshapp; then
    echo "fresh-crate: the README's example does not build as a crate depending on rucx"
    echo "fresh-crate: 0 passed, 1 failed"; exit 1
fi
BIN=$CARGO_TARGET_DIR/debug/freshapp
run() { # run ENV... : stdout to $APP/out, stderr to $APP/err, exit code in $rc
    env -u RUCX_LOG_LEVEL "$@" timeout 60 "$BIN" > "$APP/out" 2> "$APP/err"; rc=$?
}
count() { grep -c -- "$1" "$APP/err"; }

run
if [ $rc -eq 0 ] && grep -q 'server got "hello"' "$APP/out"; then ok "runs, the reply arrives"; else bad "plain run (exit $rc): $(tail -3 "$APP/out" "$APP/err")"; fi
[ ! -s "$APP/err" ] && ok "nothing on stderr when nothing is wrong" || bad "unexpected stderr: $(head -3 "$APP/err")"

run RUCX_TSL=tcp
n=$(count 'RUCX_TSL.*did you mean RUCX_TLS')
[ $rc -eq 0 ] && [ "$n" = 1 ] && ok "RUCX_TSL: one warning with its 'did you mean'" || bad "RUCX_TSL: exit $rc, $n warnings: $(head -3 "$APP/err")"

run RUCX_TCP_MAX_IOV=bogus
n=$(count 'tcp/lo not used')
# the example creates two workers, each of which leaves the interface out
[ "$n" = 2 ] && ok "an unusable transport: one warning per worker naming it" || bad "unusable tcp: $n warnings: $(head -3 "$APP/err")"

run RUCX_LOG_LEVEL=debug
n=$(count 'DEBUG')
[ $rc -eq 0 ] && [ "$n" -gt 0 ] && ok "RUCX_LOG_LEVEL=debug: $n debug lines" || bad "RUCX_LOG_LEVEL=debug: exit $rc, no debug line"

run RUCX_LOG_LEVEL=error RUCX_TSL=tcp
n=$(count 'did you mean')
[ "$n" = 0 ] && ok "RUCX_LOG_LEVEL=error hides warnings" || bad "RUCX_LOG_LEVEL=error still warned"

echo "fresh-crate: $pass passed, $fail failed"
[ $fail -eq 0 ]
