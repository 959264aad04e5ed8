"""The console says why a task failed: its ``story`` (the ``retry`` rows and an ``erred``
row carry what was raised, ``Type: first line``) and ``tasks`` (an ``error`` column, and
``TaskRecord.error``).

A user audit (why do my tasks fail?) found ``story KEY`` showing ``retry | error; retry
budget left`` and ``processing -> erred`` with no error type or message, and ``tasks
--state erred`` with no error column: from an ssh session without a browser, nothing
said why. A manager and a worker in this process, over the codec (``tests.helpers.nodes``:
no socket); every wait is bounded.
"""

from __future__ import annotations

import anyio
import pytest

from actors.scheduler_records import MAX_ERROR_LINE, error_line
from runtime import Cluster
from runtime.console import ConsoleClient
from runtime.errors import DependencyFailed

LIMIT = 30
WHY = "ValueError: bad row: negative energy in run 42"


def calibrate(run: int) -> None:
    raise ValueError(f"bad row: negative energy in run {run}\nrow 17: E = -3.2 GeV")


def coadd(x: object) -> str:
    return str(x)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_errors_line_is_its_type_and_the_first_line_of_its_text_bounded() -> None:
    assert error_line(ValueError("bad row\nmore\nand more")) == "ValueError: bad row"
    assert error_line(KeyError("col")) == "KeyError: 'col'"
    assert error_line(ValueError()) == "ValueError"
    assert error_line(ValueError("\n  leading blank lines\nnext")) == (
        "ValueError: leading blank lines"
    )
    long = error_line(OSError("x" * 1000))
    assert len(long) == MAX_ERROR_LINE and long.startswith("OSError: xxx") and long[-3:] == "..."
    assert error_line(Unprintable()) == "Unprintable: (its text could not be read)"


async def says_why(cluster: Cluster, console: ConsoleClient) -> None:
    bad = cluster.submit(calibrate, 42, key="calibrate-42", retries=1)
    after = cluster.submit(coadd, bad, key="coadd-42")
    fine = cluster.submit(coadd, 1, key="fine-1")
    with pytest.raises(ValueError):
        await bad
    with pytest.raises(DependencyFailed):
        await after
    assert await fine == "1"

    story = await console.story("calibrate-42")
    said = [(row[1], row[2]) for row in story if row[1] in ("retry", "erred")]
    assert said == [("retry", f"error; retry budget left ({WHY})"), ("erred", WHY)]
    text = await console.run_command("story calibrate-42")
    assert WHY in text

    records = {r.key: r for r in await console.tasks()}
    assert records["calibrate-42"].error == WHY
    assert records["coadd-42"].error == (  # (the root's text cut at its line end)
        f"DependencyFailed: task 'coadd-42' was not run: dependency 'calibrate-42' failed ({WHY}"
    )
    assert records["fine-1"].error == ""
    table = await console.run_command("tasks --state erred")
    header = next(line for line in table.splitlines() if "key" in line)
    assert header.split("┃")[-2].strip() == "error"
    assert "ValueError: bad row" in table and "DependencyFailed" in table
    # no error column when none of the tasks listed failed
    assert "error" not in await console.run_command("tasks --state memory")


@pytest.mark.anyio
async def test_story_and_tasks_say_why_a_task_failed() -> None:
    from tests.helpers import nodes

    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as c, ConsoleClient(address) as con:
            await says_why(c, con)
