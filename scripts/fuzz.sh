#!/usr/bin/env bash
# Fuzzes every importer and the .cst reader for a bounded time each, seeded with the real
# samples in tests/data/samples. Fails on the first crash (the input is kept in
# fuzz/artifacts/TARGET/).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
rustup toolchain list | grep '^nightly' >/dev/null || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

samples=tests/data/samples
corpus=fuzz/corpus
mkdir -p "$corpus"/{flight_recorder,kineto,inspector,ras,cst,sniff}
cp -n "$samples"/nvrx_fr_traces/*/_dump_* "$corpus/flight_recorder/" 2>/dev/null || true
for f in "$samples"/hta/*/*.json.gz; do
  { gunzip -c "$f" || true; } | head -c 200000 > "$corpus/kineto/$(basename "$f" .gz)" || true
  cp -n "$f" "$corpus/sniff/" 2>/dev/null || true
done
cat > "$corpus/inspector/v40.log" <<'JSONL'
{"header":{"id":"0x7f8c496ae9f661","comm_name":"world","rank":0,"n_ranks":2,"nnodes":1},"metadata":{"inspector_output_format_version":"v4.0","dump_timestamp_us":1748030377748202,"hostname":"h","pid":1},"coll_perf":{"coll":"AllReduce","coll_sn":1,"coll_msg_size_bytes":1048576,"coll_exec_time_us":61,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":17.2,"coll_busbw_gbs":17.2}}
{"header":{"id":"0x7f8c496ae9f661","comm_name":"world","rank":0,"n_ranks":2,"nnodes":1},"metadata":{"inspector_output_format_version":"v4.0","dump_timestamp_us":1748030377748202,"hostname":"h","pid":1},"p2p_perf":{"p2p":"Send","p2p_sn":1,"p2p_peer":1,"p2p_msg_size_bytes":4096,"p2p_exec_time_us":5}}
JSONL
cat > "$corpus/ras/report.json" <<'JSON'
{"nccl_version":"2.28.7","cuda_runtime_version":12080,"cuda_driver_version":12080,"timestamp":"1748030377.5","communicators_count":1,"communicators":[{"hash":"0x1234","secondary_hash":"0x1:0x2","size":2,"ranks_count":1,"missing_ranks_count":1,"ranks":[{"rank":0,"host":"a","pid":10,"cuda_dev":0,"nvml_dev":0,"status":{"init_state":0,"async_error":0,"finalize_called":false,"destroy_flag":false,"abort_flag":false},"collective_counts":{"AllReduce":640}}],"missing_ranks":[{"rank":1,"host":"b","pid":11,"cuda_dev":0,"nvml_dev":0,"status":{"unresponsive":true,"considered_dead":true}}]}],"ras":{"collection_time_sec":0.012,"timeouts_count":0}}
JSON
cp -n "$corpus"/flight_recorder/_dump_0 "$corpus/sniff/" 2>/dev/null || true
# A small real .cst file, if a previous test run left one; else the reader starts from nothing.
find "${TMPDIR:-/tmp}" -maxdepth 4 -name '*.cst' -size -64k 2>/dev/null | head -3 | xargs -r cp -t "$corpus/cst/"

targets="${FUZZ_TARGETS:-flight_recorder kineto inspector ras cst sniff}"
for t in $targets; do
  echo "fuzz: $t for ${secs}s"
  (cd fuzz && cargo +nightly fuzz run "$t" "corpus/$t" -- \
      -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -max_len=1048576 -print_final_stats=1 2>&1 \
    | grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|Done)' || true)
  if [ -n "$(find fuzz/artifacts/"$t" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' \) 2>/dev/null)" ]; then
    echo "fuzz: $t found a failing input: $(ls fuzz/artifacts/"$t"/)" >&2
    exit 1
  fi
done
echo "fuzz: no crash in any target"
