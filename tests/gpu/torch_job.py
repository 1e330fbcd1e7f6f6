"""A one-rank torch.distributed NCCL job for tests/gpu/check.sh: all-reduces and all-gathers."""
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
dist.destroy_process_group()
print("torch job done")
