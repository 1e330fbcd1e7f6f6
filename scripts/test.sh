#!/usr/bin/env bash
# The test command: installs what is missing, then formatting, lints, build and every test.
# Benchmarks are separate: scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
# The end-to-end tests run the binaries of this build (commscope and libcommscope.so).
cargo build --workspace
cargo test --workspace --all-features
