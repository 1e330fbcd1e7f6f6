#!/usr/bin/env bash
# Benchmarks (not part of the tests); each prints its numbers, see docs/performance.md.
#   scripts/bench.sh [shim options]         the shim: per-call cost, real all-reduce loops
#   scripts/bench.sh collector [options]    collector ingest, collector memory, agent CPU
#   scripts/bench.sh accuracy [options]     detectors on randomized simulated jobs (virtual time)
#   scripts/bench.sh live [RANKS] [SECS]    every fault token in real time through a collector process
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  accuracy)
    shift
    cargo build --release --quiet -p commscope-sim
    exec target/release/bench-accuracy "$@"
    ;;
  live)
    shift
    ranks=${1:-1024}
    secs=${2:-30}
    cargo build --release --quiet -p commscope
    dir=$(mktemp -d)
    trap 'kill $collector 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
    target/release/commscope collector --listen 127.0.0.1:0 --http 127.0.0.1:0 --trace-dir "$dir/traces" \
      --max-agent-rate 100000000 ${COLLECTOR_ARGS:-} 2> "$dir/collector.log" &
    collector=$!
    for _ in $(seq 100); do grep -q "listening:" "$dir/collector.log" && break; sleep 0.1; done
    grpc=$(sed -n 's/.*gRPC on \([^,]*\),.*/\1/p' "$dir/collector.log")
    http=$(sed -n 's/.*HTTP on \([^ ]*\).*/\1/p' "$dir/collector.log")
    echo "collector pid $collector: gRPC $grpc, HTTP $http"
    status=0
    # FAULTS="straggler:100 hang:77" to run some; COLLECTOR_ARGS="--sample-budget 100000" and
    # SIM_ARGS="--compute-ms 40" to tune.
    for fault in ${FAULTS:-straggler:100 slow-node:node-005 hang:77 mismatch:33 dead:500 degraded none}; do
      args=(--fault "$fault")
      [ "$fault" = none ] && args=()
      echo "== $fault ($ranks ranks, $secs s)"
      /usr/bin/time -f "simulate: %e s wall, %U s user, %S s sys" \
        target/release/commscope simulate --collector "http://$grpc" --collector-http "$http" \
        --ranks "$ranks" --duration "$secs" --seed 7 --check ${SIM_ARGS:-} "${args[@]}" || status=1
      grep -E "^(VmRSS|VmHWM)" /proc/$collector/status | tr '\n' ' '; echo
      { grep -E "consistent sampling" "$dir/collector.log" || true; } | tail -1
      ps -o cputime= -p $collector | sed 's/^/collector CPU so far: /'
    done
    exit $status
    ;;
esac
scripts/setup.sh --mpi-only
cargo build --release --quiet --workspace
if [ "${1:-}" = "collector" ]; then
  shift
  exec target/release/bench-collector "$@"
fi
exec target/release/bench-shim "$@"
