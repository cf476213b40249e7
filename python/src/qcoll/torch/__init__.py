"""qcoll for PyTorch.

Importing this module registers the torch.distributed backend ``"qcoll"``::

    import torch.distributed as dist
    import qcoll.torch  # registers the backend
    dist.init_process_group("qcoll")  # under torchrun, or with rank, world_size and a store

The backend joins its ranks through the store PyTorch hands it (no second
rendezvous) and runs qcoll's exact collectives over qcoll's shared-memory or TCP
transport: ``QCOLL_TRANSPORT`` = shm | tcp | auto (default auto: shm when every rank
of the group is on one host), or ``pg_options=qcoll.torch.Options(transport="tcp")``.
CPU tensors of float32, float64, bfloat16 and float16; see docs/pytorch.md for what
is and is not supported.
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

__all__ = ["Options", "hooks", "bytes_sent", "transport"]


@dataclasses.dataclass
class Options:
    """The backend's options (``pg_options`` of ``init_process_group`` or ``new_group``).

    transport: "shm", "tcp" or "auto" (shm when every rank is on one host); "env"
    (the default) reads ``QCOLL_TRANSPORT`` and falls back to auto.
    """

    transport: str = "env"


def _create_backend(backend_options, pg_options):
    transport = getattr(pg_options, "transport", "env") if pg_options is not None else "env"
    return _extension.create_backend(
        backend_options.store,
        backend_options.group_rank,
        backend_options.group_size,
        backend_options.timeout,
        transport,
    )


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


from . import hooks  # noqa: E402  (after the backend is registered)
