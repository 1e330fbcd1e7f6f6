#!/usr/bin/env bash
# commscope's main job end to end on a built-in default: builds commscope, then runs a bundled
# 4-rank MPI training-step loop under the shim and prints what was captured.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --mpi-only
cargo build --release --quiet -p commscope -p commscope-shim
exec target/release/commscope demo "$@"
