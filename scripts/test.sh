#!/usr/bin/env bash
# The test command: installs what is missing, then formatting, lints, build and every test.
# Benchmarks are separate: scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# A build from scratch and the suite write about 10 GB (target/ and the tests' temporary files).
# A full disk shows up as a linker crash with no reason given, so say it plainly first.
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if [ "${free_gb:-0}" -lt 15 ]; then
  echo "scripts/test.sh: warning: ${free_gb} GB free here; a build from scratch and the tests need about 10 GB" >&2
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
# The end-to-end tests run the binaries of this build (commscope and libcommscope.so).
cargo build --workspace
cargo test --workspace --all-features
