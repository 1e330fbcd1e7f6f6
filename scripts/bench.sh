#!/usr/bin/env bash
# Benchmarks (not part of the tests); each prints its numbers, see docs/performance.md.
#   scripts/bench.sh [shim options]         the shim: per-call cost, real all-reduce loops, ns added
#                                           per iteration of our loop and of IMB-MPI1 Allreduce
#   scripts/bench.sh collector [options]    collector ingest, collector memory, agent CPU
#   scripts/bench.sh scale [options]        CPU-s per million records: 1 and 8 jobs, 1 and 2
#                                           collectors, 1 shard and one per CPU
#   scripts/bench.sh accuracy [options]     detectors on randomized simulated jobs (virtual time)
#   scripts/bench.sh live [RANKS] [SECS]    every fault token in real time through a collector process
#   scripts/bench.sh nccl [CALLS]           host-side cost the shim adds per NCCL call (test doubles)
#   scripts/bench.sh plugin [OPS]           cost of the profiler plugin's callbacks per NCCL operation
#   scripts/bench.sh probes                 the eBPF transport probes: cost per probe hit, per TCP
#                                           round trip, agent CPU per event and per poll (root)
#   scripts/bench.sh postmortem [RECORDS]   analyze and report on a generated Parquet trace
#                                           (default 100,000,000 records): wall time, peak memory
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  scale)
    shift
    cargo build --release --quiet -p commscope -p commscope-tests --bin commscope --bin bench-scale
    exec target/release/bench-scale "$@"
    ;;
  probes)
    cargo build --release --quiet -p commscope-tests --bin bench-probes
    exec target/release/bench-probes
    ;;
  postmortem)
    # A 256-rank job trace (gen-trace: rank 37 computes 30 % slower), generated once into a
    # cache outside the clone; then `analyze` and `report` on it, each timed by GNU time for
    # wall clock and peak resident memory.
    records=${2:-100000000}
    cargo build --release --quiet -p commscope -p commscope-sim
    cache="${COMMSCOPE_CACHE:-/var/cache/commscope}/bench"
    mkdir -p "$cache"
    trace="$cache/postmortem-$records.parquet"
    if [ ! -f "$trace" ]; then
      target/release/gen-trace --records "$records" "$trace"
    fi
    command -v /usr/bin/time >/dev/null || { echo "postmortem: needs GNU time (apt-get install time)"; exit 1; }
    echo "trace: $trace ($(du -h "$trace" | cut -f1), $(nproc) CPUs)"
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    measure() {
      local name=$1
      shift
      /usr/bin/time -f "%e %M" -o "$out/time" "$@" > "$out/$name.out" 2> "$out/$name.err" || {
        cat "$out/$name.err"
        exit 1
      }
      read -r secs kib < "$out/time"
      awk -v n="$name" -v s="$secs" -v k="$kib" 'BEGIN { printf "%s: %.1f s wall, %.2f GiB peak RSS\n", n, s, k / 1048576 }'
    }
    measure analyze target/release/commscope analyze "$trace"
    sed 's/^/  /' "$out/analyze.out"
    measure report target/release/commscope report "$trace" -o "$out/report.html"
    sed 's/^/  /' "$out/report.err"
    exit 0
    ;;
  nccl)
    # The NCCL and CUDA test doubles in no-op mode (collectives return at once, events complete
    # when recorded), so what is measured is the time inside ncclAllReduce: the double's few ns
    # plus what the shim adds. The real event-record cost needs a GPU: tests/gpu/check.sh.
    calls=${2:-200000}
    cargo build --release --quiet -p commscope -p commscope-shim
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    cc -O2 -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" tests/doubles/cuda_double.c -lpthread
    cc -O2 -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$dir/libnccl.so.2" tests/doubles/nccl_double.c \
      -L"$dir" -l:libcuda.so.1 -lpthread -lrt -Wl,-rpath,'$ORIGIN'
    cc -O2 -o "$dir/nccl_job" tests/doubles/nccl_job.c -L"$dir" -l:libnccl.so.2 -l:libcuda.so.1 -Wl,-rpath,'$ORIGIN'
    export TESTDOUBLE_NCCL_NOOP=1 TESTDOUBLE_CUDA_NOOP_EVENTS=1
    shim=target/release/libcommscope.so
    run() { "$@" "$dir/nccl_job" 1 bench "$calls" | sed -n 's/^allreduce: \([0-9.]*\) ns.*/\1/p'; }
    for i in 1 2 3; do
      base=$(run env)
      host=$(run env LD_PRELOAD="$shim" COMMSCOPE_TRACE_DIR="$dir/t" COMMSCOPE_GPU_TIMING=0)
      gpu=$(run env LD_PRELOAD="$shim" COMMSCOPE_TRACE_DIR="$dir/t")
      rec=$("$dir/nccl_job" 1 bench 100000 | sed -n 's/^cuEventRecord: \([0-9.]*\) ns.*/\1/p')
      awk -v b="$base" -v h="$host" -v g="$gpu" -v r="$rec" 'BEGIN {
        printf "run %d: without shim %.1f ns/call; shim, host timing only: +%.1f ns; shim with GPU timing: +%.1f ns, of which 2 event records (double) %.1f ns -> %.1f ns excluding them\n",
          '"$i"', b, h - b, g - b, 2 * r, g - b - 2 * r }'
    done
    exit 0
    ;;
  plugin)
    # NCCL's callback sequence for one network all-reduce on 2 channels (160 callbacks, incl. 32
    # proxy steps), driven straight into libcommscope.so's ncclProfiler_v7 with the recorder on.
    ops=${2:-200000}
    cargo build --release --quiet -p commscope-shim
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    cc -O2 -o "$dir/plugin_bench" tests/doubles/plugin_bench.c -ldl
    for i in 1 2 3; do
      env -u LD_PRELOAD COMMSCOPE_TRACE_DIR="$dir/t" COMMSCOPE_JOB_ID=plugin-bench RANK=0 WORLD_SIZE=2 \
        "$dir/plugin_bench" "$PWD/target/release/libcommscope.so" "$ops" 2>/dev/null | sed "s/^/run $i: /"
      env -u LD_PRELOAD COMMSCOPE_TRACE_DIR="$dir/t" COMMSCOPE_JOB_ID=plugin-bench RANK=0 WORLD_SIZE=2 \
        COMMSCOPE_PROFILER_STEPS=0 "$dir/plugin_bench" "$PWD/target/release/libcommscope.so" "$ops" 2>/dev/null |
        sed "s/^/run $i, COMMSCOPE_PROFILER_STEPS=0: /"
      rm -rf "$dir/t"
    done
    exit 0
    ;;
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

