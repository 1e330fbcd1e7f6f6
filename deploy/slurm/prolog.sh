#!/bin/bash
# Slurm Prolog for commscope (runs as root on each of the job's nodes before it starts). In
# slurm.conf:
#
#   Prolog=/etc/slurm/commscope/prolog.sh
#
# Makes sure the node agent is up, so that the job's tasks are recorded (task-prolog.sh preloads
# the library only where the agent's socket exists). It never fails the job: a node without its
# agent runs the job unrecorded and says so in syslog.

socket=${COMMSCOPE_AGENT_SOCKET:-/run/commscope/agent.sock}

if [ ! -S "$socket" ] && command -v systemctl >/dev/null 2>&1; then
  systemctl start commscope-agent.service >/dev/null 2>&1 || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    [ -S "$socket" ] && break
    sleep 0.5
  done
fi
if [ ! -S "$socket" ]; then
  logger -t commscope "job ${SLURM_JOB_ID:-?}: no commscope agent on $(hostname) ($socket is missing): the job runs unrecorded"
fi
exit 0
