"""A task that raises in another process gives its caller the exception's traceback.

A pickle of an exception leaves out its ``__traceback__`` (and its ``__cause__`` and
``__context__``): a task's exception used to reach ``await future``, ``compute`` and
the dashboard's failure groups without a frame of the task, unless some import had
happened to install tblib's reducers for its class (dask's multiprocessing module does,
for the classes defined then). Now ``runtime.remote.pack_error`` sends the frames and
the chain along (with tblib), on both hops: task process -> worker, worker -> scheduler.

The cluster tests run real worker processes (``Cluster(processes=1)``, connected over
websockets on 127.0.0.1), in thread and in process execution; every wait is bounded
with ``anyio.fail_after``.
"""

from __future__ import annotations

import copyreg
import subprocess
import sys
import textwrap
import threading
import traceback
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster

LIMIT = 60  # seconds for a cluster of worker processes to start
PROMPT = 30  # seconds a failing task may take to raise
ROOT = Path(__file__).resolve().parent.parent

EXECUTIONS = pytest.mark.parametrize("execution", ["thread", "process"])


def frames(err: BaseException | None) -> str:
    """The frames of ``err``'s traceback, formatted (its text and chain left out)."""
    assert err is not None
    return "".join(traceback.format_tb(err.__traceback__))


def plain_install() -> None:
    """Make the process this runs in pickle exceptions as after a plain install
    without tblib: drop the reducers that ``tblib.pickling_support.install()`` put in
    ``copyreg`` (dask's multiprocessing module, which Corral imports, calls it when
    tblib is installed, for the exception classes defined then), so that frames can
    travel only as Corral itself sends them."""
    for cls, reducer in list(copyreg.dispatch_table.items()):
        module = getattr(getattr(reducer, "func", reducer), "__module__", None) or ""
        if module.startswith("tblib"):
            del copyreg.dispatch_table[cls]


# -- tasks (each named so that its frame can be told in a traceback); the first thing
# each does is plain_install() in the process it runs in.


def deep_down(x: int) -> int:
    raise ValueError(f"bad input {x}")


def raises_value_error(x: int) -> int:
    plain_install()
    return deep_down(x) + 1


def looks_up(table: dict[str, int]) -> int:
    return table["missing"]


def raises_chained() -> int:
    plain_install()
    try:
        return looks_up({})
    except KeyError as exc:
        raise ValueError("could not look it up") from exc


def raises_by_value() -> None:
    """Raises an exception of a class made here, at run time: cloudpickle pickles it by
    value, so no import on the worker, and no reducer installed before, knows it."""
    plain_install()

    def local_class() -> type[Exception]:
        class TaskOwnError(Exception):
            pass

        return TaskOwnError

    def raise_it_here() -> None:
        raise local_class()("my own error")

    raise_it_here()


def raises_a_group() -> None:
    """Raises an exception group whose member has a cause: the group's traceback text
    says "The above exception was the direct cause" for that member's chain."""
    plain_install()
    members = []
    try:
        looks_up({})
    except KeyError as exc:
        try:
            raise ValueError("member with a cause") from exc
        except ValueError as member:
            members.append(member)
    raise ExceptionGroup("the group", members)  # (no cause, no context of its own)


