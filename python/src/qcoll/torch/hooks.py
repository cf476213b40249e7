"""DDP communication hooks that reduce gradients through qcoll's compressed allreduce,
or through its reproducible sum.

    import qcoll.torch.hooks as hooks
    state = hooks.CompressedState(quantizer="one_bit")
    ddp_model.register_comm_hook(state, hooks.compressed_allreduce)

Each bucket is averaged with qcoll's two-phase compressed allreduce: one_bit (1 bit per
value plus two floats per group of 2048 values, about 31x smaller than float32),
k_level (``bits`` bits per value), bfp (``bits``-bit mantissas, a shared exponent per
block) or identity (exact, for comparison), with error feedback: what a rank's
quantizer loses is added to its next gradient. The result is bitwise identical on every
rank. Residuals are kept per bucket (DDP's bucket index); when DDP rebuilds its buckets
after the first iteration, or a bucket changes size, that bucket's plan is made anew and
its residual starts at zero again (with ``static_graph=True`` the buckets are rebuilt
once).

The hook brings its own qcoll communicator, joined once — at the first call, which
every rank makes — through the process group's store: it works whatever the process
group's backend is (gloo, or qcoll's), and its calls never queue behind the backend's.
Any number of states may share a process group (two DDP models trained one after the
other, or a GAN's generator and discriminator in turn): each state joins a communicator
of its own, under a store prefix numbered in the order the states make their first
calls — the same order on every rank, as for any collective.

CUDA gradient buckets are compressed on their GPU, through plans on device memory (the
residuals live there, per bucket as on the CPU; only the compressed frames cross to the
host), with the same results, bit for bit, as the CPU hook's on the same gradients. The
call is ordered after the work queued on the bucket's device's current stream, and the
returned future is CUDA-aware, as with ProcessGroupNCCL (docs/pytorch.md).

    state = hooks.ReproducibleState()
    ddp_model.register_comm_hook(state, hooks.reproducible_allreduce)

averages each bucket exactly with qcoll's reproducible sum instead: the same bits
whatever the allreduce algorithm, the transport and the order of the ranks, on the CPU
or the GPU (docs/reproducibility.md).
"""


import datetime
import itertools
import weakref

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from .. import _qcoll_torch as _extension

__all__ = ["CompressedState", "compressed_allreduce", "ReproducibleState", "reproducible_allreduce"]


class _JoinedState:
    """What every hook state has: a qcoll communicator of its own, joined at the first
    call (which every rank makes) through the process group's store."""

    _reproducible = False

    def __init__(self, process_group, transport, timeout):
        self.process_group = process_group
        self.transport = transport
        self.timeout = timeout
        self._communicator = None

    def communicator(self):
        """The hook's qcoll communicator, joined at the first call (collective)."""
        if self._communicator is None:
            group = self.process_group or dist.group.WORLD
            _, store = distributed_c10d._world.pg_map[group]
            self._communicator = _extension.CompressedCommunicator(
                dist.PrefixStore(f"qcoll_hook/{_next_join(group)}", store),
                dist.get_rank(group),
                dist.get_world_size(group),
                self.timeout,
                self.transport,
                self._reproducible,
            )
        return self._communicator

    def bytes_sent(self) -> int:
        """Bytes this rank's hook has sent, measured where they leave its transport."""
        return 0 if self._communicator is None else self._communicator.bytes_sent()


class CompressedState(_JoinedState):
    """The hook's state: its settings, its communicator and (inside it) the residuals.

    quantizer: "one_bit", "k_level", "bfp" or "identity".
    group_size: values per one_bit or k_level group, or per bfp block (a multiple of 8).
    bits: k_level's code bits (2^bits levels) or bfp's mantissa bits.
    error_feedback: keep each rank's quantization error and add it to the next bucket.
    reproducible: each stripe's owner sums the ranks' decoded contributions on a shared
        grid, so the averaged bucket's bits do not depend on the route (the topology's
        ring or direct), the transport or which rank holds which data — for the same
        number of ranks (docs/reproducibility.md).
    process_group: whose ranks and store to use (default: the world).
    transport: "env" (QCOLL_TRANSPORT, else auto), "shm", "tcp" or "auto".
    timeout: the deadline of the join and of each step of a call.
    """

    def __init__(
        self,
        quantizer: str = "one_bit",
        group_size: int = 2048,
        bits: int = 4,
        error_feedback: bool = True,
        reproducible: bool = False,
        process_group=None,
        transport: str = "env",
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
    ):
        self.compression = _extension.Compression()
        self.compression.quantizer = quantizer
        self.compression.group_size = group_size
        self.compression.bits = bits
        self.compression.error_feedback = error_feedback
        self.compression.reproducible = reproducible
        # Settings the quantizer refuses are refused here, naming the value, not at the
        # first backward().
        _extension.check_compression(self.compression)
        super().__init__(process_group, transport, timeout)


class ReproducibleState(_JoinedState):
    """The reproducible hook's state: its communicator. Buckets of any floating dtype,
    on the CPU or a GPU.

    process_group: whose ranks and store to use (default: the world).
    transport: "env" (QCOLL_TRANSPORT, else auto), "shm", "tcp" or "auto".
    timeout: the deadline of the join and of each step of a call.
    """

    _reproducible = True

    def __init__(self, process_group=None, transport: str = "env",
                 timeout: datetime.timedelta = datetime.timedelta(minutes=30)):
        super().__init__(process_group, transport, timeout)


# Per process group, how many hook communicators this process has joined on it: the
# next one's store prefix. Every rank joins a group's states in the same order (the
# first calls are collective), so the numbers agree without asking the store.
_joins = weakref.WeakKeyDictionary()


def _next_join(group) -> int:
    counter = _joins.setdefault(group, itertools.count())
    return next(counter)


def compressed_allreduce(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket's gradients across ranks through qcoll's compressed allreduce
    (on the GPU for a CUDA bucket)."""
    work = state.communicator().allreduce(bucket.index(), bucket.buffer(), state.compression)
    return work.get_future().then(lambda done: done.value()[0])


def reproducible_allreduce(state: ReproducibleState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket's gradients across ranks with qcoll's reproducible sum: the same
    bits whatever the allreduce algorithm, the transport and the order of the ranks
    (docs/reproducibility.md; on the GPU for a CUDA bucket)."""
    work = state.communicator().average(bucket.buffer())
    return work.get_future().then(lambda done: done.value()[0])
