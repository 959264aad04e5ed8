"""A task function from a module the client can import but the workers or the manager
cannot (a ``sys.path`` change in the client, a module not on their ``PYTHONPATH``).

Before, worker processes failed the task with a bare ``ModuleNotFoundError``, as if the
task had raised it (and spent its ``retries`` on tries that fail alike), and a manager
process answered the submission with ``RemoteError: remote ProtocolError: could not
unpickle a SubmitGraphRequest ... Do both sides run the same versions ...``. Now the
task fails with :class:`TaskNotLoadable` (not retried) and the manager refuses the graph
with :class:`GraphNotLoadable` (a ``GraphError``), both naming the function and the
module and saying what to do; and the advice they give,
``cloudpickle.register_pickle_by_value``, runs the task. Real worker and manager
processes on 127.0.0.1; every wait bounded.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import cloudpickle
import pytest

from policies import NOT_LOADABLE, REGISTRY
from runtime import Cluster
from runtime.errors import DependencyFailed, GraphError, GraphNotLoadable, TaskNotLoadable
from runtime.pickling import cloudpickle_dumps
from runtime.unpickling import loads, missing_global, needs_module
from tests.helpers import Cli, free_port_between

LIMIT = 60
run = anyio.to_thread.run_sync

MODULE = "corral_labops_only_here"


@pytest.fixture
def labops(tmp_path: Path) -> Iterator[ModuleType]:
    """A module only this process can import: its directory put on ``sys.path`` here,
    never on the children's ``PYTHONPATH``."""
    where = tmp_path / "pkgdir"
    where.mkdir()
    code = "def double(x):\n    return 2 * x\n\ndef triple(x):\n    return 3 * x\n"
    (where / f"{MODULE}.py").write_text(code)
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(where))
        sys.modules.pop(MODULE, None)


def test_missing_global_names_the_function_and_the_module(labops: ModuleType) -> None:
    payload = cloudpickle_dumps((labops.double, 21))
    sys.modules.pop(MODULE)
    sys.path.pop(0)  # (the fixture's: gone, as on a worker)
    try:
        with pytest.raises(ModuleNotFoundError) as caught:
            loads(payload)
        assert missing_global(caught.value, payload) == (f"{MODULE}.double", MODULE)
        assert missing_global(ValueError("x"), payload) is None
    finally:
        sys.path.insert(0, str(Path(labops.__file__).parent))


def test_needs_module_finds_what_a_pickle_loads_from_a_module(labops: ModuleType) -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}  # a script's: pickled by value
    exec(f"import {MODULE}\ndef calls(x):\n    return {MODULE}.double(x)\n", namespace)
    # More modules, ours second or third: cloudpickle memoizes its subimport for the
    # first (os) and fetches it from the memo for each later one (review 1207a F4: those
    # were missed).
    two = f"def calls_two(x):\n    os.getpid()\n    return {MODULE}.double(x)\n"
    three = (
        f"def calls_three(x):\n    os.getpid()\n    json.dumps(x)\n    return {MODULE}.double(x)\n"
    )
    exec(f"import os, json, {MODULE}\n{two}{three}", namespace)
    for obj, found in [
        ((labops.double, 21), f"{MODULE}.double"),  # by reference
        ({"f": [labops.triple]}, f"{MODULE}.triple"),
        (namespace["calls"], ""),  # cloudpickle imports the module by its name
        (namespace["calls_two"], ""),  # ... and ours after another
        (namespace["calls_three"], ""),  # ... or two others
        ((abs, MODULE, [MODULE, f"{MODULE}.double"]), None),  # strings, not loads
        (importlib.import_module, None),
    ]:
        assert needs_module(cloudpickle_dumps(obj), MODULE) == found, obj
    assert needs_module(cloudpickle_dumps(labops.double), MODULE[:-1]) is None  # a prefix
    assert needs_module(cloudpickle_dumps(labops.double), MODULE + ".sub") is None
    assert needs_module(cloudpickle_dumps(sys.path.append), "builtins") == "builtins.getattr"


