#!/usr/bin/env bash
# The shim's cost, measured (not part of the tests): per-call overhead on MPI_COMM_SELF and the
# slowdown of real all-reduce loops. Prints its numbers; see docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --mpi-only
cargo build --release --quiet --workspace
exec cargo run --release --quiet -p commscope-tests --bin bench-shim -- "$@"
