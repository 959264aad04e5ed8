"""A worker process that leaves without an error says why on stdout, as it says that
it joined, whatever the log level: drained, stopped by a signal, or told that its
manager stopped. Before, it exited 0 without a word at the default level (the reasons
were info records)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.node import leaving_words
from tests.helpers import Cli

LIMIT = 60


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path / "home") as c:  # token files of this test only
        yield c


def test_a_worker_says_why_it_leaves_at_the_default_log_level(cli: Cli) -> None:
    manager, address = cli.manager("--no-monitoring")
    drained = cli.worker(address, "--cores", "1", "--name", "drained")
    signalled = cli.worker(address, "--cores", "1", "--name", "signalled")
    told = cli.worker(address, "--cores", "1", "--name", "told")

    console = cli.start("console", address, "drain", "drained")
    assert console.wait(LIMIT) == 0
    assert drained.wait(LIMIT) == 0
    line = cli.line_with(drained, "worker drained left")
    assert (
        line.strip()
        == f"worker drained left {address}: {leaving_words('drained', manager_stopped=False)}"
    )

    signalled.send_signal(signal.SIGTERM)
    assert signalled.wait(LIMIT) == 0
    line = cli.line_with(signalled, "worker signalled left")
    assert line.strip().endswith(": stopped by a signal (SIGINT, SIGTERM or SIGHUP)"), line

    manager.send_signal(signal.SIGTERM)
    assert manager.wait(LIMIT) == 0
    assert told.wait(LIMIT) == 0
    line = cli.line_with(told, "worker told left")
    assert line.strip().endswith(
        ": its manager stopped on purpose (SIGINT, SIGTERM or SIGHUP of the manager)"
    ), line


@pytest.mark.parametrize(
    ("cause", "stopped", "words"),
    [
        ("drained", False, "drained by its manager"),
        ("walltime", False, "its walltime ends (--deadline)"),
        ("preempted", False, "stopped by a signal inside a Slurm job (preempted)"),
        ("shutdown", False, "stopped by a signal (SIGINT, SIGTERM or SIGHUP)"),
        ("shutdown", True, "its manager stopped on purpose"),
        ("preempted", True, "its manager stopped on purpose"),
    ],
)
def test_the_words_for_each_cause(cause: str, stopped: bool, words: str) -> None:
    assert leaving_words(cause, manager_stopped=stopped).startswith(words)
