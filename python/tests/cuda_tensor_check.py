"""Run on a GPU machine by tools/gpu-check's run.sh (no pytest there): two processes
join the qcoll backend and pass it a CUDA tensor, which must be a clear error naming
what is missing (the device-buffer collectives), on both ranks, while a CPU tensor
still reduces. Prints "cuda tensor check: ok" and exits 0, or says what went wrong."""

import datetime
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, size, port, results):
    try:
        import qcoll.torch  # noqa: F401

        dist.init_process_group("qcoll", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=60))
        message = "no error"
        try:
            dist.all_reduce(torch.ones(8, device="cuda"))
        except RuntimeError as e:
            message = str(e)
        cpu = torch.ones(8)
        dist.all_reduce(cpu)
        results.put((rank, message, bool(torch.equal(cpu, torch.full((8,), float(size))))))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        results.put((rank, traceback.format_exc(), False))


def main():
    if not torch.cuda.is_available():
        print("cuda tensor check: no CUDA device, skipped")
        return 77
    context = mp.get_context("spawn")
    results = context.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes = [context.Process(target=rank_main, args=(r, 2, port, results)) for r in range(2)]
    for p in processes:
        p.start()
    outcome = [results.get(timeout=120) for _ in processes]
    for p in processes:
        p.join(timeout=30)
    failed = False
    for rank, message, cpu_ok in sorted(outcome):
        named = "CPU tensors" in message and "device-buffer" in message
        print(f"rank {rank}: {'ok' if named and cpu_ok else 'WRONG'}: {message}")
        failed = failed or not (named and cpu_ok)
    print("cuda tensor check:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
