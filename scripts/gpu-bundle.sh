#!/usr/bin/env bash
# Builds what tests/gpu/check.sh needs on a GPU machine without Rust: a stripped release
# libcommscope.so and commscope in tests/gpu/bin (about 18 MB together; the directory is not
# tracked). Carry tests/gpu/bin to the GPU machine with the tree and run tests/gpu/check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p commscope -p commscope-shim
mkdir -p tests/gpu/bin
strip -o tests/gpu/bin/commscope target/release/commscope
strip -o tests/gpu/bin/libcommscope.so target/release/libcommscope.so
du -ch tests/gpu/bin/* | tail -1
