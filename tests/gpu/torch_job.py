"""A one-rank torch.distributed NCCL job for tests/gpu/check.sh: all-reduces and all-gathers, then
an all-reduce captured into a CUDA graph and the graph replayed 5 times (reported, not fatal, when
this PyTorch cannot capture NCCL collectives)."""
import os

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
dist.init_process_group("nccl", rank=0, world_size=1)
dev = torch.device("cuda", 0)
x = torch.ones(16 << 20, device=dev)  # 64 MiB of float32
for _ in range(20):
    dist.all_reduce(x)
outs = [torch.empty(4 << 20, device=dev)]
for _ in range(10):
    dist.all_gather(outs, x[: 4 << 20])
torch.cuda.synchronize()
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
