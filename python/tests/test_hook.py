"""The DDP communication hook: inside DDP training, on the qcoll backend and on gloo,
every rank ends with bitwise the same parameters and the loss falls; bfloat16
gradients; torchrun runs the backend and the hook. (The bytes the hook saves are
measured by test_example.py.)"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from conftest import free_port, run_ranks

HERE = pathlib.Path(__file__).resolve().parent


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def ddp_training(rank, size, quantizer, dtype_name):
    import qcoll.torch.hooks as hooks

    model = _model().to(getattr(torch, dtype_name))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    state = hooks.CompressedState(quantizer=quantizer, bits=4)
    ddp.register_comm_hook(state, hooks.compressed_allreduce)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    generator = torch.Generator().manual_seed(100 + rank)
    inputs = torch.randn(256, 64, generator=generator)
    targets = inputs[:, :10].argmax(1)  # the same rule on every rank: learnable
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(inputs.to(model[0].weight.dtype)).float(), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    parameters = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    return parameters.view(torch.uint8).numpy().tobytes(), losses, state.bytes_sent(), parameters.numel()


# Each quantizer once, the backends in turn (the hook's communicator is its own either way).
@pytest.mark.parametrize("backend,quantizer",
                         [("qcoll", "one_bit"), ("gloo", "k_level"), ("qcoll", "bfp"), ("gloo", "identity")])
def test_the_hook_trains_and_every_rank_ends_with_the_same_parameters(backend, quantizer):
    results = run_ranks(2, ddp_training, quantizer, "float32", backend=backend)
    assert results[0][0] == results[1][0], "the ranks' parameters differ"
    losses = results[0][1]
    assert losses[-1] < 0.9 * losses[0], f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"


def test_bfloat16_gradients_go_through_the_hook():
    results = run_ranks(2, ddp_training, "one_bit", "bfloat16", backend="gloo")
    assert results[0][0] == results[1][0]


def test_torchrun_runs_the_backend_and_the_hook(tmp_path):
    script = HERE / "torchrun_script.py"
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(script)],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("torchrun ok") == 2, result.stdout + result.stderr