class DoesNotLoad(Exception):
    """Pickles (as ``DoesNotLoad("7: seven")``) but does not load again."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


def raises_from_what_does_not_load() -> None:
    # (tblib's reducers left in place: ValueError's pickle takes its cause along)
    try:
        raise DoesNotLoad(7, "seven")
    except DoesNotLoad as exc:
        raise ValueError("its cause cannot travel") from exc


def raises_where_frames_do_not_pickle() -> None:
    """Raises from a frame whose globals' ``__name__`` is a lock: its traceback cannot
    be pickled, so the exception travels without frames."""
    scope: dict[str, Any] = {"__name__": threading.Lock()}
    exec("def strange_frame():\n    raise ValueError('no frames')\n", scope)
    scope["strange_frame"]()


# -- in one process, without dask


def test_pack_error_keeps_frames_and_chain_without_dask() -> None:
    """Nothing but Corral's remote module imported (no dask, whose import installs
    tblib's reducers): a by-value class raised from another, each with its frames, and
    an exception group's members with theirs, round trip."""
    script = textwrap.dedent(
        """
        import sys, traceback
        from runtime import unpickling
        from runtime.remote import pack_error, wire_error
        import cloudpickle

        def make():
            class Mine(Exception):
                pass
            return Mine

        def inner():
            raise make()("inner")

        def task_function():
            try:
                inner()
            except Exception as exc:
                raise ValueError("outer") from exc

        try:
            task_function()
        except ValueError as exc:
            raised = exc
        parts, _ = pack_error(raised, "a test")
        back = unpickling.loads(parts[0], parts[1:])
        again = cloudpickle.loads(cloudpickle.dumps(wire_error(back)))  # the second hop
        assert "dask" not in sys.modules, sorted(m for m in sys.modules if "dask" in m)
        for err in (back, again):
            assert type(err) is ValueError and str(err) == "outer", repr(err)
            assert "in task_function" in "".join(traceback.format_tb(err.__traceback__))
            cause = err.__cause__
            assert type(cause).__name__ == "Mine" and str(cause) == "inner", repr(cause)
            assert "in inner" in "".join(traceback.format_tb(cause.__traceback__))
            assert err.__suppress_context__

        def group_task():
            errors = []
            for func in (inner, task_function):
                try:
                    func()
                except Exception as exc:
                    errors.append(exc)
            raise ExceptionGroup("both", errors)

        try:
            group_task()
        except ExceptionGroup as exc:
            raised = exc
        parts, _ = pack_error(raised, "a test")
        back = unpickling.loads(parts[0], parts[1:])
        assert "in group_task" in "".join(traceback.format_tb(back.__traceback__))
        mine, outer = back.exceptions
        assert "in inner" in "".join(traceback.format_tb(mine.__traceback__))
        assert "in task_function" in "".join(traceback.format_tb(outer.__traceback__))
        assert "in inner" in "".join(traceback.format_tb(outer.__cause__.__traceback__))
        assert "dask" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PROMPT,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# -- across processes


def cluster(execution: str) -> Cluster:
    return Cluster(processes=1, threads_per_worker=1, memory_options={"execution": execution})


@pytest.mark.anyio
@EXECUTIONS
async def test_a_value_error_reaches_the_caller_with_its_frames(execution: str) -> None:
    with anyio.fail_after(LIMIT):
        async with cluster(execution) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            with anyio.fail_after(PROMPT), pytest.raises(ValueError, match="bad input 1"):
                await c.submit(raises_value_error, 1)
            with anyio.fail_after(PROMPT):
                err = await c.submit(raises_value_error, 2).exception()
            assert type(err) is ValueError
            assert "in raises_value_error" in frames(err)
            assert "in deep_down" in frames(err)
            with anyio.fail_after(PROMPT), pytest.raises(ValueError, match="bad input 3") as info:
                await c.compute({"x": (raises_value_error, 3)}, "x")
            assert "in deep_down" in frames(info.value)


@pytest.mark.anyio
@EXECUTIONS
async def test_an_exception_of_a_class_made_at_run_time_reaches_the_caller_with_its_frames(
    execution: str,
) -> None:
    with anyio.fail_after(LIMIT):
        async with cluster(execution) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            with anyio.fail_after(PROMPT):
                err = await c.submit(raises_by_value).exception()
            assert type(err).__name__ == "TaskOwnError" and str(err) == "my own error"
            assert "in raises_by_value" in frames(err)
            assert "in raise_it_here" in frames(err)


@pytest.mark.anyio
@EXECUTIONS
async def test_a_chained_exception_reaches_the_caller_with_its_cause_and_frames(
    execution: str,
) -> None:
    with anyio.fail_after(LIMIT):
        async with cluster(execution) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            with anyio.fail_after(PROMPT):
                err = await c.submit(raises_chained).exception()
            assert type(err) is ValueError and str(err) == "could not look it up"
            assert "in raises_chained" in frames(err)
            assert isinstance(err.__cause__, KeyError)
            assert "in looks_up" in frames(err.__cause__)
            assert err.__suppress_context__
            text = "".join(traceback.format_exception(err))
            assert "The above exception was the direct cause" in text


@pytest.mark.anyio
@EXECUTIONS
async def test_an_exception_group_arrives_with_its_members_chains_and_no_text_copy(
    execution: str,
) -> None:
    """The chain in a group's traceback text is its members' (which travel with them):
    the group does not get that text as a stand-in cause (``_RemoteTraceback``)."""
    with anyio.fail_after(LIMIT):
        async with cluster(execution) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            with anyio.fail_after(PROMPT):
                err = await c.submit(raises_a_group).exception()
            assert isinstance(err, ExceptionGroup) and str(err).startswith("the group")
            assert err.__cause__ is None and err.__context__ is None
            assert "in raises_a_group" in frames(err)
            (member,) = err.exceptions
            assert type(member) is ValueError and str(member) == "member with a cause"
            assert isinstance(member.__cause__, KeyError)
            assert "in looks_up" in frames(member.__cause__)


@pytest.mark.anyio
@EXECUTIONS
async def test_what_cannot_travel_is_left_out_and_the_exception_still_arrives(
    execution: str,
) -> None:
    with anyio.fail_after(LIMIT):
        async with cluster(execution) as c:
            await c.wait_for_workers(1, timeout=LIMIT)
            with anyio.fail_after(PROMPT):
                # A cause that does not load again: the exception comes with its frames,
                # without its cause (not as a substitute RuntimeError).
                err = await c.submit(raises_from_what_does_not_load).exception()
                assert type(err) is ValueError and str(err) == "its cause cannot travel"
                assert "in raises_from_what_does_not_load" in frames(err)
                if execution == "thread":
                    assert err.__cause__ is None
                else:  # the worker gives it the traceback text there as its cause
                    assert type(err.__cause__).__name__ == "_RemoteTraceback"
                    assert "DoesNotLoad: 7: seven" in str(err.__cause__)
                # Frames that cannot be pickled: the exception comes without them.
                err = await c.submit(raises_where_frames_do_not_pickle).exception()
                assert type(err) is ValueError and str(err) == "no frames"
                assert "strange_frame" not in frames(err)
                if execution == "process":  # the worker gives it the text as its cause
                    assert "in strange_frame" in str(err.__cause__)
                # And the worker still runs tasks.
                assert await c.submit(sum, [1, 2, 3]) == 6


# -- the last hop: manager -> a client of its own (another process, or the wire)


def raises_its_own_class_on_a_node() -> None:
    """Like :func:`raises_by_value`, without touching copyreg: it runs in this test's
    process (an in-process worker node), whose reducers other tests rely on."""

    class NodeOwnError(Exception):
        pass

    def raised_on_the_node() -> None:
        raise NodeOwnError("mine, from the node")

    raised_on_the_node()


@pytest.mark.anyio
async def test_a_client_connected_to_a_manager_gets_the_frames_of_its_own_class() -> None:
    """The manager tells a client over a connection (``KeyUpdates``) how its keys
    failed: that message was pickled plainly, so an exception of a class made at run
    time arrived without frames, though it had them up to the manager. Now its errors
    travel as a worker's do (``KeyUpdates.for_wire``)."""
    from tests.helpers import nodes

    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            fut = cluster.submit(raises_its_own_class_on_a_node, pure=False)
            with pytest.raises(Exception, match="mine, from the node") as info:
                await fut
            assert type(info.value).__name__ == "NodeOwnError"
            assert "in raised_on_the_node" in frames(info.value)
            cause = ValueError("root")
            dep = cluster.submit(raises_chained_here, cause, pure=False)
            with pytest.raises(ValueError, match="could not finish") as chained:
                await dep
            assert "in raises_chained_here" in frames(chained.value)
            assert chained.value.__cause__ is not None


def raises_chained_here(cause: BaseException) -> None:
    try:
        raise cause
    except ValueError as exc:
        raise ValueError("could not finish") from exc


def test_one_failure_spread_to_many_dependents_is_made_over_once_per_message() -> None:
    """A failure that spreads to 2,000 dependents: each dependent's KeyErred carries
    it as root_error and as its DependencyFailed's __cause__. for_wire used to pack it
    (format, frames, trial load) twice per dependent (2.4 s and 6.3 MB for 1,000, in
    a review; the manager's loop blocked past the peers' liveness limit). Now once:
    one wired object, pickled once, and after loading every dependent shares it, its
    DependencyFailed's cause set again on arrival."""
    import cloudpickle

    from actors.scheduler_events import KeyErred
    from runtime.errors import DependencyFailed
    from runtime.messages import KeyUpdates, rejoin_causes
    from runtime.remote import wire_error

    try:
        deep_down(3)
    except ValueError as exc:
        root = exc
    updates: list[Any] = [KeyErred("s", "load", root, "load", root)]
    for i in range(2000):
        err = DependencyFailed(f"parse-{i}", "load", f"ValueError: {root}")
        err.__cause__ = root
        updates.append(KeyErred("s", f"parse-{i}", err, "load", root))
    calls: list[BaseException] = []

    def counted(exc: BaseException) -> BaseException:
        calls.append(exc)
        return wire_error(exc)

    wire = KeyUpdates(tuple(updates)).for_wire(counted)
    assert calls == [root]  # once, for the whole message
    back = cloudpickle.loads(cloudpickle.dumps(wire))
    rejoin_causes(back.updates)
    own, *deps = back.updates
    assert own.error is own.root_error and type(own.error) is ValueError
    assert "in deep_down" in frames(own.error)
    assert all(d.root_error is own.root_error for d in deps)
    assert all(type(d.error) is DependencyFailed for d in deps)
    assert all(d.error.__cause__ is own.root_error for d in deps)
    assert deps[7].error.key == "parse-7"


def parse_after(value: int) -> int:
    return value + 1


@pytest.mark.anyio
async def test_a_connected_clients_dependent_fails_with_the_root_error_as_its_cause() -> None:
    from runtime.errors import DependencyFailed
    from tests.helpers import nodes

    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as cluster:
            root = cluster.submit(raises_its_own_class_on_a_node, pure=False)
            dep = cluster.submit(parse_after, root, pure=False)
            with pytest.raises(DependencyFailed) as info:
                await dep
            cause = info.value.__cause__
            assert type(cause).__name__ == "NodeOwnError"
            assert "in raised_on_the_node" in frames(cause)


def test_frames_survive_tblibs_reducers_installed_after_corral() -> None:
    """``tblib.pickling_support.install()`` called after Corral's import (dask's and
    distributed's imports call it; a user may) registers tblib's reducer for every
    exception class then defined, the one that carried a task's error between
    processes among them: pickle preferred it to that class's own ``__reduce__`` and
    loaded the error with its frames dropped (CI saw it after tests/test_dask.py). In
    a subprocess, so that this process's reducers stay as they are."""
    script = textwrap.dedent(
        """
        import traceback, cloudpickle
        from runtime.remote import wire_error
        from tblib import pickling_support

        def deep_down(x):
            raise ValueError(x)

        try:
            deep_down(3)
        except ValueError as exc:
            raised = exc
        pickling_support.install()  # after Corral's classes are defined
        back = cloudpickle.loads(cloudpickle.dumps(wire_error(raised)))
        assert type(back) is ValueError, type(back)
        assert "in deep_down" in "".join(traceback.format_tb(back.__traceback__))
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=PROMPT
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@EXECUTIONS
def test_a_scripts_function_keeps_its_file_and_line_in_the_traceback(
    execution: str, tmp_path: Path
) -> None:
    """A task whose function is defined in the user's script (``__main__``, pickled by
    value): cloudpickle wrote its code's file as ``<dynamic-code>``, so the traceback
    the caller got read ``File "<dynamic-code>", line 6, in parse``, no file, no source
    line. Now it names the script and, the file being readable here, shows the line."""
    script = tmp_path / "workflow.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import traceback, anyio
            from runtime import Cluster

            def parse(x):
                raise ValueError("cannot parse " + str(x))

            async def main():
                with anyio.fail_after({LIMIT}):
                    async with Cluster(
                        processes=1,
                        threads_per_worker=1,
                        memory_options={{"execution": {execution!r}}},
                    ) as c:
                        await c.wait_for_workers(1, timeout={LIMIT})
                        err = await c.submit(parse, 7).exception()
                print("".join(traceback.format_exception(err)))

            if __name__ == "__main__":
                anyio.run(main)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=LIMIT + PROMPT,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "ValueError: cannot parse 7" in text, text
    assert f'File "{script}", line 6, in parse' in text, text
    assert 'raise ValueError("cannot parse " + str(x))' in text, text
    assert "<dynamic-code>" not in text, text
