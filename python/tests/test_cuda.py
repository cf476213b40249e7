"""The qcoll backend and the hook on CUDA tensors (cuda_checks.py's bodies on 2 ranks):
every collective, dtype and op against the reference and the CPU call's bits, over
shm, tcp and the CUDA peer transport (GPU to GPU: what auto picks on one host); stream
order (kernels queued before the call, and after it); futures; errors at submission;
the hook on CUDA gradients bit for bit as the CPU hook; reproducible sums of CUDA
tensors with the CPU's bits; DDP on CUDA. Skipped where
torch sees no GPU; where it does but this build of the bridge cannot run CUDA tensors,
only the test of that refusal runs."""

from __future__ import annotations

import pytest
import torch

import cuda_checks
import qcoll.torch
from conftest import run_ranks

no_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
_refusal = qcoll.torch.cuda_unavailable_reason() if torch.cuda.is_available() else None
runs_cuda = pytest.mark.skipif(_refusal is not None, reason=f"the bridge cannot run CUDA tensors here: {_refusal}")

pytestmark = no_gpu


@runs_cuda
@pytest.mark.parametrize("transport", ["shm", "tcp", "cuda_peer"])
def test_every_collective_on_cuda_tensors_matches_the_reference_and_the_cpu_call(transport):
    results = run_ranks(2, cuda_checks.every_collective, env={"QCOLL_TRANSPORT": transport}, timeout=600)
    assert results[0] == results[1], "the ranks' results differ"


@runs_cuda
@pytest.mark.parametrize("transport, gpu_to_gpu", [("auto", True), ("cuda_peer", True), ("shm", False)])
def test_cuda_tensors_on_one_host_move_gpu_to_gpu_unless_shm_is_named(transport, gpu_to_gpu):
    sent = run_ranks(2, cuda_checks.bytes_through_the_host, env={"QCOLL_TRANSPORT": transport}, timeout=300)
    for rank, nbytes in sent.items():
        if gpu_to_gpu:
            assert nbytes < 1 << 20, f"rank {rank}: {nbytes} bytes went through the host transport"
        else:
            assert nbytes >= 8 << 20, f"rank {rank}: only {nbytes} bytes went through the host transport"


@runs_cuda
def test_calls_are_ordered_on_the_current_stream_and_async_calls_return_at_once():
    returned = run_ranks(2, cuda_checks.stream_order, timeout=300)
    for rank, seconds in returned.items():
        assert max(seconds) < 0.25, f"rank {rank}: an async call took {max(seconds):.2f} s to return"


@runs_cuda
def test_block_current_stream_orders_the_stream_without_the_host():
    run_ranks(2, cuda_checks.block_current_stream, timeout=120)


@runs_cuda
def test_mixed_non_contiguous_and_other_device_tensors_are_clear_errors():
    for rank, messages in run_ranks(2, cuda_checks.errors, timeout=120).items():
        assert "one on the CPU" in messages["mixed"], f"rank {rank}: {messages['mixed']}"
        assert "one on the CPU" in messages["mixed_into_tensor"], f"rank {rank}: {messages['mixed_into_tensor']}"
        assert "non-contiguous" in messages["non_contiguous"], f"rank {rank}: {messages['non_contiguous']}"
        if "other_device" in messages:
            assert "current device" in messages["other_device"], f"rank {rank}: {messages['other_device']}"


@runs_cuda
@pytest.mark.parametrize("transport", ["shm", "cuda_peer"])
def test_reproducible_sums_of_cuda_tensors_have_the_cpu_bits(transport):
    run_ranks(2, cuda_checks.reproducible_sums_on_cuda, env={"QCOLL_TRANSPORT": transport}, timeout=600)


@runs_cuda
def test_the_hook_on_cuda_gradients_gives_the_cpu_hooks_bits():
    results = run_ranks(2, cuda_checks.hook_matches_cpu, timeout=600)
    assert results[0] == results[1], "the ranks' results differ"


@runs_cuda
@pytest.mark.parametrize("backend", ["qcoll", "gloo"])
def test_ddp_on_cuda_with_the_hook_trains_and_every_rank_ends_alike(backend):
    results = run_ranks(2, cuda_checks.ddp_training, backend=backend, timeout=600)
    assert results[0][0] == results[1][0], "the ranks' parameters differ"
    losses = results[0][1]
    assert losses[-1] < 0.9 * losses[0], f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"


def cuda_tensor_refused(rank, size):
    try:
        torch.distributed.all_reduce(torch.ones(4, device="cuda"))
    except RuntimeError as e:
        return str(e)
    return "no error"


@pytest.mark.skipif(torch.cuda.is_available() and _refusal is None, reason="the bridge runs CUDA tensors here")
def test_where_the_bridge_cannot_run_cuda_tensors_it_says_why():
    message = run_ranks(2, cuda_tensor_refused)[0]
    assert "cannot run here" in message and _refusal in message, message
