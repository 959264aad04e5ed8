"""Unpickling in several threads of a worker process at once (runtime/unpickling.py).

The race: a worker's executor thread loads a task (its function's modules imported for
the first time) while its event loop unpickles data fetched from a peer that needs a
module of the same package. Python hands one thread the other's module half run and
the import fails ("cannot import name ... from partially initialized module"); numpy 2
did this in tests/test_fault_files.py. Here a tiny package written to ``tmp_path``
makes it happen every time, in a fresh process, through Corral's own code paths: the
thread executor running a pickled task node (``actors.executor.Executor``) and the
loop's ``runtime.remote.from_wire`` of a pickled ``DataReply``.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from runtime import unpickling

ROOT = Path(__file__).resolve().parent.parent

# The package imports, from its __init__, ``a``, which imports ``b``, which imports a
# name ``a`` defined before that: fine in one thread. Two threads importing at once,
# the first through the package (so ``a``) and the second straight into ``b``, meet in
# the middle (``racesync.meet``); then the first waits until the second is blocked on
# ``a`` before it asks for ``b``: Python finds the deadlock and gives the first thread
# ``b`` half run, without ``g``. Unarmed (a single importer) both waits are skipped;
# armed with one importer at a time (the fix), each gives up after WAIT seconds.
WAIT = 1.0
FILES = {
    "racesync.py": f"""
        import importlib._bootstrap as bootstrap
        import threading
        import time

        armed = False
        barrier = threading.Barrier(2)

        def meet():
            if armed:
                try:
                    barrier.wait(timeout={WAIT})
                except threading.BrokenBarrierError:
                    pass

        def until_another_thread_waits_on_an_import():
            if not armed:
                return
            me = threading.get_ident()
            end = time.monotonic() + {WAIT}
            while time.monotonic() < end:
                if any(t != me for t in getattr(bootstrap, "_blocking_on", {{}})):
                    return
                time.sleep(0.005)
        """,
    "racepkg/__init__.py": "from racepkg import a\n",
    "racepkg/a.py": """
        import racesync

        def f():
            return "f"

        racesync.meet()
        racesync.until_another_thread_waits_on_an_import()
        from racepkg.b import g
        """,
    "racepkg/b.py": """
        import racesync

        racesync.meet()
        from racepkg.a import f

        def g():
            return "g"
        """,
}

# Run in a fresh interpreter: makes the pickles (unarmed, in a first process), then
# loads them in a second one from two threads at once.
DRIVER = """
import asyncio, json, pickle, sys, threading, time

sys.path.insert(0, sys.argv[2])
mode = sys.argv[1]

if mode == "make":
    import cloudpickle
    from dask._task_spec import Task

    import racepkg.a
    import racepkg.b
    from runtime.graph import PickledNode
    from runtime.messages import DataReply
    from runtime.remote import to_wire

    node = PickledNode("t", cloudpickle.dumps(Task("t", racepkg.a.f), protocol=5))
    reply = to_wire(DataReply({"x": racepkg.b.g}))
    sys.stdout.buffer.write(pickle.dumps((node.payload, reply.type_name, reply.payload)))
    sys.exit(0)

import racesync
racesync.armed = True
if mode == "unguarded":  # the control: every unpickle as if runtime.unpickling did nothing
    import runtime.unpickling
    runtime.unpickling.guarded = lambda load: load()

from actors.executor import Executor
from actors.protocol import ToRun
from runtime.graph import PickledNode
from runtime.remote import PickledMsg, from_wire

node_payload, type_name, reply_payload = pickle.loads(sys.stdin.buffer.read())


async def main():
    done = threading.Event()
    results = []

    def deliver(batch):
        results.extend(batch)
        done.set()

    ex = Executor(1, "race", deliver)
    ex.submit(ToRun("t", PickledNode("t", node_payload), "t", ()), {})
    end = time.monotonic() + 10
    while "racepkg" not in sys.modules:  # the executor's thread is in the package
        assert time.monotonic() < end, "the executor thread never started importing"
        time.sleep(0.001)
    try:  # on the loop, as a worker reads a fetched DataReply
        loop = repr(from_wire(PickledMsg(type_name, reply_payload), allow_pickle=True).data)
    except Exception as exc:
        loop = "error: " + repr(exc)
    assert await asyncio.to_thread(done.wait, 20), "the task never finished"
    ex.shutdown()
    result, value = results[0]
    task = value if result.outcome == "ok" else "error: " + repr(result.error)
    print(json.dumps({"task": task, "loop": loop}))


