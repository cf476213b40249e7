"""Run by test_hook.py under torchrun: the qcoll backend from torchrun's environment
(no init_method, no second rendezvous), an allreduce, and DDP with the one_bit hook."""

import torch
import torch.distributed as dist
import torch.nn as nn

import qcoll.torch
import qcoll.torch.hooks as hooks

dist.init_process_group("qcoll")
rank, size = dist.get_rank(), dist.get_world_size()
tensor = torch.full((10,), float(rank + 1))
dist.all_reduce(tensor)
assert torch.equal(tensor, torch.full((10,), float(size * (size + 1) // 2))), tensor

torch.manual_seed(0)
model = nn.Linear(32, 4)
ddp = nn.parallel.DistributedDataParallel(model)
state = hooks.CompressedState(quantizer="one_bit")
ddp.register_comm_hook(state, hooks.compressed_allreduce)
loss = ddp(torch.randn(8, 32)).square().mean()
loss.backward()
gathered = [torch.empty_like(model.weight.grad) for _ in range(size)]
dist.all_gather(gathered, model.weight.grad)
assert all(torch.equal(g, gathered[0]) for g in gathered), "the ranks' gradients differ"
print(f"torchrun ok: rank {rank} of {size} over {qcoll.torch.transport()}", flush=True)
dist.destroy_process_group()
