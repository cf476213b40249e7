"""The torch.distributed backend "qcoll" on CPU tensors: every collective and dtype against
a float64 reference and bitwise across ranks, 2 and 4 processes, over shm and tcp; async
work and futures; errors (a killed rank, an unsupported op or dtype); what it says of
CUDA tensors without a GPU (test_cuda.py has them where one is)."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from conftest import run_ranks
from reference import DTYPES, OPS
from reference import inputs as _inputs
from reference import reference as _reference
from reference import send_recv_around_the_ring

def every_collective(rank, size):
    import qcoll.torch

    checked = []
    for dtype in DTYPES:
        for count in (0, 1, 37, 100_003):
            for name, op in OPS.items():
                tensor = _inputs(rank, count, dtype)
                dist.all_reduce(tensor, op=op)
                expected = _reference(size, count, dtype, name).to(dtype)
                assert torch.equal(tensor, expected), f"all_reduce {name} {dtype} {count}"
                checked.append(tensor.view(torch.uint8).numpy().tobytes())
            # broadcast from the last rank
            tensor = _inputs(rank, count, dtype)
            dist.broadcast(tensor, src=size - 1)
            assert torch.equal(tensor, _inputs(size - 1, count, dtype)), f"broadcast {dtype} {count}"
            # all_gather: a list, and into one tensor
            outputs = [torch.empty(count, dtype=dtype) for _ in range(size)]
            dist.all_gather(outputs, _inputs(rank, count, dtype))
            for r in range(size):
                assert torch.equal(outputs[r], _inputs(r, count, dtype)), f"all_gather {dtype} {count}"
            gathered = torch.empty(size * count, dtype=dtype)
            dist.all_gather_into_tensor(gathered, _inputs(rank, count, dtype))
            assert torch.equal(gathered, torch.cat([_inputs(r, count, dtype) for r in range(size)]))
            # reduce_scatter: rank r gets block r of the sum of the ranks' concatenations
            pieces = [_inputs(rank, count, dtype) * (b + 1) for b in range(size)]
            mine = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(mine, pieces, op=dist.ReduceOp.SUM)
            expected = (_reference(size, count, dtype, "sum") * (rank + 1)).to(dtype)
            assert torch.equal(mine, expected), f"reduce_scatter {dtype} {count}"
            mine2 = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(mine2, torch.cat(pieces), op=dist.ReduceOp.SUM)
            assert torch.equal(mine2, expected), f"reduce_scatter_tensor {dtype} {count}"
    dist.barrier()
    # send and recv around the ring (small: a send completes once the transport has it)
    arrived, expected = send_recv_around_the_ring(rank, size)
    assert torch.equal(arrived, expected)
    # a non-contiguous tensor is reduced in place, as PyTorch's other backends do
    strided = torch.arange(20, dtype=torch.float32).view(4, 5).t()
    dist.all_reduce(strided)
    assert torch.equal(strided, (torch.arange(20, dtype=torch.float32) * size).view(4, 5).t())
    return qcoll.torch.transport(), checked


def _spread_addend(rank, dtype, count=4099):
    """Rank r's tensor: signs and exponents spread wide (2^-20..2^20; 2^-6..2^6 for float16)."""
    g = torch.Generator().manual_seed(1000 + rank)
    spread = 6 if dtype == torch.float16 else 20
    scale = torch.pow(2.0, torch.randint(-spread, spread + 1, (count,), generator=g).double())
    return (torch.randn(count, generator=g, dtype=torch.float64) * scale).to(dtype)


def reproducible_sums(rank, size):
    import qcoll.torch

    group = dist.new_group(list(range(size)), pg_options=qcoll.torch.Options(reproducible=True))
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for op, average in ((dist.ReduceOp.SUM, False), (dist.ReduceOp.AVG, True)):
            tensor = _spread_addend(rank, dtype)
            dist.all_reduce(tensor, op=op, group=group)
            expected = qcoll.torch.reproducible_sum([_spread_addend(r, dtype) for r in range(size)], average)
            assert torch.equal(tensor.view(torch.uint8), expected.view(torch.uint8)), f"{dtype} {op}"
            # reduce_scatter: this rank's block of the same bits
            count = 1024 * size
            block = torch.empty(1024, dtype=dtype)
            dist.reduce_scatter_tensor(block, _spread_addend(rank, dtype, count), op=op, group=group)
            whole = qcoll.torch.reproducible_sum([_spread_addend(r, dtype, count) for r in range(size)], average)
            mine = whole[rank * 1024:(rank + 1) * 1024]
            assert torch.equal(block.view(torch.uint8), mine.view(torch.uint8)), f"reduce_scatter {dtype} {op}"
    # the group's other calls are the ordinary ones
    ones = torch.ones(10)
    dist.all_reduce(ones, op=dist.ReduceOp.MAX, group=group)
    assert torch.equal(ones, torch.ones(10))
    return True


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "halving_doubling"])
def test_a_reproducible_group_sums_to_the_bits_of_one_process_whatever_the_algorithm(size, algorithm):
    run_ranks(size, reproducible_sums, env={"QCOLL_ALLREDUCE_ALGO": algorithm})


