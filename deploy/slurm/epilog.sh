#!/bin/bash
# Slurm Epilog for commscope (runs as root on each of the job's nodes after it ends). In
# slurm.conf:
#
#   Epilog=/etc/slurm/commscope/epilog.sh
#
# Logs the findings the collector still holds open for the job (a hang, a dead rank, a slow
# link...) to syslog, one line each, so that the node's log says why a job failed. Set
# COMMSCOPE_COLLECTOR_HTTP (e.g. http://collector.example:4651) in slurmd's environment;
# without it, curl or python3, this does nothing. Never fails: the job is over.

api=${COMMSCOPE_COLLECTOR_HTTP:-}
if [ -z "$api" ] || [ -z "${SLURM_JOB_ID:-}" ] || ! command -v curl >/dev/null 2>&1 ||
  ! command -v python3 >/dev/null 2>&1; then
  exit 0
fi

# The library names a Slurm job "<job>.<step>": every step of this job.
curl -fsS --max-time 5 "$api/api/v1/findings?state=open" 2>/dev/null |
  python3 -c '
import json, sys
job = sys.argv[1]
try:
    found = json.load(sys.stdin).get("findings", [])
except ValueError:
    sys.exit(0)
for f in found:
    if f.get("job") == job or str(f.get("job", "")).startswith(job + "."):
        print(f.get("job"), f.get("summary", ""), sep=": ")
' "$SLURM_JOB_ID" 2>/dev/null |
  head -n 20 |
  while IFS= read -r line; do
    logger -t commscope "job $line"
  done
exit 0
