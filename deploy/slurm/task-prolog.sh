#!/bin/bash
# Slurm TaskProlog for commscope: records every MPI and NCCL call of every task of every job,
# through the node agent (commscope-agent.service). In slurm.conf:
#
#   TaskProlog=/etc/slurm/commscope/task-prolog.sh
#
# slurmstepd runs it as the job's user before each task and applies the `export NAME=VALUE`
# lines it prints to the task's environment. The job id needs nothing: the library reads
# SLURM_JOB_ID and SLURM_STEP_ID, and names the job "<job>.<step>".
#
# A job opts out with `--export=ALL,COMMSCOPE_DISABLE=1` (or that variable in its script).
# Without the agent's socket on this node the task runs untouched: never fail a job.

lib=${COMMSCOPE_LIB:-/usr/lib/commscope/libcommscope.so}
socket=${COMMSCOPE_AGENT_SOCKET:-/run/commscope/agent.sock}

if [ "${COMMSCOPE_DISABLE:-0}" = 1 ] || [ ! -r "$lib" ] || [ ! -S "$socket" ]; then
  exit 0
fi
case ":${LD_PRELOAD:-}:" in
  *":$lib:"*) ;;                                  # already preloaded (a nested step)
  ::) echo "export LD_PRELOAD=$lib" ;;
  *) echo "export LD_PRELOAD=$lib:$LD_PRELOAD" ;;
esac
echo "export COMMSCOPE_AGENT_SOCKET=$socket"
exit 0
