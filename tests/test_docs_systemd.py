"""The systemd units of docs/deployment.md ("As systemd services") hold what the page
around them says (a user audit found the worker unit given the admin token, without
process execution or a fixed id, and the manager unit restarting for ever a manager
that cannot start): their ``ExecStart`` lines are command lines Corral's own parser
takes, and their settings are checked against the page's reasoning."""

from __future__ import annotations

import configparser
import shlex

import pytest

from runtime.__main__ import build_parser
from runtime.node import RECONNECT_TIMEOUT
from tests.helpers import ROOT

SECTION = "### As systemd services"


def units() -> dict[str, configparser.ConfigParser]:
    """The ```ini blocks of the section, by the unit file their first line names."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for block in section.split("```ini\n")[1:]:
        body = block.split("\n```", 1)[0]
        name = body.splitlines()[0].removeprefix("# ").rsplit("/", 1)[-1]
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
        unit.read_string(body.replace("\\\n", " "))  # systemd's continuation lines
        found[name] = unit
    return found


def exec_args(unit: configparser.ConfigParser) -> list[str]:
    """The unit's ``ExecStart`` after ``python -m runtime``, with systemd's ``%H``."""
    argv = shlex.split(unit["Service"]["ExecStart"].replace("%H", "node17"))
    assert argv[1:3] == ["-m", "runtime"], argv
    return argv[3:]


def seconds(value: str) -> float:
    return float(value.removesuffix("s"))


@pytest.fixture(scope="module")
def found() -> dict[str, configparser.ConfigParser]:
    got = units()
    assert set(got) == {"corral-manager.service", "corral-worker.service"}
    return got


def test_the_worker_unit_takes_the_worker_token_runs_tasks_in_processes_and_keeps_its_id(
    found: dict[str, configparser.ConfigParser],
) -> None:
    unit = found["corral-worker.service"]
    args = build_parser().parse_args(exec_args(unit))
    assert args.command == "worker"
    assert args.token_file == "/etc/corral/worker.token" and args.token is None
    assert args.execution == "process"  # a manager a group shares: a crash is one task's
    assert args.name == "node17"  # the same id at each start: a restart takes it over
    assert args.connect_retry > 0
    # restarted within the manager's grace for the lost worker's id, to take it over
    assert seconds(unit["Service"]["RestartSec"]) < RECONNECT_TIMEOUT
    assert unit["Service"]["Restart"] == "on-failure"
    assert unit["Service"]["RestartPreventExitStatus"] == "2"


def test_the_manager_unit_stops_restarting_a_manager_that_cannot_start(
    found: dict[str, configparser.ConfigParser],
) -> None:
    unit = found["corral-manager.service"]
    args = build_parser().parse_args(exec_args(unit))
    assert args.command == "manager" and args.keep_tokens
    # exit 1 at once, restarted every RestartSec: the burst is reached within the interval
    burst = int(unit["Unit"]["StartLimitBurst"])
    interval = seconds(unit["Unit"]["StartLimitIntervalSec"])
    restart = seconds(unit["Service"]["RestartSec"])
    assert unit["Service"]["Restart"] == "on-failure"
    assert burst * (restart + 2) < interval  # (2 s: a start that fails)
