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
from runtime.errors import GraphError, GraphNotLoadable, TaskNotLoadable
from runtime.pickling import cloudpickle_dumps
from runtime.unpickling import loads, missing_global
from tests.helpers import Cli

LIMIT = 60
run = anyio.to_thread.run_sync

MODULE = "corral_labops_only_here"


@pytest.fixture
def labops(tmp_path: Path) -> Iterator[ModuleType]:
    """A module only this process can import: its directory put on ``sys.path`` here,
    never on the children's ``PYTHONPATH``."""
    where = tmp_path / "pkgdir"
    where.mkdir()
    (where / f"{MODULE}.py").write_text("def double(x):\n    return 2 * x\n")
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


def test_the_children_cannot_import_the_module(labops: ModuleType, tmp_path: Path) -> None:
    """The premise of the tests above: a child process (as a worker or a manager is
    started) does not import it."""
    with Cli(tmp_path / "home") as cli:
        proc = cli.spawn([sys.executable, "-c", f"import {MODULE}"])
        assert proc.wait(LIMIT) != 0
        assert f"No module named '{MODULE}'" in "".join(cli.rest(proc))
