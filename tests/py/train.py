"""A job shaped like training, in Python with mpi4py, for the tests of how a rank's end is told
(tests/tests/endings.rs); the Python twin of tests/c/train.c.

Usage: python3 [-m mpi4py] train.py MODE RANK STEP [STEPS]
Every step: 1 ms of compute, an all-reduce in the rank's tensor-parallel pair (rank // 2), then
one in its data-parallel half (rank % 2); a world barrier every 10 steps. After the compute of
step STEP, rank RANK:
  healthy    does nothing unusual
  exception  raises an uncaught exception (under `-m mpi4py`, mpi4py then calls MPI_Abort)
  cycle      RANK receives from RANK + 3 and RANK + 3 from RANK: neither sends
Every rank prints "step N" at STEP.
"""

import sys
import time

import numpy as np
from mpi4py import MPI


def compute_1ms():
    t0 = time.perf_counter()
    a = 1.0
    while time.perf_counter() - t0 < 0.001:
        a = a * 1.0000001 + 1e-9
    return a


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    bad = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    fault_step = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 400
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    tp = world.Split(rank // 2, rank)
    tp.Set_name("tensor-parallel")
    dp = world.Split(rank % 2, rank)
    dp.Set_name("data-parallel")
    grad = np.arange(256, dtype=np.float64) + rank
    for step in range(steps):
        compute_1ms()
        if step == fault_step:
            print(f"step {step}", flush=True)
            if rank == bad and mode == "exception":
                raise RuntimeError(f"rank {rank}: loss is NaN at step {step}")
            if mode == "cycle" and rank in (bad, bad + 3):
                peer = bad + 3 if rank == bad else bad
                buf = np.zeros(1, dtype=np.int32)
                world.Recv(buf, source=peer, tag=5)
        tp.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        dp.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        if step % 10 == 9:
            world.Barrier()
    tp.Free()
    dp.Free()


if __name__ == "__main__":
    main()
