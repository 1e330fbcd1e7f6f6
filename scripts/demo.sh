#!/usr/bin/env bash
# commscope's main job end to end on a built-in default: builds commscope, then runs a bundled
# 8-rank MPI training-step loop under the shim with a straggler and then a hang, and prints the
# findings as they open and resolve (without MPI: the same story on the simulator).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --mpi-only
cargo build --release --quiet -p commscope -p commscope-shim
exec target/release/commscope demo "$@"
