#!/usr/bin/env bash
# Builds commscope's eBPF programs (ebpf/programs) and checks the object in as
# agent/ebpf/commscope.bpf.o, with agent/ebpf/commscope.bpf.stamp recording the hash of the
# sources and of the pinned toolchain (ebpf/toolchain) it was built from. eBPF builds are not
# byte-reproducible, so staleness is judged on that hash, not on the object's bytes.
#
# Usage: scripts/build-ebpf.sh            build and update the object and its stamp
#        scripts/build-ebpf.sh --check    exit 1 when the stamp does not match the sources
#        scripts/build-ebpf.sh --rebuild-check
#                                         build into a scratch directory and exit 1 when the
#                                         result's programs and maps differ from the object's
# Toolchain (see ../shared/reference/machine.md): nightly with rust-src, and bpf-linker built
# against LLVM 22; `scripts/setup.sh --ebpf` installs both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
obj="$root/agent/ebpf/commscope.bpf.o"
stamp_file="$root/agent/ebpf/commscope.bpf.stamp"

sources_hash() {
  (cd "$root" && for f in ebpf/toolchain ebpf/common/Cargo.toml ebpf/programs/Cargo.toml \
      ebpf/programs/Cargo.lock $(ls ebpf/common/src/*.rs ebpf/programs/src/*.rs | LC_ALL=C sort); do
     printf '%s\0' "$f"; cat "$f"; printf '\0'
   done) | sha256sum | cut -d' ' -f1
}

stamp() {
  printf 'sources sha256:%s\n' "$(sources_hash)"
  printf 'toolchain %s\n' "$(paste -sd';' "$root/ebpf/toolchain" | sed 's/;/; /')"
}

case "${1:-}" in
  --check)
    if [ "$(stamp)" != "$(cat "$stamp_file")" ]; then
      echo "build-ebpf: $stamp_file is stale: the eBPF sources or ebpf/toolchain changed since the object was built; run scripts/build-ebpf.sh" >&2
      diff <(stamp) "$stamp_file" >&2 || true
      exit 1
    fi
    echo "build-ebpf: the object matches its sources ($(sources_hash | cut -c1-12))"
    exit 0 ;;
esac

want=$(cat "$root/ebpf/toolchain")
have="$(rustc +nightly --version 2>/dev/null || echo 'no nightly rustc')
$(bpf-linker --version 2>/dev/null || echo 'no bpf-linker')"
if [ "$want" != "$have" ] && [ "${1:-}" = "--rebuild-check" ] && command -v bpf-linker >/dev/null; then
  echo "build-ebpf: note: rebuilding with a toolchain other than the pinned one (ebpf/toolchain): $(echo "$have" | paste -sd' ')" >&2
elif [ "$want" != "$have" ]; then
  echo "build-ebpf: the toolchain is not the pinned one (ebpf/toolchain):" >&2
  diff <(echo "$want") <(echo "$have") >&2 || true
  echo "build-ebpf: install it (scripts/setup.sh --ebpf), or update ebpf/toolchain on purpose" >&2
  exit 1
fi

target_dir="$root/ebpf/programs/target"
[ "${1:-}" = "--rebuild-check" ] && target_dir=$(mktemp -d)
(cd "$root/ebpf/programs" && CARGO_TARGET_DIR="$target_dir" \
  cargo +nightly build --quiet --locked --target bpfel-unknown-none -Z build-std=core --release)
built="$target_dir/bpfel-unknown-none/release/commscope-ebpf"

if [ "${1:-}" = "--rebuild-check" ]; then
  shape() { readelf -SW "$1" | awk '/^ *\[/{print $2, $3}' | grep -v '^\[Nr\]' | sort
            readelf -sW "$1" | awk '$4=="FUNC"||$4=="OBJECT"{print $4, $8}' | sort; }
  if ! diff <(shape "$obj") <(shape "$built") >&2; then
    echo "build-ebpf: a fresh build's programs or maps differ from $obj; run scripts/build-ebpf.sh" >&2
    rm -rf "$target_dir"; exit 1
  fi
  rm -rf "$target_dir"
  echo "build-ebpf: a fresh build has the object's programs and maps"
  exit 0
fi

mkdir -p "$(dirname "$obj")"
cp "$built" "$obj"
stamp > "$stamp_file"
echo "build-ebpf: $obj ($(stat -c %s "$obj") bytes), $(head -1 "$stamp_file")"
