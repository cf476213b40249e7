"""Run on a GPU machine by tools/gpu-check's run.sh (no pytest there): pairs of processes
join the qcoll backend and check CUDA tensors (cuda_checks.py, which test_cuda.py runs
under pytest): every collective, dtype and op against the reference and the CPU call's
bits, on both ranks; stream order; errors at submission; the hook on CUDA gradients bit
for bit as the CPU hook's; DDP on CUDA with the hook; reproducible sums of CUDA tensors. Each check runs in a fresh pair of
processes, so one failure does not hide the others. Prints a line per check and rank,
then "cuda tensor check: ok" and exits 0, or says what went wrong and exits 1 (77: no
CUDA device)."""

import datetime
import os
import queue
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cuda_checks  # beside this script, which Python puts first on sys.path (spawned ranks inherit it)

RANKS = 2
# The whole check's time (run.sh's device call has 600 s for everything it runs): a check
# that hangs takes at most what is left, and the ones after it are reported as not run.
BUDGET_S = float(os.environ.get("QCOLL_CUDA_CHECK_BUDGET_S", "300"))


def rank_main(rank, size, port, check, results):
    try:
        import qcoll.torch  # noqa: F401

        dist.init_process_group("qcoll", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=60))
        value = getattr(cuda_checks, check)(rank, size)
        results.put((rank, "ok", value))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (everything goes to the parent)
        results.put((rank, "error", traceback.format_exc()))


def run(check, timeout=300, transport=None):
    """{rank: value} of cuda_checks.<check> on RANKS processes (QCOLL_TRANSPORT=transport
    when given), or the first error's text."""
    if transport is not None:
        os.environ["QCOLL_TRANSPORT"] = transport  # the spawned ranks inherit it
    else:
        os.environ.pop("QCOLL_TRANSPORT", None)
    context = mp.get_context("spawn")
    results = context.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes = [context.Process(target=rank_main, args=(r, RANKS, port, check, results)) for r in range(RANKS)]
    for p in processes:
        p.start()
    outcome, error = {}, None
    deadline = time.monotonic() + timeout
    try:
        while len(outcome) < RANKS and error is None:
            try:
                rank, status, value = results.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                error = f"no result from ranks {sorted(set(range(RANKS)) - set(outcome))} after {timeout} s"
                break
            if status == "error":
                error = f"rank {rank} raised:\n{value}"
            else:
                outcome[rank] = value
    finally:
        for p in processes:
            p.join(timeout=30 if error is None else 5)
            if p.is_alive():
                p.kill()
    return outcome, error


def main():
    if not torch.cuda.is_available():
        print("cuda tensor check: no CUDA device, skipped")
        return 77
    import qcoll.torch

    reason = qcoll.torch.cuda_unavailable_reason()
    if reason is not None:
        print(f"cuda tensor check: FAILED: the bridge cannot run CUDA tensors here: {reason}")
        return 1
    print(f"cuda tensor check: {torch.cuda.device_count()} GPU(s), {torch.cuda.get_device_name(0)}, torch "
          f"{torch.__version__}, {RANKS} ranks", flush=True)

    def same_on_every_rank(outcome):
        return None if all(outcome[r] == outcome[0] for r in outcome) else "the ranks' results differ"

    def quick_returns(outcome):
        slowest = max(max(seconds) for seconds in outcome.values())
        return None if slowest < 0.25 else f"an async call took {slowest:.2f} s to return"

    def clear_errors(outcome):
        for rank, messages in outcome.items():
            for case, words in (("mixed", "one on the CPU"), ("mixed_into_tensor", "one on the CPU"),
                                ("non_contiguous", "non-contiguous"), ("other_device", "current device")):
                if case in messages and words not in messages[case]:
                    return f"rank {rank}, {case}: {messages[case]}"
        return None

    def trains_alike(outcome):
        if outcome[0][0] != outcome[1][0]:
            return "the ranks' parameters differ"
        losses = outcome[0][1]
        return None if losses[-1] < 0.9 * losses[0] else f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"

    def gpu_to_gpu(outcome):
        most = max(outcome.values())
        return None if most < 1 << 20 else f"{most} bytes of a 16 MiB all_reduce went through the host transport"

    # (check, what, judge, QCOLL_TRANSPORT): unset is auto, which on one host moves CUDA
    # tensors over the CUDA peer transport; shm stages them through host memory.
    checks = [
        ("every_collective", "all_reduce (every dtype, op), broadcast, all_gather, reduce_scatter, barrier, "
                             "send/recv; the reference and the CPU call's bits (auto: cuda_peer)", same_on_every_rank),
        ("every_collective", "the same staged through host memory (QCOLL_TRANSPORT=shm)", same_on_every_rank, "shm"),
        ("bytes_through_the_host", "CUDA tensors on one host move GPU to GPU (auto)", gpu_to_gpu),
        ("stream_order", "kernels queued before the call and after it; async calls return at once; futures",
         quick_returns),
        ("errors", "mixed CPU/CUDA, non-contiguous, other device: clear errors", clear_errors),
        ("hook_matches_cpu", "the hook on CUDA gradients: the CPU hook's bits, every quantizer and dtype",
         same_on_every_rank),
        ("ddp_training", "DDP on CUDA with the one_bit hook, over the qcoll backend", trains_alike),
        ("reproducible_sums_on_cuda", "a reproducible group's all_reduce and reduce_scatter of CUDA tensors: the "
                                      "CPU's reproducible_sum bits (auto: cuda_peer)", same_on_every_rank),
    ]
    # QCOLL_CUDA_CHECKS=name,name runs only those (a rerun of what failed, on a device
    # session's few minutes).
    only = {name for name in os.environ.get("QCOLL_CUDA_CHECKS", "").split(",") if name}
    unknown = only - {check for check, *_ in checks}
    if unknown:
        print(f"cuda tensor check: no check named {', '.join(sorted(unknown))}", flush=True)
        return 1
    failed = False
    deadline = time.monotonic() + BUDGET_S
    for check, what, judge, *transport in checks:
        if only and check not in only:
            continue
        started = time.monotonic()
        if deadline - started < 30:
            print(f"  {check}: NOT RUN: the check's {BUDGET_S:.0f} s are spent", flush=True)
            failed = True
            continue
        outcome, error = run(check, timeout=min(240.0, deadline - started), transport=(transport or [None])[0])
        if error is None:
            error = judge(outcome)
        seconds = time.monotonic() - started
        for rank in range(RANKS):
            verdict = "ok" if error is None else "WRONG"
            print(f"rank {rank}: {verdict}: {check} ({what}), {seconds:.1f} s", flush=True)
        if error is not None:
            print(f"  {check}: {error}", flush=True)
            failed = True
    print("cuda tensor check:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
