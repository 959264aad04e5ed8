"""A worker's checkpoint files: where they live and what they take of its disk.

What lives here: :class:`CheckpointFiles`, the worker's table of the checkpoint files
on its disk (its running tasks' own, copies it keeps for a peer's tasks, and ones it
fetched to resume a task) in one directory of the worker's sandbox. A peer copies one
as any file travels between workers: the holder serves it as a stream of its bytes
with its size and sha256 (:meth:`CheckpointFiles.checksum`, measured once, the first
time it is served), and the reader writes it part by part, checked and resumed after a
broken stream, with :func:`actors.transfer.fetch_file`.

Tasks write their checkpoint files themselves (``runtime/task.py``): from a task's
thread, or from a task process, they first :meth:`CheckpointFiles.reserve` room (which
counts at once in :attr:`CheckpointFiles.nbytes`, the bytes the worker adds to its
disk use), then the worker records the file (:meth:`~CheckpointFiles.commit`) or gives
the room back (:meth:`~CheckpointFiles.release`). Thread-safe: task threads reserve,
the worker's loop does the rest. docs/files.md, "Checkpoints".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

from runtime.task import checkpoint_name

__all__ = ["INLINE_BYTES", "CheckpointFiles"]

#: checkpoint files up to this size travel to the scheduler with the message that
#: announces them (the scheduler holds them, up to its ``checkpoint_inline_bytes``:
#: their copy off the worker); larger ones stay on disks (a peer copies them)
INLINE_BYTES = 4 * 2**20


class CheckpointFiles:
    """The checkpoint files on one worker's disk, ``(key, seq) -> (path, nbytes)``.

    ``directory``: where the files go (the worker's ``checkpoints`` directory in its
    sandbox), made at the first reservation and removed by :meth:`close`. ``room()``:
    the bytes the worker's disk has left for them (its disk budget less what its
    outputs, these files and the copies under way take)."""

    def __init__(self, directory: str, worker: str, room: Callable[[], int]) -> None:
        self.worker = worker
        self.room = room
        self._lock = threading.Lock()
        self.directory = directory  #: made at the first reservation
        self._made = False
        self._closed = False  #: the worker stopped: no more files
        self.files: dict[tuple[Any, int], tuple[str, int]] = {}
        #: sha256 of files here, once measured (served to a peer, or copied from one)
        self._checksums: dict[tuple[Any, int], str] = {}
        self._reserved: dict[tuple[Any, int], int] = {}
        #: of those, copies being fetched from a peer (not a try's: settle leaves them)
        self._fetching: set[tuple[Any, int]] = set()
        self.nbytes = 0  #: bytes of the files here plus the room reserved for new ones

    def path(self, key: Any, seq: int) -> str:
        return os.path.join(self.directory, checkpoint_name(key, seq))

    def reserve(self, key: Any, seq: int, nbytes: int, fetch: bool = False) -> str | None:
        """Room for checkpoint ``seq`` of ``key`` (``nbytes``): None when granted (it
        counts in :attr:`nbytes` from now on), else why not, with the sizes. ``fetch``:
        for a copy from a peer, which a try of ``key`` ending here does not settle."""
        with self._lock:
            if self._closed:
                return (
                    f"worker {self.worker!r} stopped while task {key!r} ran: its next try "
                    "runs on another worker, from the checkpoint before this one."
                )
            if not self._made:
                try:
                    os.makedirs(self.directory, mode=0o700, exist_ok=True)
                except OSError as exc:
                    return f"worker {self.worker!r} cannot make {self.directory}: {exc}."
                self._made = True
            left = self.room()
            if nbytes > left:
                return (
                    f"checkpoint {seq} of task {key!r} is {nbytes} bytes, more than the "
                    f"{left} bytes of disk worker {self.worker!r} has left (its outputs and "
                    "checkpoints share its disk): save less (the progress made, not the "
                    "data), or give the worker more disk (--disk). The previous checkpoint "
                    "stays."
                )
            self._reserved[(key, seq)] = self._reserved.get((key, seq), 0) + nbytes
            self.nbytes += nbytes
            if fetch:
                self._fetching.add((key, seq))
            return None

    def release(self, key: Any, seq: int) -> None:
        """Give back the room reserved for ``(key, seq)`` (its write failed)."""
        with self._lock:
            self.nbytes -= self._reserved.pop((key, seq), 0)
            self._fetching.discard((key, seq))

    @property
    def pending(self) -> bool:
        """Whether room is reserved for a file not written yet."""
        return bool(self._reserved)

    def settle(self, key: Any) -> None:
        """A try of ``key`` ended: room still reserved for it (a task process killed
        between its reservation and the worker's news of its file) comes back, and the
        file goes, partial (``.tmp``) or whole but never recorded. A copy being fetched
        from a peer is not the try's: it stays."""
        with self._lock:
            mine = [i for i in self._reserved if i[0] == key and i not in self._fetching]
            for item in mine:
                self.nbytes -= self._reserved.pop(item)
                path = os.path.join(self.directory, checkpoint_name(*item))
                for name in (path + ".tmp", path):
                    if name not in (self.files.get(item) or ("",)):
                        with contextlib.suppress(OSError):
                            os.unlink(name)

    def commit(self, key: Any, seq: int, path: str, nbytes: int, checksum: str = "") -> None:
        """The file of ``(key, seq)`` is in place (its room was reserved, or is taken
        now); ``checksum``: its sha256, when known (a copy checked against it)."""
        with self._lock:
            self.nbytes -= self._reserved.pop((key, seq), 0)
            self._fetching.discard((key, seq))
            old = self.files.get((key, seq))
            if old is not None:
                self.nbytes -= old[1]
            self.files[(key, seq)] = (path, nbytes)
            self.nbytes += nbytes
            if checksum:
                self._checksums[(key, seq)] = checksum
            else:
                self._checksums.pop((key, seq), None)

    def checksum(self, key: Any, seq: int) -> str:
        """The sha256 of the file of ``(key, seq)`` if measured ("" if not)."""
        with self._lock:
            return self._checksums.get((key, seq), "")

    def measured(self, key: Any, seq: int, path: str, checksum: str) -> None:
        """The file of ``(key, seq)`` at ``path`` was measured: ``checksum`` is its sha256
        (kept while that file is the one recorded)."""
        with self._lock:
            if self.files.get((key, seq), ("",))[0] == path:
                self._checksums[(key, seq)] = checksum

    def find(self, key: Any, seq: int) -> tuple[str, int] | None:
        with self._lock:
            return self.files.get((key, seq))

    def latest(self, key: Any) -> tuple[int, str] | None:
        """``(seq, path)`` of the newest file of ``key`` here, or None."""
        if not self.files:  # the common case, on every task's start: no lock
            return None
        with self._lock:
            seqs = [seq for k, seq in self.files if k == key]
            if not seqs:
                return None
            seq = max(seqs)
            return seq, self.files[(key, seq)][0]

    def drop(self, key: Any, seq: int = 0) -> int:
        """Delete the file of ``(key, seq)``, or every file of ``key`` (``seq`` 0);
        the bytes freed."""
        with self._lock:
            gone = [(k, s) for k, s in self.files if k == key and seq in (0, s)]
            freed = 0
            for item in gone:
                path, nbytes = self.files.pop(item)
                self._checksums.pop(item, None)
                freed += nbytes
                with contextlib.suppress(OSError):
                    os.unlink(path)
            self.nbytes -= freed
            return freed

    def close(self) -> None:
        """Delete every file and the directory; later reservations are refused."""
        with self._lock:
            self._closed = True
            made, self._made = self._made, False
            self.files.clear()
            self._checksums.clear()
            self._reserved.clear()
            self._fetching.clear()
            self.nbytes = 0
        if made:
            shutil.rmtree(self.directory, ignore_errors=True)
