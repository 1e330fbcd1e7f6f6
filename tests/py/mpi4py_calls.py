"""An mpi4py program that writes down every MPI call it makes.

Buffer methods (upper case) are one MPI call each. Object methods (lower case) pickle: mpi4py
4.1 sends a pickled object's size and then its bytes, so `bcast` is two broadcasts (an 8-byte
MPI_Count, then the pickle), `gather`/`scatter`/`allgather`/`alltoall` are a fixed-size
collective of counts followed by its v-variant, and `send`/`recv` are one message each (`recv`
through MPI_Mprobe + MPI_Mrecv). Object reductions use `mpi4py.rc.fast_reduce = False`: the
allgather-based form, on the caller's communicator (the default form runs on a private
duplicate).

Each rank writes `call COMM OP BYTES` lines to OUT_DIR/rank-R.txt, with bytes as commscope
counts them (docs/trace-format.md): the whole buffer for all-reduce and broadcast, the gathered
total for all-gather and all-to-all, the sum of the counts for v-variants, the root's total or a
member's own part for rooted v-variants, bytes sent or received for point-to-point.

Usage: mpi4py_calls.py OUT_DIR [ITERATIONS]  (4 ranks)
"""

import array
import os
import sys

import mpi4py

mpi4py.rc.fast_reduce = False
from mpi4py import MPI  # noqa: E402

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
out_dir = sys.argv[1]
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 1
out = open(os.path.join(out_dir, f"rank-{rank}.txt"), "w")
W = "MPI_COMM_WORLD"
COUNT = 8  # MPI_Count


def expect(comm, op, nbytes):
    out.write(f"call {comm} {op} {nbytes}\n")


def plen(obj):
    return len(MPI.pickle.dumps(obj))


def obj_of(r):
    return {"rank": r, "payload": list(range(r + 3))}


def object_collectives(comm, name, crank, csize, members):
    """members[i] is the world rank of comm rank i (objects depend on it)."""
    data = comm.bcast(obj_of(members[0]) if crank == 0 else None, root=0)
    assert data == obj_of(members[0])
    expect(name, "broadcast", COUNT)
    expect(name, "broadcast", plen(obj_of(members[0])))

    items = comm.gather(obj_of(members[crank]), root=0)
    expect(name, "gather", COUNT * csize)
    if crank == 0:
        assert items == [obj_of(m) for m in members]
        expect(name, "gatherv", sum(plen(obj_of(m)) for m in members))
    else:
        expect(name, "gatherv", plen(obj_of(members[crank])))

    pieces = [("piece", i) for i in range(csize)]
    got = comm.scatter(pieces if crank == 0 else None, root=0)
    assert got == ("piece", crank)
    expect(name, "scatter", COUNT * csize)
    if crank == 0:
        expect(name, "scatterv", sum(plen(p) for p in pieces))
    else:
        expect(name, "scatterv", plen(pieces[crank]))

    everyone = comm.allgather(obj_of(members[crank]))
    assert everyone == [obj_of(m) for m in members]
    expect(name, "allgather", COUNT * csize)
    expect(name, "allgatherv", sum(plen(obj_of(m)) for m in members))

    sends = [(members[crank], j) for j in range(csize)]
    recvd = comm.alltoall(sends)
    assert recvd == [(members[j], crank) for j in range(csize)]
    expect(name, "alltoall", COUNT * csize)
    expect(name, "alltoallv", sum(plen(x) for x in sends))

    total = comm.allreduce(members[crank], op=MPI.SUM)
    assert total == sum(members)
    expect(name, "allgather", COUNT * csize)
    expect(name, "allgatherv", sum(plen(m) for m in members))

    comm.barrier()
    expect(name, "barrier", 0)


for _ in range(iterations):
    # Buffer collectives on the world communicator.
    a = array.array("d", [float(rank)] * 8)
    b = array.array("d", [0.0] * 8)
    world.Allreduce(a, b, op=MPI.SUM)
    assert b[0] == sum(range(size))
    expect(W, "allreduce", 64)
    world.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
    expect(W, "allreduce", 64)
    world.Bcast(b, root=size - 1)
    expect(W, "broadcast", 64)
    world.Reduce(a, b, op=MPI.MAX, root=0)
    expect(W, "reduce", 64)
    g = array.array("i", [0] * size)
    world.Allgather(array.array("i", [rank]), g)
    assert list(g) == list(range(size))
    expect(W, "allgather", 4 * size)
    t = array.array("i", [rank * 10 + j for j in range(size)])
    u = array.array("i", [0] * size)
    world.Alltoall(t, u)
    assert list(u) == [j * 10 + rank for j in range(size)]
    expect(W, "alltoall", 4 * size)
    world.Barrier()
    expect(W, "barrier", 0)

    # Nonblocking collectives.
    world.Iallreduce(a, b, op=MPI.SUM).Wait()
    expect(W, "allreduce", 64)
    reqs = [world.Ibcast(b, root=0), world.Ibarrier()]
    MPI.Request.Waitall(reqs)
    expect(W, "broadcast", 64)
    expect(W, "barrier", 0)

    # Object collectives on the world communicator.
    object_collectives(world, W, rank, size, list(range(size)))

    # Split and Dup, named, each used.
    half = world.Split(rank % 2, rank)
    half.Set_name("parity")
    members = [r for r in range(size) if r % 2 == rank % 2]
    c = array.array("d", [1.0] * 4)
    half.Allreduce(MPI.IN_PLACE, c, op=MPI.SUM)
    assert c[0] == len(members)
    expect("parity", "allreduce", 32)
    dup = half.Dup()
    dup.Set_name("parity-dup")
    object_collectives(dup, "parity-dup", dup.Get_rank(), dup.Get_size(), members)
    dup.Free()
    half.Free()

    # Point-to-point: a ring of buffers received with wildcards, then of objects.
    right, left = (rank + 1) % size, (rank - 1) % size
    sreq = world.Isend(a, dest=right, tag=5)
    st = MPI.Status()
    world.Recv(b, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
    assert st.Get_source() == left and st.Get_tag() == 5
    sreq.Wait()
    expect(W, "send", 64)
    expect(W, "recv", 64)
    msg = ("hello", rank)
    sreq = world.isend(msg, dest=right, tag=6)
    got = world.recv(source=MPI.ANY_SOURCE, tag=6)
    assert got == ("hello", left)
    sreq.wait()
    expect(W, "send", plen(msg))
    expect(W, "recv", plen(("hello", left)))
    rreq = world.irecv(source=left, tag=7)
    world.send(msg, dest=right, tag=7)
    assert rreq.wait() == ("hello", left)
    expect(W, "recv", plen(("hello", left)))
    expect(W, "send", plen(msg))

out.close()
if rank == 0:
    print("done", size)
