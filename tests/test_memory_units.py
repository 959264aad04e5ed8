"""``resources={"memory": ...}`` is bytes. A Parsl user's ``parsl_resource_specification``
gives memory in MB, so ``resources={"memory": 2000}`` (meant as 2000 MB) asked for 2000
bytes and was taken silently (a user audit). A memory resource above 0 and below 1 MiB is
still taken as asked (tests and toy runs may ask for little), but the client is told, at
WARNING, once per amount in a submission: the task, the amount, that memory is in bytes
and what was likely meant (``runtime.graph.small_memory_notes``, through the submission's
notes)."""

from __future__ import annotations

import logging
import operator
from typing import Any

import anyio
import pytest
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from runtime import Cluster
from runtime.graph import SMALL_MEMORY, build_specs
from tests.helpers import LogLines, log_lines, wait_until


def notes_of(graph: Any, keys: list[Any], resources: Any = None) -> list[str]:
    """What ``build_specs`` tells the client of ``graph``."""
    notes: list[str] = []
    build_specs(graph, keys, resources=resources, notes=notes)
    return notes


def test_a_memory_resource_below_one_mib_is_said_to_be_bytes() -> None:
    graph = {f"fit-{i}": (operator.neg, i) for i in range(4)}
    (note,) = notes_of(graph, list(graph), resources={"memory": 2000})
    named = note.split("'")[1]  # one of them, the others counted
    assert named in graph
    assert note == (
        f"task '{named}' (and 3 other tasks of this submission) asks for "
        "resources={'memory': 2000}, which is 2000 bytes: memory is in bytes: did you "
        "mean 2000 MiB = 2000 * 2**20? (Parsl's memory is in MB.) The task runs as asked; "
        "to ask for 2000 MiB, give resources={'memory': 2000 * 2**20}"
    )
    (one,) = notes_of({"a": 1}, ["a"], resources={"memory": 512, "cores": 1})
    assert one.startswith("task 'a' asks for resources={'memory': 512}, which is 512 bytes")


def test_each_small_amount_is_said_once_and_bytes_or_none_say_nothing() -> None:
    """Layer annotations too: one sentence per small amount, none for the others."""
    layers = {
        "small": MaterializedLayer(
            {"s0": (operator.neg, 1), "s1": (operator.neg, 2)},
            annotations={"resources": {"memory": 4096}},
        ),
        "big": MaterializedLayer(
            {"b": (operator.add, "s0", "s1")}, annotations={"resources": {"memory": 2**32}}
        ),
    }
    graph = HighLevelGraph(layers, {"small": set(), "big": {"small"}})
    (note,) = notes_of(graph, ["b"], resources={"memory": 3 * 2**20})
    assert note.split("'")[1] in ("s0", "s1")
    assert note.split("'", 2)[2].startswith(
        " (and 1 other task of this submission) asks for resources={'memory': "
        "4096}, which is 4096 bytes: memory is in bytes: did you mean 4096 MiB"
    )
    for fine in ({"memory": SMALL_MEMORY}, {"memory": 0}, {"cores": 2}, None):
        assert notes_of({"a": 1}, ["a"], resources=fine) == []


@pytest.mark.anyio
async def test_the_client_is_told_at_warning_and_the_task_runs() -> None:
    """``submit`` with ``resources={"memory": 2000}``: the client's log says so once for
    a whole ``map``, as its batch goes out; the tasks run as asked."""
    with anyio.fail_after(30), log_lines("corral.client", logging.WARNING) as log:
        async with Cluster(workers=1) as cluster:
            futures = cluster.map(operator.neg, range(3), resources={"memory": 2000})
            assert await cluster.gather(futures) == [0, -1, -2]
            assert await cluster.submit(operator.neg, 5, resources={"memory": 2**20}) == -5
            await wait_until(lambda: said(log), "the client's warning", limit=10)
            (line,) = said(log)
    assert "(and 2 other tasks of this submission) asks for resources={'memory': 2000}" in line
    assert "memory is in bytes: did you mean 2000 MiB = 2000 * 2**20?" in line


def said(log: LogLines) -> list[str]:
    return [ln for ln in log.lines if "memory is in bytes" in ln]
