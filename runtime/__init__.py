"""Corral's runtime: the actor kernel, typed messages, task graphs and the user API.

Example::

    from runtime import Cluster, get

    async with Cluster(workers=2) as cluster:
        futures = cluster.map(inc, range(10))
        print(await cluster.gather(futures))

    dask.compute(x, scheduler=get)
"""

from typing import Any

from runtime.errors import (
    ActorCrashed,
    ActorStopped,
    AskTimeout,
    CancelledError,
    CorralError,
    CycleError,
    DependencyFailed,
    GraphError,
    MailboxFull,
    MissingKeysError,
    UnknownPolicyError,
    WorkerLost,
)
from runtime.kernel import Actor, ActorRef, ActorSystem, Clock, handles
from runtime.messages import Message, message

_LAZY = {"Cluster", "Future", "get"}


def __getattr__(name: str) -> Any:
    # The user API imports the actors, which import this package's modules: load it on
    # first use so that `import runtime.kernel` never drags the whole cluster in.
    if name in _LAZY:
        from runtime import client

        return getattr(client, name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "Actor",
    "ActorCrashed",
    "ActorRef",
    "ActorStopped",
    "ActorSystem",
    "AskTimeout",
    "CancelledError",
    "Clock",
    "Cluster",
    "CorralError",
    "CycleError",
    "DependencyFailed",
    "Future",
    "GraphError",
    "MailboxFull",
    "Message",
    "MissingKeysError",
    "UnknownPolicyError",
    "WorkerLost",
    "get",
    "handles",
    "message",
]
