"""The file registry: where every task output lives, its size, who still needs it.

What lives here: :class:`FileTable` (the pure core: facts in, release commands out) and
:class:`FileRegistry` (the actor that feeds it and carries its commands out).

Every task output is a logical file with replicas on workers, a size, a count of
consumers (tasks that still need it) and a flag for whether a client wants it. The
scheduler sends absolute facts (``FileFact``) whenever any of these change; the registry
drops a file from every worker once nobody needs it and tells the scheduler, which keeps
the task's lineage so the file can be recomputed if it is needed again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from actors.protocol import FileFact
from runtime.graph import Key
from runtime.kernel import Actor, ActorRef, handles
from runtime.messages import DropKeys, FileFactsMsg, FilesReleasedMsg, FilesStatus, StatusRequest

if TYPE_CHECKING:
    from actors.scheduler import Scheduler

__all__ = ["DropReplicas", "FileInfo", "FileRegistry", "FileTable", "FilesDropped"]

FileState = Literal["pending", "created", "released"]


@dataclasses.dataclass(slots=True)
class FileInfo:
    key: Key
    state: FileState
    nbytes: int
    replicas: tuple[str, ...]
    consumers: int
    wanted: bool
    file: bool = False  #: a file output: its bytes are files on the workers' disks


@dataclasses.dataclass(frozen=True, slots=True)
class DropReplicas:
    """Delete ``keys`` from ``worker``'s store."""

    worker: str
    keys: tuple[Key, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class FilesDropped:
    """Tell the scheduler these files are gone from every worker."""

    keys: tuple[Key, ...]


class FileTable:
    """Pure core of the registry. ``handle(facts)`` is its only mutator."""

    def __init__(self) -> None:
        self.files: dict[Key, FileInfo] = {}  #: every file not yet forgotten
        self.stored: dict[str, int] = {}  #: bytes held per worker
        self.released_total = 0  #: files released so far
        self.released_bytes = 0  #: bytes freed on workers so far (all replicas)
        self.states: dict[str, int] = {}  #: files per state, kept by _account
        self.file_outputs = 0  #: file outputs on workers now (``runtime/files.py``)
        self.file_bytes = 0  #: their bytes, over all their replicas

    def handle(self, facts: tuple[FileFact, ...]) -> list[DropReplicas | FilesDropped]:
        drops: dict[str, list[Key]] = {}
        released: list[Key] = []
        for fact in facts:
            old = self.files.get(fact.key)
            if old is not None and old.state == "released" and fact.state == "created":
                # Sent before the scheduler heard of the release: stale. (A file made
                # again passes through "pending" first.)
                continue
            if old is not None:
                self._account(old, -1)
            if fact.state == "forgotten":
                self.files.pop(fact.key, None)
                if fact.replicas:  # forgotten while still stored somewhere: free it
                    for w in fact.replicas:
                        drops.setdefault(w, []).append(fact.key)
                continue
            info = FileInfo(
                fact.key,
                fact.state,
                fact.nbytes,
                fact.replicas,
                fact.consumers,
                fact.wanted,
                fact.file,
            )
            if info.state == "created" and info.consumers == 0 and not info.wanted:
                for w in info.replicas:
                    drops.setdefault(w, []).append(info.key)
                self.released_total += 1
                self.released_bytes += info.nbytes * len(info.replicas)
                info.state = "released"
                info.replicas = ()
                released.append(info.key)
            self.files[info.key] = info
            self._account(info, +1)
        out: list[DropReplicas | FilesDropped] = [
            DropReplicas(w, tuple(keys)) for w, keys in drops.items()
        ]
        if released:
            out.append(FilesDropped(tuple(released)))
        return out

    def _account(self, info: FileInfo, sign: int) -> None:
        """Count ``info`` in (``sign`` 1) or out (-1) of the per-worker bytes and the
        per-state counts; every change to ``files`` goes through here."""
        for w in info.replicas:
            held = self.stored.get(w, 0) + sign * info.nbytes
            if held:
                self.stored[w] = held
            else:  # (a worker that holds nothing is not listed: nor every one ever seen)
                self.stored.pop(w, None)
        if info.file and info.replicas:
            self.file_outputs += sign
            self.file_bytes += sign * info.nbytes * len(info.replicas)
        n = self.states.get(info.state, 0) + sign
        if n:
            self.states[info.state] = n
        else:
            self.states.pop(info.state, None)

    def summary(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "states": dict(self.states),
            "stored_bytes": dict(self.stored),
            "released": self.released_total,
            "released_bytes": self.released_bytes,
            "file_outputs": self.file_outputs,
            "file_bytes": self.file_bytes,
        }


class FileRegistry(Actor):
    """Feeds :class:`FileTable` and carries out its commands."""

    def __init__(
        self,
        scheduler: Callable[[], ActorRef[Scheduler]],
        # a worker's reference: local, or a remote peer's (so not narrowed)
        resolve: Callable[[str], ActorRef[Any] | None],
    ) -> None:
        self.table = FileTable()
        self._scheduler = scheduler
        self._resolve = resolve

    @handles(FileFactsMsg)
    def facts(self, msg: FileFactsMsg) -> None:
        for cmd in self.table.handle(msg.facts):
            if isinstance(cmd, DropReplicas):
                ref = self._resolve(cmd.worker)
                if ref is not None and not ref.stopped:
                    ref.post(DropKeys(cmd.keys))
            else:
                self._scheduler().post(FilesReleasedMsg(cmd.keys))

    @handles(StatusRequest)
    def status(self, msg: StatusRequest) -> FilesStatus:
        return FilesStatus(**self.table.summary())
