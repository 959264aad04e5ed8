"""Orphaned sandboxes are swept (actors/store.py): a worker killed with SIGKILL leaves
its ``corral-spill-*`` directory behind; the next store made in the same directory
removes it, and never a live store's (its ``.owner`` lock is held by a real process),
a sandbox being made (no lock file yet, young) nor anything outside the sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from actors.store import LOCKLESS_AGE, SpillStore, sweep_orphans
from runtime.errors import FileOutputError
from runtime.files import File, TaskOutputs
from tests.helpers import log_lines

ROOT = Path(__file__).resolve().parents[1]

#: a child process: a store in argv[1] that spills one value and writes a file in its
#: sandbox, prints the sandbox's path, then waits for stdin to close and stops cleanly
_CHILD = """
import sys
from actors.store import SpillStore
store = SpillStore(sys.argv[1])
store["k"] = b"x" * 4096
assert store.spill(1) == 4096
with open(store.sandbox() + "/out.bin", "wb") as f:
    f.write(b"y" * 1000)
print(store.sandbox(), flush=True)
sys.stdin.read()
store.close()
"""


class Child:
    """A real process holding a store whose sandbox is in ``parent``."""

    def __init__(self, parent: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the test's timeout
        assert line, f"the child died: {self.proc.wait(10)}"
        self.sandbox = Path(line.strip())

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for c in made:
        c.close()


def _age(path: Path, seconds: float) -> None:
    """Set back the modification times of ``path`` and what is in it by ``seconds``."""
    then = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (then, then), follow_symlinks=False)


@pytest.mark.timeout(60)
def test_a_killed_workers_sandbox_is_swept_by_the_next_store(
    tmp_path: Path, children: list[Child]
) -> None:
    children.append(dead := Child(tmp_path))
    assert (dead.sandbox / ".owner").is_file()
    assert sorted(p.suffix for p in dead.sandbox.iterdir()) == ["", ".bin", ".spill"]
    dead.kill9()
    assert dead.sandbox.is_dir()  # what a SIGKILL leaves behind
    with SpillStore(tmp_path) as store:
        mine = Path(store.sandbox())
        assert not dead.sandbox.exists()
        assert [p.name for p in tmp_path.iterdir()] == [mine.name]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_live_processs_sandbox_is_never_swept(tmp_path: Path, children: list[Child]) -> None:
    children.append(live := Child(tmp_path))
    children.append(dead := Child(tmp_path))
    dead.kill9()
    before = sorted(p.name for p in live.sandbox.iterdir())
    nbytes = sum(p.stat().st_size for p in dead.sandbox.iterdir())
    assert nbytes > 4096 + 1000  # the spilled value and the file output
    assert sweep_orphans(str(tmp_path)) == (1, nbytes)
    assert not dead.sandbox.exists()
    assert sorted(p.name for p in live.sandbox.iterdir()) == before
    _age(live.sandbox, 2 * LOCKLESS_AGE)  # its lock, not its age, says it is alive
    with SpillStore(tmp_path) as store:
        store.sandbox()
        assert sorted(p.name for p in live.sandbox.iterdir()) == before
    live.stop()  # it stops cleanly: its own sandbox goes with it
    assert live.proc.returncode == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_store_in_this_process_is_never_swept(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as a, SpillStore(tmp_path) as b:
        made = {a.sandbox(), b.sandbox()}  # b's sweep passed a's by
        assert sweep_orphans(str(tmp_path)) == (0, 0)
        assert {str(p) for p in tmp_path.iterdir()} == made


@pytest.mark.timeout(60)
def test_lockless_sandboxes_young_stay_old_go(tmp_path: Path) -> None:
    """One without ``.owner``: made by an older Corral, or being made right now."""
    young = tmp_path / "corral-spill-young123"
    old = tmp_path / "corral-spill-old_1234"
    for d in (young, old):
        (d / "out").mkdir(parents=True)
        (d / "out" / "f").write_bytes(b"z" * 10)
        (d / "00000001.spill").write_bytes(b"s" * 20)
    _age(old, LOCKLESS_AGE + 60)
    with SpillStore(tmp_path) as store:
        store.sandbox()
        assert young.is_dir() and (young / "out" / "f").is_file()
        assert not old.exists()
    assert sweep_orphans(str(tmp_path), lockless_age=3600) == (0, 0)
    assert sweep_orphans(str(tmp_path), lockless_age=0) == (1, 30)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_the_sweep_touches_nothing_but_sandboxes(tmp_path: Path, children: list[Child]) -> None:
    """Other names, plain files and links are left; a link inside an orphan is removed,
    never what it points to."""
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data").write_bytes(b"keep me")
    for name in ("not-a-sandbox", "corral-spill-not-ours"):
        (tmp_path / name).mkdir()
        _age(tmp_path / name, 2 * LOCKLESS_AGE)
    (tmp_path / "corral-spill-file1234").write_bytes(b"a file, not a sandbox")
    (tmp_path / "corral-spill-link1234").symlink_to(outside, target_is_directory=True)
    children.append(dead := Child(tmp_path))
    (dead.sandbox / "link").symlink_to(outside, target_is_directory=True)
    (dead.sandbox / "out").mkdir()
    (dead.sandbox / "out" / "link").symlink_to(outside / "data")
    dead.kill9()
    assert sweep_orphans(str(tmp_path))[0] == 1
    assert not dead.sandbox.exists()
    assert (outside / "data").read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "corral-spill-file1234",
        "corral-spill-link1234",
        "corral-spill-not-ours",
        "not-a-sandbox",
        "precious",
    ]


@pytest.mark.timeout(60)
def test_a_sweep_out_of_time_leaves_the_rest_for_the_next(tmp_path: Path) -> None:
    orphans = []
    for i in range(3):
        d = tmp_path / f"corral-spill-orphan_{i}"
        d.mkdir()
        (d / "f").write_bytes(b"q")
        orphans.append(d)
        _age(d, 2 * LOCKLESS_AGE)
    assert sweep_orphans(str(tmp_path), seconds=-1) == (0, 0)
    assert all(d.is_dir() for d in orphans)
    assert sweep_orphans(str(tmp_path)) == (3, 3)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_directory_of_sandboxes_without_a_lock_is_not_one(tmp_path: Path) -> None:
    """A spill directory named like a sandbox, holding live sandboxes, is never swept
    from the directory above it, however old."""
    parent = tmp_path / "corral-spill-parent1"
    with SpillStore(parent) as live:
        live.sandbox()
        _age(parent, 2 * LOCKLESS_AGE)
        assert sweep_orphans(str(tmp_path)) == (0, 0)
        assert os.path.isdir(live.sandbox())


@pytest.mark.timeout(60)
def test_a_missing_parent_is_logged_not_raised(tmp_path: Path) -> None:
    assert sweep_orphans(str(tmp_path / "gone")) == (0, 0)


def _on_first_unlink(monkeypatch: pytest.MonkeyPatch, step: Callable[[], None]) -> None:
    """Run ``step`` once, just before the first file is unlinked from now on: in the
    middle of a sandbox's removal (it unlinks nothing before that)."""
    unlink = os.unlink
    pending = [step]

    def first(*args: object, **kwargs: object) -> None:
        while pending:
            pending.pop()()
        unlink(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", first)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step", ["first output_path", "output_path again", "File returned"])