def test_the_default_retry_policy_does_not_retry_code_that_did_not_load() -> None:
    class View:
        retries_left = 3

    policy = REGISTRY.create("retry", "default")
    assert not policy.decide(View(), "error", NOT_LOADABLE).retry  # type: ignore[arg-type]
    assert policy.decide(View(), "error", None).retry  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_a_worker_process_that_cannot_import_the_function_says_so(
    labops: ModuleType, execution: str
) -> None:
    options = {"execution": execution}
    async with Cluster(processes=1, memory_options=options) as c:
        with anyio.fail_after(LIMIT):
            fut = c.submit(labops.double, 21, retries=2)
            with pytest.raises(TaskNotLoadable) as caught:
                await fut
            err = caught.value
            assert (err.what, err.module) == (f"{MODULE}.double", MODULE)
            assert isinstance(err.__cause__, ModuleNotFoundError)
            text = str(err)
            assert f"register_pickle_by_value({MODULE})" in text and "PYTHONPATH" in text
            # Not retried: every worker fails alike (its story has one try).
            story = await c.story(fut.key)
            assert sum(1 for s in story if s[2] == "processing") == 1, story
            assert await c.submit(sum, [1, 2]) == 3  # the cluster goes on


@pytest.mark.anyio
async def test_a_manager_that_cannot_import_the_function_refuses_the_graph(
    labops: ModuleType, tmp_path: Path
) -> None:
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = await run(cli.manager, "--no-monitoring")
        await run(cli.worker, address)
        async with Cluster(address) as c:
            with pytest.raises(GraphNotLoadable) as caught:
                await c.submit(labops.double, 21)
            err = caught.value
            assert isinstance(err, GraphError)
            assert (err.what, err.module) == (f"{MODULE}.double", MODULE)
            assert "manager process" in str(err) and "versions" not in str(err)
            assert await c.submit(sum, [1, 2]) == 3
            # What the message advises: the code goes with the task, and it runs.
            cloudpickle.register_pickle_by_value(labops)
            try:
                assert await c.submit(labops.double, 21) == 42
            finally:
                cloudpickle.unregister_pickle_by_value(labops)


class _ImportsIt:
    """An argument that, loaded, imports the module by a call (not a global that names
    its module, which the client finds in the task's pickle)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return importlib.import_module, (MODULE,)


@pytest.mark.anyio
async def test_tasks_submitted_with_one_that_the_manager_cannot_load_run(
    labops: ModuleType, tmp_path: Path
) -> None:
    """The ``submit`` calls of one tick go to the manager as one message. Before, the
    manager's refusal of it, for one task's module, failed every task of it (and of the
    later messages of that tick) with a GraphNotLoadable naming that task's function.
    Now the tasks the manager can load run; each one it cannot fails naming its own
    function, and a task reading one fails as depending on it. Unit: ``needs_module``."""
    lo, hi = 63500, 63999
    port = free_port_between(lo, hi)
    address = f"ws://127.0.0.1:{port}"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        await run(cli.line_with, manager, "manager listening on")
        worker = cli.start("worker", address, "--port-range", f"{lo}-{hi}")
        await run(cli.line_with, worker, "joined")
        async with Cluster(address) as c:
            futs = [c.submit(sum, [1, i]) for i in range(6)]
            doubled = c.submit(labops.double, 21)
            futs.append(c.submit(abs, -5))
            reader = c.submit(sum, [doubled])
            tripled = c.submit(labops.triple, 2)
            imported = c.submit(repr, _ImportsIt(), pure=False)  # found by halving
            futs.append(c.submit(max, [7, 3], priority=1))  # another message, after
            assert await c.gather(futs) == [1, 2, 3, 4, 5, 6, 5, 7]
            for fut, name in ((doubled, "double"), (tripled, "triple")):
                with pytest.raises(GraphNotLoadable) as caught:
                    await fut
                assert (caught.value.what, caught.value.module) == (f"{MODULE}.{name}", MODULE)
            with pytest.raises(GraphNotLoadable) as caught:
                await imported
            assert (caught.value.what, caught.value.module) == ("", MODULE)
            with pytest.raises(DependencyFailed) as failed:
                await reader
            assert f"{MODULE}.double" in str(failed.value)


def test_the_children_cannot_import_the_module(labops: ModuleType, tmp_path: Path) -> None:
    """The premise of the tests above: a child process (as a worker or a manager is
    started) does not import it."""
    with Cli(tmp_path / "home") as cli:
        proc = cli.spawn([sys.executable, "-c", f"import {MODULE}"])
        assert proc.wait(LIMIT) != 0
        assert f"No module named '{MODULE}'" in "".join(cli.rest(proc))
