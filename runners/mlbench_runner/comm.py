"""The few collectives the algorithms need, over torch.distributed or mpi4py.

PyPI torch has no MPI backend, so ``backend: mpi`` goes through mpi4py on CPU tensors,
zero-copy: the numpy view of a contiguous tensor shares its memory, and the reduction
is ``Allreduce(MPI.IN_PLACE, view)``. Both paths offer the same small interface:
sum all-reduce, broadcast, all-gather, a neighbour exchange (point-to-point, for gossip)
and barrier. :class:`CountingCommunicator` wraps any of them and counts the payload bytes
handed to each collective, which is what an algorithm's declared bytes per step are checked
against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from mlbench_runner.world import World, free_port

#: Bytes of one rank's text in :func:`gather_texts` (longer texts are cut).
TEXT_BYTES = 256


class Communicator(ABC):
    """Sum all-reduce, broadcast and barrier over the job's ranks."""

    rank: int
    size: int
    name: str

    @abstractmethod
    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        """Replace ``tensor`` with its element-wise sum over ranks (identical on every rank)."""

    @abstractmethod
    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Overwrite ``tensor`` with rank ``src``'s copy."""

    @abstractmethod
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` stacked in rank order: shape ``(size, *tensor.shape)``."""

    @abstractmethod
    def exchange(self, tensor: torch.Tensor, peers: Sequence[int]) -> list[torch.Tensor]:
        """Send ``tensor`` to each of ``peers`` and receive one tensor of its shape from each, in ``peers`` order.

        Every rank must name the ranks that name it (a symmetric graph such as a ring), else it hangs.
        """

    @abstractmethod
    def barrier(self) -> None: ...

    def close(self, orderly: bool = True) -> None:  # noqa: B027 - optional hook
        """Release the transport. ``orderly``: this rank ends normally, so it may wait for its peers first."""

    def transport(self) -> Communicator:
        """The communicator that really moves the data (a wrapper returns what it wraps)."""
        return self

    def alone(self) -> bool:
        """Nobody to talk to: one process without a process group, whose collectives are identities and are
        skipped. A process group of one rank (``MLBENCH_PROCESS_GROUP=1``) is not alone: its collectives go
        through the backend (the nccl path measured on one GPU)."""
        inner = self.transport()
        return inner is not self and inner.alone()


def payload_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


#: How long a rank that ends normally waits at the closing barrier for its peers (gloo) before it
#: leaves anyway: they all end within moments of each other, after the same collective stop.
CLOSE_BARRIER_SECONDS = 60.0


def host_staged(backend: str, device: torch.device) -> bool:
    """Whether point-to-point transfers of a tensor on ``device`` go through host memory: gloo with a
    device tensor (ProcessGroupGloo hands send/recv the raw pointer, and a device one fails in writev)."""
    return backend == "gloo" and device.type != "cpu"


class TorchCommunicator(Communicator):
    """torch.distributed with gloo (CPU) or nccl (GPU)."""

    def __init__(self, world: World, backend: str, timeout_s: float = 1800.0) -> None:
        self.rank, self.size, self.name = world.rank, world.size, backend
        if not dist.is_initialized():
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{world.master_addr}:{world.master_port}",
                rank=world.rank,
                world_size=world.size,
                timeout=timedelta(seconds=timeout_s),
            )

    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        dist.broadcast(tensor, src=src)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        # into one flat buffer, as nccl-tests does: the list form gathers into a buffer of its own and then
        # copies each block out, an extra allocation and copy inside every timed all-gather
        flat = torch.empty(self.size * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        dist.all_gather_into_tensor(flat, tensor.contiguous().reshape(-1))
        return flat.view(self.size, *tensor.shape)

    def exchange(self, tensor: torch.Tensor, peers: Sequence[int]) -> list[torch.Tensor]:
        # gloo's send/recv read and write host memory only (its collectives stage device tensors, its
        # point-to-point calls do not): a GPU run over gloo exchanges through host copies, which its
        # communication time then includes, as it would on any transport without GPU support
        staged = host_staged(self.name, tensor.device)
        send = tensor.detach().contiguous()  # a transposed view: gloo sends contiguous memory only
        send = send.cpu() if staged else send
        received = [torch.empty_like(send, memory_format=torch.contiguous_format) for _ in peers]
        ops = [dist.P2POp(dist.isend, send, peer) for peer in peers]
        ops += [dist.P2POp(dist.irecv, buf, peer) for buf, peer in zip(received, peers, strict=True)]
        for request in dist.batch_isend_irecv(ops) if ops else []:
            request.wait()
        return [buf.to(tensor.device) for buf in received] if staged else received

    def barrier(self) -> None:
        dist.barrier()

    def close(self, orderly: bool = True) -> None:
        """Leave the process group; when ``orderly`` with peers, meet them at a bounded barrier first.

        Why the barrier: no rank leaves (and rank 0, exiting, takes the TCPStore with it) before every
        rank is done with its collectives. A rank that ends without a successful
        ``destroy_process_group`` dies at exit with gloo's ``terminate called without an active
        exception`` (seen once in CI): the caller logs a failed close rather than hide it. A rank
        that is aborting skips the barrier: its peers may never come, and it must not hold them for
        the barrier's timeout.
        """
        if not dist.is_initialized():
            return
        try:
            if orderly and self.size > 1:
                if self.name == "gloo":
                    dist.monitored_barrier(timeout=timedelta(seconds=CLOSE_BARRIER_SECONDS), wait_all_ranks=True)
                else:
                    dist.barrier()
        finally:
            dist.destroy_process_group()


class MpiCommunicator(Communicator):
    """mpi4py on the tensors' own memory (CPU only)."""

    def __init__(self, world: World) -> None:
        # Lazy: importing mpi4py.MPI initialises MPI, which only backend: mpi may do.
        from mpi4py import MPI  # noqa: PLC0415

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD
        self.rank, self.size, self.name = self._comm.Get_rank(), self._comm.Get_size(), "mpi"
        if (self.rank, self.size) != (world.rank, world.size):
            raise RuntimeError(
                f"MPI sees rank {self.rank}/{self.size} but the environment says {world.rank}/{world.size}"
            )

    @staticmethod
    def _view(tensor: torch.Tensor) -> np.ndarray:
        if tensor.device.type != "cpu":
            raise ValueError("backend mpi: tensors must be on the CPU (use nccl for GPUs)")
        if not tensor.is_contiguous():
            raise ValueError("backend mpi: tensors must be contiguous for a zero-copy view")
        return tensor.detach().numpy()  # shares memory with the tensor

    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        self._comm.Allreduce(self._mpi.IN_PLACE, self._view(tensor), op=self._mpi.SUM)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        self._comm.Bcast(self._view(tensor), root=src)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty((self.size, *tensor.shape), dtype=tensor.dtype)
        self._comm.Allgather(self._view(tensor.contiguous()), self._view(out))
        return out

    def exchange(self, tensor: torch.Tensor, peers: Sequence[int]) -> list[torch.Tensor]:
        send = self._view(tensor.contiguous())
        received = [torch.empty_like(tensor, memory_format=torch.contiguous_format) for _ in peers]
        requests = [self._comm.Isend(send, dest=peer, tag=7) for peer in peers]
        requests += [
            self._comm.Irecv(self._view(buf), source=peer, tag=7) for buf, peer in zip(received, peers, strict=True)
        ]
        self._mpi.Request.Waitall(requests)
        return received

    def barrier(self) -> None:
        self._comm.Barrier()


class LocalCommunicator(Communicator):
    """One process: every collective is the identity."""

    def __init__(self, backend: str) -> None:
        self.rank, self.size, self.name = 0, 1, backend

    def alone(self) -> bool:
        return True

    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        return None

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        return None

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.unsqueeze(0).clone()

    def exchange(self, tensor: torch.Tensor, peers: Sequence[int]) -> list[torch.Tensor]:
        if any(peer != 0 for peer in peers):
            raise ValueError(f"exchange: one process has no peers {list(peers)}")
        return [tensor.clone() for _ in peers]

    def barrier(self) -> None:
        return None


class CountingCommunicator(Communicator):
    """Delegates to ``inner`` and counts the payload bytes each rank hands to the collectives.

    All-reduce and all-gather count the local tensor, broadcast counts it on the source rank only, an
    exchange counts it once per peer: what this rank contributes, not what the wire carries.
    """

    def __init__(self, inner: Communicator) -> None:
        self.inner = inner
        self.rank, self.size, self.name = inner.rank, inner.size, inner.name
        self.bytes = 0
        self.collectives: set[str] = set()

    def _count(self, collective: str, nbytes: int) -> None:
        self.bytes += nbytes
        self.collectives.add(collective)

    def all_reduce_sum_(self, tensor: torch.Tensor) -> None:
        self._count("all-reduce", payload_bytes(tensor))
        self.inner.all_reduce_sum_(tensor)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        self._count("broadcast", payload_bytes(tensor) if self.rank == src else 0)
        self.inner.broadcast_(tensor, src)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self._count("all-gather", payload_bytes(tensor))
        return self.inner.all_gather(tensor)

    def exchange(self, tensor: torch.Tensor, peers: Sequence[int]) -> list[torch.Tensor]:
        self._count("send-recv", payload_bytes(tensor) * len(peers))
        return self.inner.exchange(tensor, peers)

    def barrier(self) -> None:
        self.inner.barrier()

    def close(self, orderly: bool = True) -> None:
        self.inner.close(orderly)

    def transport(self) -> Communicator:
        return self.inner.transport()


def make_communicator(world: World, backend: str, process_group: bool = False) -> Communicator:
    """The transport for ``backend`` (gloo, nccl or mpi).

    A single process gets :class:`LocalCommunicator` unless ``process_group`` asks for a
    real torch.distributed group (DDP needs one even alone).
    """
    if world.size == 1 and backend != "mpi":
        if not process_group:
            return LocalCommunicator(backend)
        if world.launcher == "single":
            world = World(0, 1, 0, 1, "127.0.0.1", free_port(), "single")
    if backend == "mpi":
        if world.launcher != "mpirun" and world.size > 1:
            raise ValueError("backend: mpi needs the ranks to be started by mpirun")
        return MpiCommunicator(world)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: unknown {backend!r} (gloo, nccl or mpi)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend: nccl needs a GPU and none is visible")
    return TorchCommunicator(world, backend)


def close_quietly(comm: Communicator, orderly: bool) -> str | None:
    """Close ``comm``; what went wrong comes back as text to log, not raised: the rank ends either way
    and its record is written, but a silent failure here is the one a crash at exit leaves no trace of."""
    try:
        comm.close(orderly)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def gather_texts(comm: Communicator, text: str, device: torch.device) -> list[str]:
    """Every rank's ``text`` in rank order (at most TEXT_BYTES of UTF-8 each), through one all-gather."""
    raw = text.encode()[:TEXT_BYTES].ljust(TEXT_BYTES, b"\0")
    mine = torch.tensor(list(raw), dtype=torch.uint8, device=device)
    rows = comm.all_gather(mine).cpu().tolist()
    return [bytes(row).rstrip(b"\0").decode(errors="replace") for row in rows]