# The Intel MPI Benchmarks for the `imb` part, built once per MPI flavour outside the clone:
# from IMB_SRC (a git repository or mirror; default GitHub) at IMB_COMMIT, with each flavour's
# mpicxx and IMB's own flags (its C++ headers' warnings aside: the MPI C++ bindings are skipped).
IMB_SRC=${IMB_SRC:-https://github.com/intel/mpi-benchmarks}
IMB_COMMIT=${IMB_COMMIT:-46e8757a920c334abfea6340499f1c5deaefb834}
export COMMSCOPE_IMB_DIR=${COMMSCOPE_IMB_DIR:-${COMMSCOPE_CACHE:-/var/cache/commscope}/imb}
for flavour in openmpi mpich; do
  out="$COMMSCOPE_IMB_DIR/$flavour"
  [ -x "$out/IMB-MPI1" ] && continue
  command -v "mpicxx.$flavour" >/dev/null || continue
  echo "bench: building IMB-MPI1 ($IMB_COMMIT) for $flavour into $out"
  rm -rf "$out.src" && mkdir -p "$out"
  git clone -q "$IMB_SRC" "$out.src" && git -C "$out.src" checkout -q "$IMB_COMMIT"
  make -C "$out.src" -j"$(nproc)" IMB-MPI1 CC="mpicc.$flavour" CXX="mpicxx.$flavour" \
    CPPFLAGS="-DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1" > "$out/build.log" 2>&1 \
    || { echo "bench: IMB build failed, see $out/build.log"; exit 1; }
  cp "$out.src/IMB-MPI1" "$out/IMB-MPI1"
  rm -rf "$out.src"
done
exec target/release/bench-shim "$@"
