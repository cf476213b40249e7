"""Inputs whose reductions are exact in every dtype, and their float64 reference: shared
by the CPU tests (test_backend.py) and the CUDA ones (cuda_checks.py), which must not
need pytest (tools/gpu-check runs cuda_tensor_check.py without it)."""

from __future__ import annotations

import torch
import torch.distributed as dist

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]

OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
}


def inputs(rank, count, dtype):
    # Small integers and halves: every sum, product, mean (of 2 or 4), minimum and
    # maximum below is exact in every dtype, so the float64 reference is the answer.
    values = (torch.arange(count, dtype=torch.int64) * 3 + rank) % 7 - 3
    values = values.to(torch.float64)
    values[::5] = 0.5 * (rank + 1)
    return values.to(dtype)


def reference(size, count, dtype, op):
    stack = torch.stack([inputs(r, count, dtype).to(torch.float64) for r in range(size)])
    if op == "sum":
        return stack.sum(0)
    if op == "avg":
        return stack.mean(0)
    if op == "product":
        return stack.prod(0)
    if op == "min":
        return stack.min(0).values
    return stack.max(0).values


def send_recv_around_the_ring(rank, size, device=None):
    """Every rank sends 1000 copies of its rank to the next and receives the previous
    one's (even ranks send first, so no two wait on each other); returns what arrived
    and what should have."""
    outgoing = torch.full((1000,), float(rank), device=device)
    incoming = torch.empty(1000, device=device)
    if rank % 2 == 0:
        dist.send(outgoing, dst=(rank + 1) % size)
        dist.recv(incoming, src=(rank - 1) % size)
    else:
        dist.recv(incoming, src=(rank - 1) % size)
        dist.send(outgoing, dst=(rank + 1) % size)
    return incoming.cpu(), torch.full((1000,), float((rank - 1) % size))
