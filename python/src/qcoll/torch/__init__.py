"""qcoll for PyTorch.

Importing this module registers the torch.distributed backend ``"qcoll"``::

    import torch.distributed as dist
    import qcoll.torch  # registers the backend
    dist.init_process_group("qcoll")  # under torchrun, or with rank, world_size and a store

The backend joins its ranks through the store PyTorch hands it (no second
rendezvous) and runs qcoll's exact collectives over qcoll's shared-memory or TCP
transport: ``QCOLL_TRANSPORT`` = shm | tcp | auto (default auto: shm when every rank
of the group is on one host), or ``pg_options=qcoll.torch.Options(transport="tcp")``.
CPU tensors, and CUDA tensors where the extension was built with CUDA (``cuda_available()``
says whether this process can run them; ``cuda_unavailable_reason()`` why not): calls
on CUDA tensors are ordered on the current CUDA stream as ProcessGroupNCCL's are, except
that ``wait()`` also waits on the host. See docs/pytorch.md for what is and is not
supported.
"""

from __future__ import annotations

import atexit
import dataclasses

import torch
import torch.distributed as dist

from .. import _qcoll_torch as _extension

if _extension.torch_version != torch.__version__:
    raise ImportError(
        f"qcoll's extension was built against torch {_extension.torch_version}, but torch {torch.__version__} is "
        "imported; rebuild it in this environment: pip install --no-build-isolation --force-reinstall ./python"
    )

__all__ = ["Options", "hooks", "bytes_sent", "transport", "cuda_available", "cuda_unavailable_reason",
           "reproducible_sum"]

#: Whether this extension was built with qcoll's CUDA runtime (it runs CUDA tensors where a GPU is).
built_with_cuda: bool = _extension.cuda_built


@dataclasses.dataclass
class Options:
    """The backend's options (``pg_options`` of ``init_process_group`` or ``new_group``).

    transport: "shm", "tcp" or "auto" (shm when every rank is on one host); "env"
    (the default) reads ``QCOLL_TRANSPORT`` and falls back to auto.
    reproducible: ``all_reduce`` with SUM or AVG of floating-point CPU tensors gives the
    same bits whatever the algorithm and the order of the ranks (qcoll's reproducible
    sum: docs/reproducibility.md); ``reproducible_sum`` computes the same on one process.
    """

    transport: str = "env"
    reproducible: bool = False


def _create_backend(backend_options, pg_options):
    transport = getattr(pg_options, "transport", "env") if pg_options is not None else "env"
    reproducible = bool(getattr(pg_options, "reproducible", False)) if pg_options is not None else False
    return _extension.create_backend(
        backend_options.store,
        backend_options.group_rank,
        backend_options.group_size,
        backend_options.timeout,
        transport,
        reproducible,
    )


def reproducible_sum(tensors, average: bool = False) -> torch.Tensor:
    """The reproducible sum (or mean) of CPU tensors of one dtype and size, on this
    process: the bits an ``all_reduce`` of a group made with ``Options(reproducible=True)``
    gives when its ranks hold these tensors, whichever rank holds which."""
    return _extension.reproducible_sum([t.contiguous() for t in tensors], average)


# One backend object serves both device types: CPU tensors through qcoll's host calls,
# CUDA tensors through its device calls (or a clear error where they cannot run).
dist.Backend.register_backend("qcoll", _create_backend, extended_api=True, devices=["cpu", "cuda"])

# The worker threads stop while the interpreter still runs: one that dropped a tensor
# during finalization would need the GIL, and that ends a thread in a way that aborts
# the process.
atexit.register(_extension._stop_workers)


def _backend(group=None):
    backend = (group or dist.group.WORLD)._get_backend(torch.device("cpu"))
    if not isinstance(backend, _extension.Backend):
        raise ValueError("the process group's CPU backend is not qcoll's")
    return backend


def bytes_sent(group=None) -> int:
    """Bytes this rank has sent through the qcoll backend of ``group`` (default: the
    world), measured where they leave its transport."""
    return _backend(group).bytes_sent()


def transport(group=None) -> str:
    """The transport the qcoll backend of ``group`` runs over: "shm" or "tcp"."""
    return _backend(group).transport


def cuda_unavailable_reason() -> str | None:
    """Why the backend and the hook cannot take CUDA tensors in this process (this
    extension was built without CUDA, and why; qcoll's CUDA runtime sees no GPU;
    QCOLL_DEVICE says otherwise), or None when they can."""
    return _extension.cuda_refusal()


def cuda_available() -> bool:
    """Whether the backend and the hook take CUDA tensors in this process."""
    return cuda_unavailable_reason() is None


from . import hooks  # noqa: E402  (after the backend is registered)
