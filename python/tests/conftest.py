"""Runs a test body on N ranks, each a process (torch.multiprocessing, forkserver),
joined with init_process_group over a fresh TCP store port; results come back through a
queue, and a rank that raises fails the test with its traceback. Every wait is bounded."""

from __future__ import annotations

import datetime
import faulthandler
import os
import queue
import random
import socket
import time
import traceback

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    """A port for torchrun's or the store's listener, free now and below the kernel's
    ephemeral range: a port from bind(0) is in that range, so between closing it here and
    the listener's bind any connect() or bind(0) nearby may take it (as qcoll-run chooses
    its store port, tools/qcoll-run)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    generator = random.SystemRandom()
    for _ in range(100):
        port = generator.randrange(10000, max(ephemeral_low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range is taken: the old way
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_context():
    """Ranks fork from one server process that has imported torch and the bridge: a
    spawned rank imported them itself, 3-6 s of CPU per process on a 2-core CI machine,
    in each of a test's 2-4 ranks. The server starts once and never initialises CUDA
    (importing torch does not), and ranks fork from it as DataLoader's workers fork from
    a process that imported torch; a rank gets its environment from run_ranks' `env`,
    as before."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "qcoll.torch"])
    return context


def _rank_main(rank, size, port, backend, body, args, results, env):
    os.environ.update(env)
    # A rank still running shortly before the parent gives up prints where each of its
    # threads is, so a hang shows its place in the test's output.
    faulthandler.dump_traceback_later(float(env.get("QCOLL_TEST_DUMP_AFTER_S", "100")), exit=False)
    import torch.distributed as dist

    import qcoll.torch  # noqa: F401  (registers the backend)

    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=float(env.get("QCOLL_TEST_TIMEOUT_S", "60"))),
        )
        value = body(rank, size, *args)
        results.put((rank, "ok", value))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (report everything to the parent)
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(size, body, *args, backend="qcoll", env=None, timeout=120, expect_exit=()):
    """body(rank, size, *args) on `size` ranks; returns {rank: value}. Ranks listed in
    expect_exit may end without reporting (a test that kills them)."""
    context = _rank_context()
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_rank_main, args=(r, size, port, backend, body, args, results, dict(env or {})))
        for r in range(size)
    ]
    for p in processes:
        p.start()
    outcome = {}
    expected = size - len(expect_exit)
    deadline = time.monotonic() + timeout
    try:
        while len(outcome) < expected:
            try:
                rank, status, value = results.get(timeout=1)
            except queue.Empty:
                # A rank that died without a report (a crash) fails the test at once.
                for r, p in enumerate(processes):
                    if r not in expect_exit and r not in outcome and p.exitcode not in (None, 0):
                        pytest.fail(f"rank {r} died with exit code {p.exitcode} before reporting")
                if time.monotonic() > deadline:
                    pytest.fail(f"no result from ranks {sorted(set(range(size)) - set(outcome) - set(expect_exit))} "
                                f"after {timeout} s")
                continue
            if status == "error":
                pytest.fail(f"rank {rank} raised:\n{value}")
            outcome[rank] = value
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return outcome


@pytest.fixture
def ranks():
    return run_ranks
