#!/usr/bin/env bash
# The hostile-peer soak (tests/ucp_soak.rs), optimized: a UCP server on tcp/lo under every
# class of attack at once while honest clients exchange verified messages; fails if a message
# is lost or changed, an honest endpoint fails, or resident memory grows past the budgets.
# SOAK_SECS (default 20) bounds the run.
set -euo pipefail
cd "$(dirname "$0")/.."
SOAK_SECS=${SOAK_SECS:-20} cargo test --release --test ucp_soak -- --ignored --nocapture