def test_a_task_running_on_while_its_sandbox_goes_writes_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A thread cannot be killed: a task still running when its worker stops may ask
    for an output path, or return its file output, while the worker removes its
    sandbox. Forced here in the order that lost before (the removal had begun, took
    the lock file, then failed on what the task put there: a sandbox left without
    ``.owner``, which no sweep took for 10 minutes): the task gets FileOutputError and
    nothing is left."""
    store = SpillStore(tmp_path)
    store["k"] = b"x" * 4096
    assert store.spill(1) == 4096
    files = TaskOutputs(store.sandbox(), "skim-1")
    if step != "first output_path":
        Path(files.path("skim.bin")).write_bytes(b"s" * 500)  # before the stop
    refused: list[str] = []

    def task() -> None:
        try:
            if step == "File returned":
                files.finish(File(files.path("skim.bin")))
            else:
                Path(files.path("events.bin")).write_bytes(b"e" * 100)
        except FileOutputError as exc:
            refused.append(str(exc))

    _on_first_unlink(monkeypatch, task)
    store.close()
    monkeypatch.undo()
    assert len(refused) == 1 and "'skim-1' has no sandbox any more" in refused[0], refused
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_what_a_stopping_store_cannot_remove_keeps_its_lock_file_and_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file the store cannot remove (a task made it so) stays, with the lock file
    beside it: once the store lets go of the lock, the next store's sweep takes it, as
    a killed worker's (before, the lock file went first and the rest waited 10 minutes
    for a sweep)."""
    store = SpillStore(tmp_path)
    Path(store.sandbox(), "stuck.bin").write_bytes(b"q" * 10)
    unlink = os.unlink

    def refuse(path: str, *args: object, **kwargs: object) -> None:
        if os.path.basename(path) == "stuck.bin":
            raise PermissionError(13, "Permission denied", path)
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", refuse)
    with log_lines() as log:
        store.close()
    monkeypatch.undo()
    assert log.has("level='warning'", "cannot remove all of the sandbox", "PermissionError")
    (left,) = tmp_path.iterdir()
    assert sorted(p.name for p in left.iterdir()) == [".owner", "stuck.bin"]
    with SpillStore(tmp_path) as after:
        mine = Path(after.sandbox())
        assert [p.name for p in tmp_path.iterdir()] == [mine.name]
    assert list(tmp_path.iterdir()) == []
