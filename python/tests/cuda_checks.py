"""What every rank runs to check the qcoll backend and the hook on CUDA tensors: used by
test_cuda.py (pytest, where a GPU is) and by cuda_tensor_check.py (tools/gpu-check runs
it on the GPU machine without pytest, so nothing here imports pytest). Each body runs on
one rank of an initialised process group and raises AssertionError naming what went
wrong. Ranks share the GPUs there are: rank r uses cuda:(r mod count)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn

from reference import DTYPES, OPS, inputs, reference, send_recv_around_the_ring


def device_of_rank(rank):
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _bits(tensor):
    """The tensor's bytes on the host: equal bits, NaNs and signed zeros included."""
    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def every_collective(rank, size):
    """Every collective the backend takes, on CUDA tensors of every dtype and op, against
    the float64 reference and against the same call on CPU tensors (the same bits);
    returns what every rank must have alike."""
    device = device_of_rank(rank)
    alike = []
    for dtype in DTYPES:
        for count in (0, 1, 37, 100_003):
            for name, op in OPS.items():
                on_gpu = inputs(rank, count, dtype).to(device)
                on_cpu = inputs(rank, count, dtype)
                dist.all_reduce(on_gpu, op=op)
                dist.all_reduce(on_cpu, op=op)
                expected = reference(size, count, dtype, name).to(dtype)
                assert on_gpu.device == device, f"all_reduce {name} {dtype} {count}: moved to {on_gpu.device}"
                assert torch.equal(on_gpu.cpu(), expected), f"all_reduce {name} {dtype} {count}"
                assert _bits(on_gpu) == _bits(on_cpu), f"all_reduce {name} {dtype} {count}: not the CPU call's bits"
                alike.append(_bits(on_gpu))
            # broadcast from the last rank
            tensor = inputs(rank, count, dtype).to(device)
            dist.broadcast(tensor, src=size - 1)
            assert torch.equal(tensor.cpu(), inputs(size - 1, count, dtype)), f"broadcast {dtype} {count}"
            # all_gather: a list, and into one tensor
            outputs = [torch.empty(count, dtype=dtype, device=device) for _ in range(size)]
            dist.all_gather(outputs, inputs(rank, count, dtype).to(device))
            for r in range(size):
                assert torch.equal(outputs[r].cpu(), inputs(r, count, dtype)), f"all_gather {dtype} {count}"
            gathered = torch.empty(size * count, dtype=dtype, device=device)
            dist.all_gather_into_tensor(gathered, inputs(rank, count, dtype).to(device))
            assert torch.equal(gathered.cpu(), torch.cat([inputs(r, count, dtype) for r in range(size)]))
            # reduce_scatter: rank r gets block r of the sum of the ranks' concatenations
            pieces = [(inputs(rank, count, dtype) * (b + 1)).to(device) for b in range(size)]
            expected = (reference(size, count, dtype, "sum") * (rank + 1)).to(dtype)
            mine = torch.empty(count, dtype=dtype, device=device)
            dist.reduce_scatter(mine, pieces, op=dist.ReduceOp.SUM)
            assert torch.equal(mine.cpu(), expected), f"reduce_scatter {dtype} {count}"
            mine2 = torch.empty(count, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(mine2, torch.cat(pieces), op=dist.ReduceOp.SUM)
            assert torch.equal(mine2.cpu(), expected), f"reduce_scatter_tensor {dtype} {count}"
    # Integers and bool are reduced in float64, as on the CPU.
    for dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
        values = torch.tensor([(rank + 2 * i) % 5 for i in range(101)]).to(dtype)
        stack = torch.stack([torch.tensor([(r + 2 * i) % 5 for i in range(101)]).to(dtype) for r in range(size)])
        tensor = values.to(device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        assert torch.equal(tensor.cpu(), stack.any(0) if dtype == torch.bool else stack.max(0).values), f"max {dtype}"
    # Any dtype moves as bytes, an odd number of them through a padded copy.
    odd = torch.full((3,), rank + 7, dtype=torch.uint8, device=device)
    dist.broadcast(odd, src=0)
    assert odd.cpu().tolist() == [7, 7, 7], "broadcast of 3 bytes"
    odd_all = [torch.empty(3, dtype=torch.uint8, device=device) for _ in range(size)]
    dist.all_gather(odd_all, torch.full((3,), rank, dtype=torch.uint8, device=device))
    assert [t.cpu().tolist() for t in odd_all] == [[r] * 3 for r in range(size)], "all_gather of 3 bytes"
    # A barrier on the device, and send/recv around the ring.
    dist.barrier(device_ids=[device.index])
    arrived, expected = send_recv_around_the_ring(rank, size, device)
    assert torch.equal(arrived, expected), "send/recv"
    return alike


SLEEP_CYCLES = 1_000_000_000  # torch.cuda._sleep: about 0.5 s at an H100's or H200's clock


def stream_order(rank, size):
    """A call on CUDA tensors runs after the kernels queued on the current stream before
    it — a long kernel, then the one that writes its input — and a kernel queued after
    wait() sees its result; on the default stream and on a stream of the caller's own.
    The async call returns at once, before the long kernel has run. Returns how long the
    async calls took to return, in seconds."""
    device = device_of_rank(rank)
    total = float(size * (size + 1) // 2)
    returned = []
    warm = torch.ones(1, device=device)
    dist.all_reduce(warm)  # the first call starts qcoll's CUDA runtime: not what is timed below
    for own_stream in (False, True):
        stream = torch.cuda.Stream(device) if own_stream else torch.cuda.current_stream(device)
        with torch.cuda.stream(stream):
            for asynchronous in (True, False):
                x = torch.zeros(1 << 20, device=device)
                torch.cuda._sleep(SLEEP_CYCLES)  # queued before the call...
                x.fill_(rank + 1)  # ... and so is what writes its input
                started = time.monotonic()
                work = dist.all_reduce(x, async_op=asynchronous)
                if asynchronous:
                    returned.append(time.monotonic() - started)
                    work.wait()
                after = x * 2  # queued after the call, on the same stream
                stream.synchronize()
                where = f"{'own' if own_stream else 'default'} stream, {'async' if asynchronous else 'sync'}"
                assert torch.equal(x.cpu(), torch.full((1 << 20,), total)), f"{where}: {x[:4].tolist()}"
                assert torch.equal(after.cpu(), torch.full((1 << 20,), 2 * total)), f"{where}: the kernel after"
        # The future: CUDA-aware, its value ordered before what the caller queues after wait().
        with torch.cuda.stream(stream):
            x = torch.zeros(4096, device=device)
            torch.cuda._sleep(SLEEP_CYCLES // 10)
            x.fill_(rank + 1)
            future = dist.all_reduce(x, async_op=True).get_future()
            doubled = future.then(lambda done: done.value()[0] * 2).wait()
            assert torch.equal(doubled.cpu(), torch.full((4096,), 2 * total)), "the future's callback"
    return returned


def block_current_stream(rank, size):
    """torch's Work.block_current_stream(): the host returns at once and the current stream
    waits (a spinning kernel until the work's future completes)."""
    device = device_of_rank(rank)
    x = torch.full((1 << 16,), float(rank + 1), device=device)
    work = dist.all_reduce(x, async_op=True)
    work.block_current_stream()
    after = x * 2
    torch.cuda.current_stream(device).synchronize()
    total = float(size * (size + 1) // 2)
    assert torch.equal(after.cpu(), torch.full((1 << 16,), 2 * total)), after[:4].tolist()


def errors(rank, size):
    """The errors at submission: mixed CPU and CUDA tensors, a non-contiguous CUDA tensor,
    a tensor on another device than the current one (with two GPUs); the group still
    works afterwards. Returns {case: message}."""
    device = device_of_rank(rank)
    messages = {}

    def attempt(name, call):
        try:
            call()
            messages[name] = "no error"
        except (RuntimeError, ValueError) as e:
            messages[name] = str(e)

    attempt("mixed", lambda: dist.all_gather([torch.empty(4) for _ in range(size)], torch.ones(4, device=device)))
    attempt("mixed_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(4 * size), torch.ones(4, device=device)))
    attempt("non_contiguous", lambda: dist.all_reduce(torch.arange(20.0, device=device).view(4, 5).t()))
    if torch.cuda.device_count() > 1:
        other = torch.device("cuda", (device.index + 1) % torch.cuda.device_count())
        attempt("other_device", lambda: dist.all_reduce(torch.ones(4, device=other)))
    x = torch.ones(4, device=device)
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((4,), float(size))), "the group after the errors"
    return messages


class Bucket:
    """What the hook reads of a DDP GradBucket."""

    def __init__(self, index, buffer):
        self._index, self._buffer = index, buffer

    def index(self):
        return self._index

    def buffer(self):
        return self._buffer


def hook_matches_cpu(rank, size):
    """The hook on CUDA gradients (plans on device memory) gives the CPU hook's results
    bit for bit, step after step (error feedback carried), for every quantizer and
    gradient dtype. Returns the results' bytes, which every rank must have alike."""
    import qcoll.torch.hooks as hooks

    device = device_of_rank(rank)
    state = hooks.CompressedState(quantizer="one_bit", group_size=256, bits=4)
    generator = torch.Generator().manual_seed(1000 + rank)
    alike = []
    key = 0
    for quantizer in ("one_bit", "k_level", "bfp", "identity"):
        state.compression.quantizer = quantizer
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            key += 2  # the CPU plan's key, and the CUDA plan's (each keeps its own residuals)
            for step in range(3):
                gradient = torch.randn(10_007, generator=generator).to(dtype)
                on_cpu = hooks.compressed_allreduce(state, Bucket(key, gradient.clone())).wait()
                on_gpu = hooks.compressed_allreduce(state, Bucket(key + 1, gradient.to(device))).wait()
                assert on_gpu.device == device, f"{quantizer} {dtype}: the result moved to {on_gpu.device}"
                assert _bits(on_gpu) == _bits(on_cpu), f"{quantizer} {dtype} step {step}: not the CPU hook's bits"
                alike.append(_bits(on_gpu))
    return alike


def ddp_training(rank, size):
    """DDP on CUDA with the one_bit hook (its process group on qcoll's backend: DDP's
    own broadcasts and checks run on CUDA tensors through it): the loss falls and every
    rank ends with the same parameters. Returns (parameters' bytes, losses)."""
    import qcoll.torch.hooks as hooks

    device = device_of_rank(rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index], bucket_cap_mb=0.25)
    state = hooks.CompressedState(quantizer="one_bit")
    ddp.register_comm_hook(state, hooks.compressed_allreduce)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    generator = torch.Generator().manual_seed(100 + rank)
    batch = torch.randn(256, 64, generator=generator)
    targets = batch[:, :10].argmax(1).to(device)
    batch = batch.to(device)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(batch), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    parameters = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return _bits(parameters), losses


def bytes_through_the_host(rank, size):
    """A 16 MiB all_reduce of CUDA tensors, after a first one (which starts the CUDA peer
    transport where the group uses it); returns the bytes the group's host transport sent
    for the second: about none when the tensors move GPU to GPU, the ring's share of the
    data when they are staged through host memory."""
    import qcoll.torch

    device = device_of_rank(rank)
    tensor = torch.ones(4 << 20, device=device)
    dist.all_reduce(tensor)
    torch.cuda.synchronize(device)
    before = qcoll.torch.bytes_sent()
    dist.all_reduce(tensor)
    torch.cuda.synchronize(device)
    assert torch.equal(tensor, torch.full_like(tensor, float(size * size))), "the two sums are wrong"
    return qcoll.torch.bytes_sent() - before


def reproducible_sums_on_cuda(rank, size):
    """A reproducible group's all_reduce and reduce_scatter of CUDA tensors (every
    floating dtype; SUM and AVG): the bits of qcoll.torch.reproducible_sum of every
    rank's tensors on the CPU."""
    import qcoll.torch

    device = device_of_rank(rank)
    group = dist.new_group(list(range(size)), pg_options=qcoll.torch.Options(reproducible=True))

    def addend(r, dtype, count):
        g = torch.Generator().manual_seed(2000 + r)
        scale = torch.pow(2.0, torch.randint(-20, 21, (count,), generator=g).double())
        return (torch.randn(count, generator=g, dtype=torch.float64) * scale).to(dtype)

    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for op, average in ((dist.ReduceOp.SUM, False), (dist.ReduceOp.AVG, True)):
            for count in (4099, 1 << 18):  # one allreduce of the integers; reduce-scatter and gather
                tensor = addend(rank, dtype, count).to(device)
                dist.all_reduce(tensor, op=op, group=group)
                expected = qcoll.torch.reproducible_sum([addend(r, dtype, count) for r in range(size)], average)
                assert torch.equal(tensor.cpu().view(torch.uint8), expected.view(torch.uint8)), f"{dtype} {op} {count}"
            count = 1024 * size
            block = torch.empty(1024, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(block, addend(rank, dtype, count).to(device), op=op, group=group)
            whole = qcoll.torch.reproducible_sum([addend(r, dtype, count) for r in range(size)], average)
            assert torch.equal(block.cpu().view(torch.uint8), whole[rank * 1024:(rank + 1) * 1024].view(torch.uint8))
    return True
