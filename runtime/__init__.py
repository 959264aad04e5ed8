"""Corral's runtime: the actor kernel, typed messages, task graphs and the user API.

Example::

    from runtime import Cluster, get

    async with Cluster(workers=2) as cluster:
        futures = cluster.map(inc, range(10))
        print(await cluster.gather(futures))

    dask.compute(x, scheduler=get)
"""

from typing import TYPE_CHECKING, Any

# First: Corral's other packages (actors, policies, transport) must come from this
# installation, not from a user's folder or module of that name first on sys.path
# (PackageShadowed says which; runtime/packages.py).
import runtime.packages  # noqa: F401 (imported for its check)
from runtime.errors import (
    ActorCrashed,
    ActorStopped,
    AddressInUse,
    AlertConfigError,
    AskTimeout,
    AuthenticationFailed,
    BatchSystemError,
    CancelledError,
    CheckpointError,
    ClusterAlreadyStarted,
    ClusterClosed,
    ConnectFailed,
    ConnectionClosed,
    ConsoleError,
    CorralError,
    CorralHomeDenied,
    CorralHomeError,
    CycleError,
    DaskOnlyArgument,
    DependencyFailed,
    DiskFull,
    EagerComputeOnCluster,
    FileChecksumError,
    FileOutputError,
    FrameTooLarge,
    GraphError,
    GraphNotLoadable,
    InputsUnreachable,
    InvalidAddress,
    InvalidTransition,
    LongTaskError,
    MailboxFull,
    ManagerLost,
    ManagerStopping,
    ManagerUnreachable,
    MemoryConfigError,
    MemoryStalled,
    MissingKeysError,
    MonitoringDBError,
    PackageShadowed,
    ParslOnlyArgument,
    PermissionDenied,
    PolicyConfigError,
    PolicyCreateError,
    PolicyKindError,
    PolicyParamsError,
    PoolConfigError,
    PoolNameError,
    ProtocolError,
    ProtocolMismatch,
    PruneDepthError,
    RemoteError,
    ReportOutputError,
    ReportRunError,
    ResultNotPicklable,
    RetryPolicyLoop,
    RunNoAnswer,
    RunNotSent,
    RunQueueFull,
    SchedulerConfigError,
    ShuffleMethodError,
    SubmissionsSuspended,
    TableConfigError,
    TaskArgumentsTooLarge,
    TaskCrashedWorkers,
    TaskErrorTooLarge,
    TaskExited,
    TaskLongerThanWalltime,
    TaskNotLoadable,
    TaskOutOfMemory,
    TaskProcessDied,
    TaskTimeout,
    TaskTooBigForDisk,
    TaskTooLarge,
    TokenFileError,
    TooManyFrames,
    TransportError,
    UnknownCategory,
    UnknownFuture,
    UnknownPolicyError,
    UnknownStream,
    UnknownWorkers,
    ValueTooLarge,
    WalltimeError,
    WorkerCoreFailed,
    WorkerLost,
    WorkersTimeout,
)
from runtime.files import File, output_path
from runtime.kernel import Actor, ActorRef, ActorSystem, Clock, handles
from runtime.messages import CORRAL_VERSION, Message, message
from runtime.task import checkpoint, checkpoint_file, restore, restore_path

if TYPE_CHECKING:
    from runtime.client import Cluster, Future, futures_of, get
    from runtime.sync_client import Client, ClientFuture

# This package holds both the base layer (kernel, messages, errors, ...) and the user API
# (runtime.client) on top of the actors, which import the base. Python runs this file
# before any of its modules, so an eager `from runtime.client import ...` here would make
# every `import runtime.errors` (in an actor, a task process, a transport) load the whole
# stack, through an import cycle runtime -> runtime.client -> actors -> runtime. So the
# user API is re-exported on first use (PEP 562); the base is re-exported eagerly.
# docs/architecture.md, "Layers"; tests/test_layers.py checks both.
_USER_API = {"Cluster", "Future", "futures_of", "get"}
_SYNC_API = {"Client", "ClientFuture"}  # runtime.sync_client: a Cluster on a thread of its own


def __getattr__(name: str) -> Any:
    if name in _USER_API or name in _SYNC_API:
        from runtime import client, sync_client

        value = getattr(sync_client if name in _SYNC_API else client, name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")


__version__ = CORRAL_VERSION

__all__ = [
    "Actor",
    "ActorCrashed",
    "ActorRef",
    "ActorStopped",
    "ActorSystem",
    "AddressInUse",
    "AlertConfigError",
    "AskTimeout",
    "AuthenticationFailed",
    "BatchSystemError",
    "CancelledError",
    "CheckpointError",
    "Client",
    "ClientFuture",
    "Clock",
    "Cluster",
    "ClusterAlreadyStarted",
    "ClusterClosed",
    "ConnectFailed",
    "ConnectionClosed",
    "ConsoleError",
    "CorralError",
    "CorralHomeDenied",
    "CorralHomeError",
    "CycleError",
    "DaskOnlyArgument",
    "DependencyFailed",
    "DiskFull",
    "EagerComputeOnCluster",
    "File",
    "FileChecksumError",
    "FileOutputError",
    "FrameTooLarge",
    "Future",
    "GraphError",
    "GraphNotLoadable",
    "InputsUnreachable",
    "InvalidAddress",
    "InvalidTransition",
    "LongTaskError",
    "MailboxFull",
    "ManagerLost",
    "ManagerStopping",
    "ManagerUnreachable",
    "MemoryConfigError",
    "MemoryStalled",
    "Message",
    "MissingKeysError",
    "MonitoringDBError",
    "PackageShadowed",
    "ParslOnlyArgument",
    "PermissionDenied",
    "PolicyConfigError",
    "PolicyCreateError",
    "PolicyKindError",
    "PolicyParamsError",
    "PoolConfigError",
    "PoolNameError",
    "ProtocolError",
    "ProtocolMismatch",
    "PruneDepthError",
    "RemoteError",
    "ReportOutputError",
    "ReportRunError",
    "ResultNotPicklable",
    "RetryPolicyLoop",
    "RunNoAnswer",
    "RunNotSent",
    "RunQueueFull",
    "SchedulerConfigError",
    "ShuffleMethodError",
    "SubmissionsSuspended",
    "TableConfigError",
    "TaskArgumentsTooLarge",
    "TaskCrashedWorkers",
    "TaskErrorTooLarge",
    "TaskExited",
    "TaskLongerThanWalltime",
    "TaskNotLoadable",
    "TaskOutOfMemory",
    "TaskProcessDied",
    "TaskTimeout",
    "TaskTooBigForDisk",
    "TaskTooLarge",
    "TokenFileError",
    "TooManyFrames",
    "TransportError",
    "UnknownCategory",
    "UnknownFuture",
    "UnknownPolicyError",
    "UnknownStream",
    "UnknownWorkers",
    "ValueTooLarge",
    "WalltimeError",
    "WorkerCoreFailed",
    "WorkerLost",
    "WorkersTimeout",
    "checkpoint",
    "checkpoint_file",
    "futures_of",
    "get",
    "handles",
    "message",
    "output_path",
    "restore",
    "restore_path",
]
