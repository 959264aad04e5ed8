"""A worker fetching an input records the size its holder recorded, sent in the
``DataReply`` (``nbytes``), and does not size the value again: ``dask.sizeof`` of a
pandas frame builds a Series per column, and every fetched input used to pay it on
receipt although the holder's store knew the size (benchmarks/README.md, the py-spy
section of ``dataframe.py``).

Worker actors in this process, gated on their messages; every wait is bounded.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from dask.sizeof import sizeof

from runtime.graph import TaskRef
from runtime.messages import DataReply, GetData, RunTasks
from tests.test_unpicklable_results import UNIT, task, workers

pytestmark = pytest.mark.anyio

SIZE = 123_456


class Sized:
    """A value that counts how often ``dask.sizeof`` measures it."""

    measured = 0


@sizeof.register(Sized)
def _sizeof_sized(value: Sized) -> int:
    Sized.measured += 1
    return SIZE


def make() -> Sized:
    return Sized()


def use(value: Sized) -> int:
    return 1


async def test_a_fetched_input_keeps_its_holders_size_and_is_not_sized_again(
    tmp_path: Path,
) -> None:
    Sized.measured = 0
    with anyio.fail_after(UNIT):
        async with workers(tmp_path) as (made, refs, sched):
            refs["w1"].post(RunTasks((task("make-0", make),)))
            assert (await sched.result("make-0")).nbytes == SIZE
            assert Sized.measured == 1  # the output, measured by the task's worker
            reply: DataReply = await refs["w1"].ask(GetData(("make-0", "gone-0")))
            assert list(reply.data) == ["make-0"] and reply.nbytes == (SIZE,)
            assert reply.missing == ("gone-0",)

            refs["w2"].post(RunTasks((task("use-0", use, TaskRef("make-0"), holder="w1"),)))
            assert (await sched.result("use-0")).outcome == "ok"
            assert made["w2"].data.nbytes("make-0") == SIZE
            assert Sized.measured == 1  # not measured again where it was fetched
