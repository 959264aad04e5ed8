"""Providers: where workers come from. A provider hands out *blocks* of workers.

What lives here: :class:`BlockState` (the states a block moves through, after Parsl's
job states), :class:`Block`, the :class:`Provider` interface the autoscaler drives, and
:class:`InProcessProvider`, which starts worker actors inside the running actor system.
:class:`actors.processes.LocalProcessProvider` implements the same interface with worker
processes on this machine, and :class:`actors.slurm.SlurmProvider` with Slurm jobs
(``sbatch``, watched with ``squeue`` and ``scontrol``).

Providers do not know what a worker is: whoever assembles the cluster injects how to
make one (a :class:`WorkerFactory` here, a command line per worker for the process
provider), so no provider imports a worker module (an import-linter contract).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import itertools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from runtime.kernel import Actor, ActorRef, ActorSystem

__all__ = [
    "ACCELERATOR_VARIABLES",
    "Block",
    "BlockSpec",
    "BlockState",
    "InProcessProvider",
    "Provider",
    "WorkerFactory",
    "accelerator_env",
    "accelerator_of",
]


class BlockState(enum.Enum):
    """Where a block stands. Terminal states: all but PENDING, RUNNING and HELD."""

    PENDING = "pending"
    """Requested from the provider; no worker of it has started yet."""
    RUNNING = "running"
    """Its workers started (they may still be registering with the scheduler)."""
    HELD = "held"
    """The provider holds it back (e.g. a batch system's hold); it may run later."""
    COMPLETED = "completed"
    """Its workers exited on their own, cleanly."""
    FAILED = "failed"
    """It could not start, or its workers crashed."""
    OOM = "oom"
    """Killed for memory: the batch system says so (Slurm's ``OUT_OF_MEMORY``), or the
    kernel's OOM killer killed one of its worker processes (a local block whose cgroup
    counted the kill). Its workers are lost with cause ``oom``."""
    CANCELLED = "cancelled"
    """Cancelled by the provider or an operator."""
    PREEMPTED = "preempted"
    """Its resources were taken back by higher-priority work (a batch system's
    preemption; a preemption that requeues the job is a new incarnation of the same
    block instead, not an end)."""
    TIMEOUT = "timeout"
    """It reached its walltime."""
    MISSING = "missing"
    """The provider no longer knows it and nothing says how it ended (a batch job that
    vanished from the queue and that the controller no longer knows either)."""
    SCALED_IN = "scaled-in"
    """Stopped on purpose by the autoscaler."""

    @property
    def terminal(self) -> bool:
        return self not in (BlockState.PENDING, BlockState.RUNNING, BlockState.HELD)


@dataclasses.dataclass(frozen=True, slots=True)
class BlockSpec:
    """What each worker of a block offers."""

    workers: int = 1
    threads: int = 1
    memory: int = 0
    #: bytes of disk each worker offers; 0: measured by the worker; ``DISK_OFF``: none
    #: counted (no disk-aware placement for it)
    disk: int = 0
    pool: str = "default"


#: ``BlockSpec.disk`` (and ``disk_per_worker``) for workers whose disk is not counted
DISK_OFF = -1

#: the variables that pin a worker process to one accelerator, as Parsl's
#: HighThroughputExecutor sets them for ``available_accelerators``: NVIDIA's CUDA, AMD's
#: ROCm and Intel's Level Zero each show the process only the device named
ACCELERATOR_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


def accelerator_env(device: str) -> dict[str, str]:
    """The environment that pins a worker process (and the task processes it starts) to
    the accelerator ``device`` (an id such as ``"0"``, or a MIG UUID): each of
    :data:`ACCELERATOR_VARIABLES` set to it, and Level Zero's devices numbered in PCI
    order, as ``nvidia-smi`` and ROCm number theirs. What a pool's ``accelerators``
    give each worker (its providers) and the worker's ``--accelerator`` sets."""
    return {**dict.fromkeys(ACCELERATOR_VARIABLES, device), "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1"}


def accelerator_of(environ: Mapping[str, str]) -> str:
    """The accelerator a process of ``environ`` is pinned to: the first of
    :data:`ACCELERATOR_VARIABLES` set in it (``CUDA_VISIBLE_DEVICES`` first), "" with
    none. What a worker tells the scheduler (``WorkerInfo.accelerator``)."""
    return next((environ[k] for k in ACCELERATOR_VARIABLES if environ.get(k)), "")


@dataclasses.dataclass(slots=True)
class Block:
    block_id: str
    spec: BlockSpec
    state: BlockState
    workers: list[str]
    detail: str = ""
    incarnation: int = 1  #: the batch system's run of it: a requeue starts the next
    requeue_cause: str = ""  #: why the latest requeue happened (``preempted``, ``requeued``)


class Provider(abc.ABC):
    """Starts and stops blocks of workers; reports their states."""

    #: starting a block may take long (a batch system's command): the autoscaler asks
    #: in the background instead of waiting for the answer
    slow_start: bool = False

    @abc.abstractmethod
    async def start_block(self, spec: BlockSpec) -> Block:
        """Request a block; return it (PENDING or RUNNING)."""

    @abc.abstractmethod
    async def stop_block(self, block: Block) -> None:
        """Stop a block's workers; its state becomes SCALED_IN."""

    @abc.abstractmethod
    def poll(self, block: Block) -> BlockState:
        """The block's current state."""

    @abc.abstractmethod
    async def wait_ended(self, block: Block) -> BlockState:
        """Return once the block is in a terminal state, with that state."""

    def resume(self) -> None:  # noqa: B027 - optional, nothing to do by default
        """Submit again after the provider stopped submitting (an operator's call)."""

    def retry_in(self) -> float | None:
        """Seconds before the provider submits again after a failure (None: no wait)."""
        return None

    def batch_error(self) -> Exception | None:
        """The batch system's latest failure while watching blocks (None: it answers)."""
        return None

    def suspended(self) -> bool:
        """The provider stopped submitting until :meth:`resume`."""
        return False


class WorkerFactory(Protocol):
    """Makes the worker actor ``worker_id`` of block ``block_id``, offering what ``spec``
    says; ``resolve(worker_id)`` is how it finds its peers (a reference, or None once
    that worker is gone). Injected into :class:`InProcessProvider` by whoever assembles
    the cluster (``runtime.node.worker_factory``)."""

    def __call__(
        self,
        block_id: str,
        worker_id: str,
        spec: BlockSpec,
        resolve: Callable[[str], ActorRef[Any] | None],
    ) -> Actor: ...


class InProcessProvider(Provider):
    """Worker actors inside the same actor system (the embedded, no-setup case), each
    made by ``make_worker``. Its workers find their peers with ``peers`` (a worker id to
    a reference, or None), by default among this provider's own workers only: where
    several providers (one per pool) share a cluster, give the cluster's lookup, so a
    task of one pool can read an output a worker of another holds."""

    def __init__(
        self,
        system: ActorSystem,
        make_worker: WorkerFactory,
        *,
        prefix: str = "worker",
        peers: Callable[[str], ActorRef[Any] | None] | None = None,
    ) -> None:
        self.system = system
        self.make_worker = make_worker
        self.prefix = prefix
        self.peers = peers or self.resolve
        self._ids = itertools.count(1)
        self._refs: dict[str, ActorRef[Any]] = {}

    def resolve(self, worker_id: str) -> ActorRef[Any] | None:
        ref = self._refs.get(worker_id)
        return None if ref is None or ref.stopped else ref

    async def start_block(self, spec: BlockSpec) -> Block:
        n = next(self._ids)
        block = Block(f"block-{n}", spec, BlockState.PENDING, [])
        for i in range(spec.workers):
            wid = f"{self.prefix}-{n}" if spec.workers == 1 else f"{self.prefix}-{n}.{i}"
            worker = self.make_worker(block.block_id, wid, spec, self.peers)
            self._refs[wid] = await self.system.spawn(worker, wid, escalate=False)
            block.workers.append(wid)
        block.state = BlockState.RUNNING
        return block

    async def stop_block(self, block: Block) -> None:
        refs = [self._refs[w] for w in block.workers if w in self._refs]
        await self.system.shutdown(refs)
        block.state = BlockState.SCALED_IN

    def poll(self, block: Block) -> BlockState:
        if block.state.terminal:
            return block.state
        if all(self._refs[w].stopped for w in block.workers):
            return BlockState.FAILED
        return block.state

    async def wait_ended(self, block: Block) -> BlockState:
        for w in block.workers:
            await self._refs[w].wait_stopped()
        return self.poll(block)

    def ref(self, worker_id: str) -> ActorRef[Any] | None:
        return self._refs.get(worker_id)
