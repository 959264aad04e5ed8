"""docs/console.md's ``tasks`` and ``resume --json`` samples are what the console prints
(a user audit found the ``client`` column and field missing from the first, and the
second on one line where the console indents it): the table is rendered again by the
console's own ``render_tasks`` from the rows it shows, at its width; the JSON is the
console's own ``Result.json`` of what it holds, with the fields a ``TaskRecord`` has."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from runtime.console import Result, jsonable, render_tasks
from runtime.messages import TaskRecord

DOC = Path(__file__).resolve().parent.parent / "docs" / "console.md"


def sample(prompt: str) -> str:
    """What follows ``corral> PROMPT`` in console.md, up to the next prompt or fence."""
    text = DOC.read_text()
    start = text.index(f"corral> {prompt}\n") + len(f"corral> {prompt}\n")
    ends = (text.find(end, start) for end in ("\ncorral> ", "\n```"))
    return text[start : min(e for e in ends if e >= 0) + 1]


def test_the_tasks_table_sample_is_what_the_console_prints() -> None:
    table = sample("tasks --limit 3").rstrip("\n")
    lines = table.splitlines()
    header = [c.strip() for c in lines[1].strip("┃").split("┃")]
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if "│" in line]
    records = [dict(zip(header, row, strict=True)) for row in rows]
    for r in records:
        r["tries"] = int(r["tries"])
    out = io.StringIO()
    width = len(lines[0])
    Console(file=out, width=width, color_system=None).print(render_tasks(records, limit=3))
    assert out.getvalue() == table + "\n"


def test_the_erred_tasks_sample_is_what_the_console_prints() -> None:
    """The ``error`` column (audit failures F4: the console could not say why a task
    failed), each error cut to the width as the console cuts it."""
    table = sample("tasks --state erred").rstrip("\n")
    lines = table.splitlines()
    header = [c.strip() for c in lines[1].strip("┃").split("┃")]
    assert header[-1] == "error"
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if "│" in line]
    records = [dict(zip(header, row, strict=True)) for row in rows]
    for r in records:
        r["tries"] = int(r["tries"])
    records[0]["error"] = "ValueError: bad row: negative energy in run 42"
    records[1]["error"] = (
        "DependencyFailed: task 'coadd-42' was not run: dependency 'calibrate-42' failed "
        "(ValueError: bad row: negative energy in run 42"
    )
    out = io.StringIO()
    Console(file=out, width=len(lines[0]), color_system=None).print(render_tasks(records))
    assert out.getvalue() == table + "\n"


def test_the_json_samples_are_what_the_console_prints() -> None:
    erred = sample("tasks --state erred --json")
    records = json.loads(erred)
    fields = set(jsonable(TaskRecord("k", "memory", "c")))  # as the console sends it
    assert all(set(r) == fields for r in records), (records, fields)
    assert Result("tasks", records, None, as_json=True).json() == erred
    resumed = sample("resume ckpt --json")
    assert Result("resume", json.loads(resumed), None, as_json=True).json() == resumed