asyncio.run(main())
"""


def _write_package(tmp_path: Path) -> Path:
    where = tmp_path / "pkgs"
    for name, text in FILES.items():
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return where


def _run(mode: str, where: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, mode, str(where)],
        input=stdin,
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )


def _race(tmp_path: Path, mode: str) -> dict[str, str]:
    where = _write_package(tmp_path)
    made = _run("make", where)
    assert made.returncode == 0, made.stderr.decode()
    ran = _run(mode, where, made.stdout)
    assert ran.returncode == 0, ran.stderr.decode()
    out: dict[str, str] = json.loads(ran.stdout.decode().strip().splitlines()[-1])
    return out


@pytest.mark.timeout(90)
def test_a_task_loading_in_a_thread_and_the_loop_unpickling_import_one_at_a_time(
    tmp_path: Path,
) -> None:
    out = _race(tmp_path, "guarded")
    assert out["task"] == "f", out
    assert out["loop"].startswith("{'x': <function g at "), out


@pytest.mark.timeout(90)
def test_without_the_guard_the_same_race_fails_the_import(tmp_path: Path) -> None:
    """The control: the package and the timing above do reproduce the race."""
    out = _race(tmp_path, "unguarded")
    assert "partially initialized module 'racepkg.b'" in out["task"], out
    assert out["loop"].startswith("error: ProtocolError("), out


def test_an_unpickle_that_imports_nothing_new_takes_no_lock() -> None:
    """The event loop never waits for another thread's slow first import when what it
    unpickles needs no module it lacks: here while another thread holds the lock."""
    data = pickle.dumps({"k": [1, 2.0, "x", (b"y",)]}, protocol=5)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with unpickling._LOCK:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        assert unpickling.loads(data) == {"k": [1, 2.0, "x", (b"y",)]}
        assert not release.is_set() and holder.is_alive()  # the lock was never free
    finally:
        release.set()
        holder.join(10)


def test_a_new_import_is_made_under_the_lock_and_the_load_still_succeeds(
    tmp_path: Path,
) -> None:
    """A module imported for the first time by an unpickle is imported under the lock
    (seen from the module's own code), and what it unpickles comes back whole."""
    (tmp_path / "lockseen.py").write_text(
        "import runtime.unpickling as u\n"
        "held = u._LOCK._is_owned()\n"
        "class Thing:\n"
        "    def __eq__(self, other):\n"
        "        return type(other) is Thing\n"
    )
    # lockseen.Thing() pickled (protocol 4) without importing lockseen here
    data = b"\x80\x04\x8c\x08lockseen\x8c\x05Thing\x93)\x81."
    sys.path.insert(0, str(tmp_path))
    try:
        value = unpickling.loads(data)
        import lockseen  # type: ignore[import-not-found]

        assert value == lockseen.Thing()
        assert lockseen.held is True
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("lockseen", None)


def test_a_library_that_swallows_the_stop_still_gets_its_import(tmp_path: Path) -> None:
    """An object whose unpickling catches everything around a lazy import (a bare
    ``except``) would take its fallback in the unlocked pass: it is loaded again under
    the lock, where the import is made, so the value is the one a plain load gives."""
    (tmp_path / "lazyholder.py").write_text(
        "class Holder:\n"
        "    def __init__(self):\n"
        "        self.dep = 'unset'\n"
        "    def __setstate__(self, state):\n"
        "        try:\n"
        "            import lazydep\n"
        "            self.dep = lazydep.NAME\n"
        "        except BaseException:\n"
        "            self.dep = 'fallback'\n"
    )
    (tmp_path / "lazydep.py").write_text("NAME = 'imported'\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import lazyholder  # type: ignore[import-not-found]

        data = pickle.dumps(lazyholder.Holder(), protocol=5)
        assert "lazydep" not in sys.modules
        assert unpickling.loads(data).dep == "imported"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("lazyholder", None)
        sys.modules.pop("lazydep", None)


def test_the_import_watch_goes_back_in_front_of_a_finder_put_before_it() -> None:
    class Other:
        def find_spec(self, name: str, path: object = None, target: object = None) -> None:
            return None

    other = Other()
    unpickling.loads(pickle.dumps(1))
    sys.meta_path.insert(0, other)
    try:
        assert unpickling.loads(pickle.dumps([1])) == [1]
        assert sys.meta_path[0] is unpickling._WATCH
        assert other in sys.meta_path
        assert sys.meta_path.count(unpickling._WATCH) == 1
    finally:
        sys.meta_path.remove(other)
