"""``runtime.get`` as a dask user calls it: Ctrl-C inside a running event loop (a Jupyter
cell), the task's exception with its own ``__context__``, and the options that do not
apply (the sizes of an embedded cluster with ``address=``, dask's thread ``pool=``).

The Ctrl-C tests run the cell in a real child process and send it SIGINT once a task
has started; the graph's tasks wait for a gate the test opens only at its end, so the
child can end only by being interrupted, never by finishing the graph.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

import runtime
from runtime import Cluster
from runtime.errors import GraphError
from tests.helpers import Cli, wait_until

LIMIT = 90  # seconds a Ctrl-C test may take in all (a manager and a worker start)

#: The cell: ``python cell.py MARKS embedded|ADDRESS loop|run``, in a loop of its own (as
#: in ipykernel) or in ``asyncio.run``. Each task touches MARKS/started-I, waits (at most
#: two minutes) for MARKS/gate, then touches MARKS/ended-I.
CELL = """
import asyncio, pathlib, signal, sys, threading, time

import dask

import runtime

marks = pathlib.Path(sys.argv[1])
address = None if sys.argv[2] == "embedded" else sys.argv[2]


def held(i):
    (marks / f"started-{i}").touch()
    deadline = time.monotonic() + 120
    while not (marks / "gate").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    (marks / f"ended-{i}").touch()
    return i


async def cell():
    total = dask.delayed(sum)([dask.delayed(held)(i) for i in range(8)])
    options = {"address": address} if address else {"num_workers": 2}
    try:
        return dask.compute(total, scheduler=runtime.get, **options)
    except BaseException as exc:
        left = [t.name for t in threading.enumerate() if t.name == "corral-get"]
        name = type(exc).__name__
        print(f"{name} reached the cell; helper threads left: {left}", flush=True)
        raise


signal.signal(signal.SIGINT, signal.default_int_handler)  # as ipykernel has it
if sys.argv[3] == "run":  # its SIGINT handler cancels the cell's task, raising nothing
    print(asyncio.run(cell()), flush=True)
else:
    print(asyncio.new_event_loop().run_until_complete(cell()), flush=True)
"""

ACTIVE = ("waiting", "queued", "processing")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("where", "runner"), [("embedded", "loop"), ("manager", "loop"), ("embedded", "run")]
)
async def test_ctrl_c_in_a_running_loop_cancels_the_computation(
    tmp_path: Path, where: str, runner: str
) -> None:
    """Ctrl-C in a cell that waits in ``runtime.get`` ends the computation, then reaches
    the cell: as ``KeyboardInterrupt`` in a loop of its own (ipykernel's), and under
    ``asyncio.run`` (whose SIGINT handler cancels its main task, raising nothing) as the
    task's ``CancelledError``, which ``asyncio.run`` turns into ``KeyboardInterrupt``
    (get went on to its end, and the interrupt came after it)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "cell.py"
    script.write_text(CELL)
    with Cli(tmp_path / "home") as cli:
        try:
            with anyio.fail_after(LIMIT):
                target = "embedded"
                if where == "manager":
                    _, target = cli.manager("--no-monitoring")
                    cli.worker(target, "--cores", "2")
                cell = cli.spawn([sys.executable, str(script), str(marks), target, runner])
                # Another process's progress shows only in the filesystem: bounded polls.
                await wait_until(lambda: any(marks.glob("started-*")), "a task to start",
                                 limit=60)  # fmt: skip
                cell.send_signal(signal.SIGINT)
                # The graph cannot finish while the gate is shut: the cell ends only if
                # the interrupt reaches it.
                await wait_until(lambda: cell.poll() is not None, "the cell to end", limit=30)
                # The helper thread (with the cluster or the connection) had ended by
                # the time the interrupt reached the cell.
                reached = "CancelledError" if runner == "run" else "KeyboardInterrupt"
                line = cli.line_with(cell, f"{reached} reached the cell")
                assert line.rstrip().endswith("helper threads left: []"), line
                cli.line_with(cell, "KeyboardInterrupt")  # the traceback's last line
                assert cell.returncode != 0
                assert not list(marks.glob("ended-*"))
                if where == "manager":
                    # Its tasks were cancelled on the manager's workers, not left running.
                    async with Cluster(target) as c:

                        async def idle() -> bool:
                            by_state = (await c.status())["tasks_by_state"]
                            return not any(by_state.get(s, 0) for s in ACTIVE)

                        await wait_until(idle, "the cell's tasks to be cancelled", limit=30)
        finally:
            (marks / "gate").touch()


# ----------------------------------------------------------------------------- errors


def _raises_in_handling() -> None:
    try:
        int("x17")
    except ValueError:
        # the implicit context (no `from`) is what the test is about
        raise KeyError("run 17 has no calibration")  # noqa: B904


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_loop", [False, True], ids=["plain", "in-loop"])
def test_the_task_exception_keeps_its_own_context(in_loop: bool) -> None:
    dsk: dict[Any, Any] = {"k": (_raises_in_handling,)}

    async def cell() -> Any:
        return runtime.get(dsk, "k")

    with pytest.raises(KeyError) as info:
        asyncio.run(cell()) if in_loop else runtime.get(dsk, "k")
    context = info.value.__context__
    assert isinstance(context, ValueError), repr(context)
    assert "x17" in str(context)


# ----------------------------------------------------------------------------- options

NOBODY = "ws://127.0.0.1:9"  # nothing listens: an option error must come before connecting


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option", ["workers", "threads_per_worker", "num_workers"])
def test_cluster_sizes_do_not_apply_with_an_address(option: str) -> None:
    sizes: dict[str, Any] = {option: 4}
    with pytest.raises(TypeError, match=rf"{option} with address=.*--cores"):
        runtime.get({"x": 1}, "x", address=NOBODY, **sizes)


@pytest.mark.timeout(60)
def test_dask_thread_pool_is_not_a_worker_pool() -> None:
    with ThreadPoolExecutor(1) as threads:
        with pytest.raises(GraphError, match=r"ThreadPoolExecutor as pool.*pool of workers"):
            runtime.get({"x": 1}, "x", pool=threads)
        with pytest.raises(GraphError, match="does not apply"):
            runtime.get({"x": 1}, "x", address=NOBODY, pool=threads)


@pytest.mark.timeout(60)
def test_unknown_option_error_lists_files_to() -> None:
    with pytest.raises(TypeError, match="files_to") as info:
        runtime.get({"x": 1}, "x", n_workers=4)
    assert "n_workers" in str(info.value)
