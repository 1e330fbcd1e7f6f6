#!/usr/bin/env bash
# Installs what commscope's build and tests need, skipping whatever is already there:
# Debian packages (Open MPI, MPICH, protoc, Prometheus, eu-stack and gdb for culprits' stacks), rustup components (rustfmt, clippy), and the
# Python engines the Parquet test reads with (polars, pandas, pyarrow, duckdb).
# Usage: scripts/setup.sh [--mpi-only]
set -euo pipefail

need_apt=()
for pkg in openmpi-bin libopenmpi-dev mpich libmpich-dev protobuf-compiler iproute2 util-linux prometheus elfutils gdb procps; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

[ "${1:-}" = "--mpi-only" ] && exit 0

for comp in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$comp" || rustup component add "$comp"
done

if ! python3 -c 'import polars, pandas, pyarrow, duckdb' >/dev/null 2>&1; then
  echo "setup: installing polars, pandas, pyarrow, duckdb for python3"
  python3 -m pip install -q --disable-pip-version-check polars pandas pyarrow duckdb
fi
