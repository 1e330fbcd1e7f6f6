"""A torch.distributed NCCL job for tests/gpu/check.sh, one rank per GPU (started by torchrun, or
alone as rank 0 of 1): all-reduces and all-gathers, then an all-reduce captured into a CUDA graph
and the graph replayed 5 times (reported, not fatal, when this PyTorch cannot capture NCCL
collectives). Rank 0 prints "result: …" lines that must be the same with and without the shim.

PyTorch reaches libnccl.so.2 through its extension module's private dependencies, which is what
the check is about."""
import os

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
local = int(os.environ.get("LOCAL_RANK", "0"))
dist.init_process_group("nccl", rank=rank, world_size=world)
dev = torch.device("cuda", local)
torch.cuda.set_device(dev)
x = torch.ones(16 << 20, device=dev)  # 64 MiB of float32
for _ in range(20):
    dist.all_reduce(x)
    x /= world
outs = [torch.empty(4 << 20, device=dev)]
for _ in range(10):
    dist.all_gather(outs, x[: 4 << 20])
torch.cuda.synchronize()
z = torch.arange(1024, dtype=torch.float64, device=dev) * (rank + 1)
dist.all_reduce(z)
if rank == 0:
    print(f"result: all-reduce checksum {z.sum().item():.1f}, x[0] {x[0].item():.1f}, world {world}")
launches = 0
try:
    y = torch.ones(1 << 20, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(y)  # warm-up outside the capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(y)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    launches = 5
except Exception as e:  # noqa: BLE001 - reported by check.sh
    print(f"graph capture unavailable: {type(e).__name__}: {e}")
print(f"graph launches: {launches}")
try:
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - the records are written; teardown is not under test
    print(f"destroy_process_group: {type(e).__name__}: {e}")
print("torch job done")
