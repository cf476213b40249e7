"""The DDP communication hooks: inside DDP training, on the qcoll backend and on gloo,
every rank ends with bitwise the same parameters and the loss falls; bfloat16
gradients; the reproducible hook's parameters do not depend on the allreduce algorithm,
nor the reproducible compressed hook's on which rank holds which data;
torchrun runs the backend and the hook. (The bytes the hook saves are
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


def ten_steps(rank, size, hook, data_set=None):
    """Ten DDP steps on 3 ranks, gradients averaged by `hook` — "reproducible" (the
    reproducible hook), "one_bit" or "one_bit on the grid" (the compressed hook, plain or
    reproducible=True), None (the qcoll backend's ordinary all_reduce) — training on data
    set data_set[rank] (default: its rank); the final parameters' bytes."""
    import qcoll.torch.hooks as hooks

    model = _model()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    if hook == "reproducible":
        ddp.register_comm_hook(hooks.ReproducibleState(), hooks.reproducible_allreduce)
    elif hook is not None:
        state = hooks.CompressedState(quantizer="one_bit", reproducible=hook.endswith("on the grid"))
        ddp.register_comm_hook(state, hooks.compressed_allreduce)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    generator = torch.Generator().manual_seed(100 + (rank if data_set is None else data_set[rank]))
    inputs = torch.randn(64, 64, generator=generator)
    targets = inputs[:, :10].argmax(1)
    for _ in range(10):
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(inputs), targets).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).view(torch.uint8).numpy().tobytes()


# The reproducible hook: whichever allreduce algorithm the hook's communicator runs, the
# same parameters, bit for bit; the ordinary all_reduce's differ between algorithms
# (the control: what the hook removes).
def test_the_reproducible_hook_gives_the_same_bits_whatever_the_algorithm():
    def run(algorithm, hooked):
        results = run_ranks(3, ten_steps, "reproducible" if hooked else None, env={"QCOLL_ALLREDUCE_ALGO": algorithm})
        assert results[0] == results[1] == results[2], "the ranks' parameters differ"
        return results[0]

    algorithms = ["ring", "recursive_doubling", "halving_doubling"]
    hooked = {a: run(a, True) for a in algorithms}
    assert len(set(hooked.values())) == 1, "the reproducible hook's parameters depend on the algorithm"
    ordinary = {a: run(a, False) for a in ("ring", "recursive_doubling")}
    assert len(set(ordinary.values())) == 2, "control: the ordinary all_reduce gave the same bits for both algorithms"


# The compressed hook with reproducible=True: the same parameters, bit for bit, whichever
# rank trains on which data (the residuals follow the data); without it they differ (the
# control: the owners add the contributions in another order).
def test_the_reproducible_compressed_hook_does_not_depend_on_which_rank_holds_which_data():
    def run(reproducible, data_set):
        results = run_ranks(3, ten_steps, "one_bit on the grid" if reproducible else "one_bit", data_set)
        assert results[0] == results[1] == results[2], "the ranks' parameters differ"
        return results[0]

    assert run(True, [0, 1, 2]) == run(True, [2, 0, 1]), "the reproducible hook's parameters depend on the ranks' order"
    assert run(False, [0, 1, 2]) != run(False, [2, 0, 1]), "control: the ordinary hook gave the same bits"


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


def several_states_on_one_group(rank, size, transport):
    """Three DDP models on the world group, each with a CompressedState of its own: the
    first two trained one after the other (each state joins at its first call), then all
    three in turn step by step, as a GAN's generator and discriminator are."""
    import datetime

    import qcoll.torch.hooks as hooks

    def model_and_state(seed, quantizer):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        ddp = nn.parallel.DistributedDataParallel(model)
        state = hooks.CompressedState(quantizer=quantizer, transport=transport,
                                      timeout=datetime.timedelta(seconds=30))
        ddp.register_comm_hook(state, hooks.compressed_allreduce)
        return model, ddp, state, torch.optim.SGD(ddp.parameters(), lr=0.1)

    trained = [model_and_state(seed, quantizer) for seed, quantizer in ((1, "one_bit"), (2, "k_level"), (3, "bfp"))]
    generator = torch.Generator().manual_seed(7 + rank)

    def step(ddp, optimizer):
        inputs = torch.randn(32, 16, generator=generator)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(inputs), inputs[:, :4].argmax(1)).backward()
        optimizer.step()

    for model, ddp, state, optimizer in trained[:2]:  # sequential: one model, then the next
        for _ in range(3):
            step(ddp, optimizer)
    for _ in range(3):  # interleaved: the three in turn, the third joining on the way
        for model, ddp, state, optimizer in trained:
            step(ddp, optimizer)
    return [(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().tobytes(), state.bytes_sent(),
             state.communicator().transport) for model, ddp, state, optimizer in trained]


# Any number of states on one group, over either transport, on 2 and 4 ranks (issue 53:
# the second state's join read the first's keys from the store and failed or hung).
@pytest.mark.parametrize("transport,size", [("shm", 2), ("tcp", 2), ("shm", 4), ("tcp", 4)])
def test_several_states_share_one_process_group(transport, size):
    results = run_ranks(size, several_states_on_one_group, transport, backend="gloo", timeout=180)
    for index in range(3):
        parameters = {results[r][index][0] for r in range(size)}
        assert len(parameters) == 1, f"model {index}: the ranks' parameters differ"
        for r in range(size):
            _, sent, used = results[r][index]
            assert sent > 0, f"rank {r}: state {index} sent nothing"
            assert used == transport, f"rank {r}: state {index} used {used}"


def test_settings_the_quantizer_refuses_are_refused_when_the_state_is_made():
    import qcoll.torch.hooks as hooks

    for settings, named in (
        (dict(quantizer="k_level", bits=9), "bits=9"),
        (dict(quantizer="k_level", bits=0), "bits=0"),
        (dict(quantizer="bfp", bits=17), "not 17"),
        (dict(quantizer="one_bit", group_size=12), "not 12"),
        (dict(quantizer="two_bit"), "'two_bit'"),
    ):
        with pytest.raises(ValueError, match=named):
            hooks.CompressedState(**settings)
    hooks.CompressedState(quantizer="k_level", bits=8)  # the largest k_level takes
