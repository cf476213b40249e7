"""torch.distributed's all_reduce of float32 CPU tensors with the qcoll backend beside
gloo, in the same run, in the nccl-tests columns (busbw = algbw * 2 (n - 1) / n):

    python benchmarks/torch_allreduce_bench.py [--ranks 2,4] [--min 1M] [--max 64M] [--iters 20]
                                               [--backends qcoll,gloo] [--transport shm]

Each backend and rank count is a fresh job of processes (spawned) on this machine; each
size is timed over --iters calls after --warmup, every rank timing its own calls, and
the slowest rank's median counts. Results are checked (each rank contributes rank + 1).
Each rank runs one intra-op thread (OMP_NUM_THREADS, default 1, as under torchrun).
The goal (issue 42): qcoll >= 1.2x gloo's busbw from 1 MiB up.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def rank_main(rank, size, port, backend, sizes, iters, warmup, transport, results):
    os.environ["QCOLL_TRANSPORT"] = transport
    # One intra-op thread per rank, as torchrun sets (OMP_NUM_THREADS=1): otherwise the
    # OpenMP threads of each call's fill_ keep spinning on the cores the exchange needs,
    # and both backends' times swing several-fold from run to run.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import qcoll.torch  # noqa: F401

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        tensor = torch.empty(n)
        expected = float(size * (size + 1) // 2)
        samples = []
        for i in range(warmup + iters):
            tensor.fill_(rank + 1)
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(tensor)
            elapsed = time.perf_counter() - started
            if i >= warmup:
                samples.append(elapsed)
        wrong = int((tensor != expected).sum().item())
        rows.append((nbytes, statistics.median(samples), wrong))
    results.put((rank, rows))
    dist.destroy_process_group()


def run_job(backend, size, sizes, iters, warmup, transport):
    context = mp.get_context("spawn")
    results = context.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes = [context.Process(target=rank_main, args=(r, size, port, backend, sizes, iters, warmup, transport,
                                                         results)) for r in range(size)]
    for p in processes:
        p.start()
    per_rank = dict(results.get(timeout=1800) for _ in range(size))
    for p in processes:
        p.join()
    rows = []
    for k, nbytes in enumerate(sizes):
        seconds = max(per_rank[r][k][1] for r in range(size))
        wrong = sum(per_rank[r][k][2] for r in range(size))
        algbw = nbytes / seconds / 1e9
        rows.append((nbytes, seconds, algbw, algbw * 2 * (size - 1) / size, wrong))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--min", default="1M")
    parser.add_argument("--max", default="64M")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backends", default="qcoll,gloo")
    parser.add_argument("--transport", default="auto", help="the qcoll backend's QCOLL_TRANSPORT")
    args = parser.parse_args()
    sizes = []
    nbytes = parse_bytes(args.min)
    while nbytes <= parse_bytes(args.max):
        sizes.append(nbytes)
        nbytes *= args.factor
    backends = args.backends.split(",")
    print(f"# torch_allreduce_bench: torch {torch.__version__}, float32 sum, {args.iters} timed calls "
          f"({args.warmup} warm-up), qcoll transport {args.transport}")
    print(f"# {'ranks':>5} {'size':>10} {'backend':>8} {'time(us)':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6}"
          f" {'vs ' + backends[-1]:>8}")
    for size in (int(r) for r in args.ranks.split(",")):
        table = {backend: run_job(backend, size, sizes, args.iters, args.warmup, args.transport)
                 for backend in backends}
        for k, nbytes in enumerate(sizes):
            for backend in backends:
                _, seconds, algbw, busbw, wrong = table[backend][k]
                ratio = busbw / table[backends[-1]][k][3]
                print(f"  {size:>5} {nbytes:>10} {backend:>8} {seconds * 1e6:>10.1f} {algbw:>8.2f} {busbw:>8.2f}"
                      f" {wrong:>6} {ratio:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
