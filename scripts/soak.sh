#!/usr/bin/env bash
# The soak and fault run (not part of the tests): MPI jobs and a simulated 4,096-rank job
# through two agents and two collector replicas while collectors, agents and single ranks are
# killed and restarted, a spool's disk fills up and garbage goes to every port; then every
# record is accounted for. Its last line is `soak: PASS …` or `soak: FAIL …`.
#   scripts/soak.sh [SECONDS]     default 300; at least 90
# Results and how to read them: docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-300}
cargo build --release --quiet -p commscope -p commscope-tests --bin commscope --bin soak
cargo build --release --quiet -p commscope-shim
exec target/release/soak "$secs"