def sum_of_ranks_on_cpu(rank, size):
    import qcoll.torch

    tensor = torch.full((1000,), float(rank + 1))
    dist.all_reduce(tensor)
    assert torch.equal(tensor, torch.full((1000,), float(size * (size + 1) // 2)))
    return qcoll.torch.transport()


def test_cuda_peer_named_joins_over_shm_and_takes_cpu_tensors_there():
    # CUDA tensors then go GPU to GPU (test_cuda.py, where a GPU is); CPU tensors over its shm.
    results = run_ranks(2, sum_of_ranks_on_cpu, env={"QCOLL_TRANSPORT": "cuda_peer"})
    assert set(results.values()) == {"cuda_peer"}


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_every_collective_and_dtype_matches_the_reference_and_every_rank(size, transport):
    results = run_ranks(size, every_collective, env={"QCOLL_TRANSPORT": transport})
    assert {results[r][0] for r in results} == {transport}
    first = results[0][1]
    for r in range(1, size):
        assert results[r][1] == first, f"rank {r}'s results differ from rank 0's"


def test_tls_over_tcp_matches_the_reference_on_every_rank():
    # QCOLL_TLS=1 (keyed by the secret): the data connections encrypted; every_collective
    # checks each result against the reference, as over plain TCP above.
    results = run_ranks(2, every_collective, env={"QCOLL_TRANSPORT": "tcp", "QCOLL_SECRET": "py-tls", "QCOLL_TLS": "1"})
    assert {results[r][0] for r in results} == {"tcp"}
    assert results[1][1] == results[0][1], "rank 1's results over TLS differ from rank 0's"
    # The backend read QCOLL_TLS: without a secret, it refuses it, saying why.
    with pytest.raises(pytest.fail.Exception, match="QCOLL_TLS=1 without a secret"):
        run_ranks(2, every_collective, env={"QCOLL_TRANSPORT": "tcp", "QCOLL_SECRET": "", "QCOLL_TLS": "1"})


def async_calls_return_before_the_exchange(rank, size):
    tensor = torch.ones(1 << 20) * (rank + 1)
    if rank == 1:
        time.sleep(2.0)  # rank 0's call cannot complete before rank 1 joins it
    started = time.monotonic()
    work = dist.all_reduce(tensor, async_op=True)
    returned = time.monotonic() - started
    future = work.get_future().then(lambda done: done.value()[0].sum().item())
    work.wait()
    total = future.wait()
    assert torch.equal(tensor, torch.full((1 << 20,), float(size * (size + 1) // 2)))
    assert total == float(size * (size + 1) // 2) * (1 << 20)
    return returned


def test_async_op_returns_before_the_exchange_and_its_future_completes():
    returned = run_ranks(2, async_calls_return_before_the_exchange)
    assert returned[0] < 1.0, f"rank 0's async all_reduce took {returned[0]:.2f} s to return"


def a_rank_dies(rank, size):
    if rank == size - 1:
        os._exit(0)  # dies without a word, as a killed process does
    tensor = torch.ones(1000)
    started = time.monotonic()
    try:
        dist.all_reduce(tensor)
    except RuntimeError as e:
        return str(e), time.monotonic() - started
    return "no error", time.monotonic() - started


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_dead_peer_fails_every_survivor_with_an_error_naming_it(transport):
    results = run_ranks(3, a_rank_dies, env={"QCOLL_TRANSPORT": transport, "QCOLL_TEST_TIMEOUT_S": "20"},
                        expect_exit=(2,), timeout=60)
    for rank in (0, 1):
        message, seconds = results[rank]
        assert "all_reduce" in message and "peer 2" in message, f"rank {rank}: {message}"
        assert seconds < 20, f"rank {rank} waited {seconds:.1f} s"


INTEGER_OPS = {k: v for k, v in OPS.items() if k != "avg"}


def integers_and_bool(rank, size):
    # Reduced in float64 by the backend: exact within ±2^53, checked against torch's own
    # integer arithmetic, through all_reduce and reduce_scatter_tensor.
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
        values = torch.tensor([((rank + 2 * i) % 5) - (0 if dtype in (torch.uint8, torch.bool) else 2)
                               for i in range(101)]).to(dtype)
        stack = torch.stack([torch.tensor([((r + 2 * i) % 5) - (0 if dtype in (torch.uint8, torch.bool) else 2)
                                           for i in range(101)]).to(dtype) for r in range(size)])
        for name, op in INTEGER_OPS.items():
            if dtype == torch.bool:
                expected = {"sum": stack.any(0), "max": stack.any(0), "product": stack.all(0), "min": stack.all(0)}[name]
            else:
                expected = {"sum": stack.sum(0, dtype=dtype), "product": stack.prod(0, dtype=dtype),
                            "min": stack.min(0).values, "max": stack.max(0).values}[name]
            tensor = values.clone()
            dist.all_reduce(tensor, op=op)
            assert torch.equal(tensor, expected), f"all_reduce {name} {dtype}: {tensor[:8]} vs {expected[:8]}"
        mine = torch.empty(101, dtype=dtype)
        dist.reduce_scatter_tensor(mine, torch.cat([values] * size), op=dist.ReduceOp.MAX)
        assert torch.equal(mine, stack.max(0).values if dtype != torch.bool else stack.any(0)), f"reduce_scatter {dtype}"
    # 2^53 - 1 on one rank cannot be summed exactly in float64 (with another rank's 2 it
    # leaves ±2^53): every rank fails alike, and the tensor is left as it was.
    big = torch.full((8,), 2 if rank else (1 << 53) - 1, dtype=torch.int64)
    before = big.clone()
    try:
        dist.all_reduce(big)
        message = "no error"
    except RuntimeError as e:
        message = str(e)
    assert torch.equal(big, before)
    # ... but its maximum is exact (max only compares).
    dist.all_reduce(big, op=dist.ReduceOp.MAX)
    assert torch.equal(big, torch.full((8,), (1 << 53) - 1, dtype=torch.int64))
    return message


def test_integers_and_bool_reduce_exactly_and_fail_alike_beyond_two_to_the_53():
    messages = run_ranks(2, integers_and_bool)
    for rank, message in messages.items():
        assert "±2^53" in message and "all_reduce" in message and "Long" in message, f"rank {rank}: {message}"


def refuses_what_it_does_not_support(rank, size):
    errors = []
    for call in (
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.float8_e4m3fn)),
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG),
        lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND),
    ):
        try:
            call()
            errors.append("no error")
        except (RuntimeError, ValueError) as e:
            errors.append(str(e))
    # The tensors it cannot reduce it still moves: broadcast is a copy of bytes.
    moved = torch.full((3,), float(rank + 1), dtype=torch.float8_e4m3fn)
    dist.broadcast(moved, src=1)
    errors.append(moved.float().tolist())
    # Complex tensors torch.distributed itself hands over as real pairs (float32 here).
    pairs = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(pairs)
    errors.append(pairs.tolist())
    return errors


def test_unsupported_dtypes_and_ops_are_clear_errors():
    results = run_ranks(2, refuses_what_it_does_not_support)
    dtype_error, average_error, op_error, moved, pairs = results[0]
    assert "Float8_e4m3fn" in dtype_error and "float32" in dtype_error, dtype_error
    assert "average" in average_error and "Int" in average_error, average_error
    assert "not supported" in op_error, op_error
    assert moved == [2.0] * 3
    assert pairs == [complex(1, 2)] * 3


def test_without_a_gpu_the_bridge_says_why_cuda_tensors_cannot_run():
    # (test_cuda.py checks CUDA tensors where a GPU is.) Here a CUDA build of the bridge
    # names the missing GPU, a CPU-only build the reason it has no CUDA.
    import qcoll.torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: test_cuda.py")
    reason = qcoll.torch.cuda_unavailable_reason()
    assert not qcoll.torch.cuda_available()
    if qcoll.torch.built_with_cuda:
        assert "no CUDA device" in reason, reason
    else:
        assert "no CUDA support" in reason and "rebuild" in reason, reason
