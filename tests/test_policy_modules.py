"""A policy of one's own with a manager process: ``python -m runtime manager
--policy-module MODULE`` imports the module that registers it before the manager
starts, a client can then set it and it decides; a module that does not import stops
the manager before it listens; a name the manager does not know, asked for over a
connection, says the policy must be registered in the manager's process."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import policies
from runtime import Cluster, UnknownPolicyError
from tests.helpers import Cli, held_at_gate, wait_until
from tests.test_manager_cli import assert_nothing_left, manager

LIMIT = 120  # seconds per test: a manager, a worker, a few tasks

#: A module of the user's, registering a priority policy that runs the lowest user
#: priority first: the opposite of every built-in one.
LOWEST_FIRST = """
import policies

@policies.register("priority", "test-lowest-first")
class LowestFirst:
    def priority(self, task, stats):
        return (task.user_priority, task.generation, task.order)
"""


class ClientOnly:
    """A priority policy registered in this process (the client's) only."""

    def priority(self, task: Any, stats: Any) -> tuple[float, ...]:
        return (task.order,)


def ran_at(priority: int) -> tuple[int, int]:
    """A task body: its priority and when it ran (one worker process: one clock)."""
    return priority, time.monotonic_ns()


@pytest.mark.anyio
async def test_a_policy_module_lets_a_client_set_a_policy_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "mypolicies").mkdir()
    (tmp_path / "mypolicies" / "lowest.py").write_text(LOWEST_FIRST)
    (tmp_path / "mypolicies" / "__init__.py").write_text("")
    gate, started = tmp_path / "gate", tmp_path / "started"
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        path = cli.env["PYTHONPATH"]
        cli.env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), path])
        _, address = cli.manager("--no-monitoring", "--policy-module", "mypolicies.lowest")
        cli.env["PYTHONPATH"] = path  # a worker runs tasks, not policies: it needs none
        cli.worker(address, "--cores", "1")
        try:
            async with Cluster(address) as cluster:
                info = await cluster.set_policy("priority", "test-lowest-first")
                assert info.name == "test-lowest-first"
                assert (await cluster.status())["policies"]["priority"] == "test-lowest-first"
                # The worker's one thread runs the gate, and holds the plug (its second
                # slot) behind it: what comes next waits in the scheduler, in the order
                # of the priority policy.
                first = await cluster.submit_graph(
                    {"gate": (held_at_gate, str(gate), str(started)),
                     "plug": (held_at_gate, str(gate), str(tmp_path / "plug"))},
                    ["gate", "plug"],
                )  # fmt: skip
                await wait_until(started.exists, "the gate task to start", limit=30)
                futures = []
                for priority in (2, 3, 1):
                    futures += await cluster.submit_graph(
                        {f"p{priority}": (ran_at, priority)}, [f"p{priority}"],
                        priority=priority,
                    )  # fmt: skip
                gate.touch()
                ran = await cluster.gather([*first, *futures])
        finally:
            gate.touch()
    order = [priority for priority, _ in sorted(ran[2:], key=lambda r: r[1])]
    assert order == [1, 2, 3], order  # under the built-in policies: 3, 2, 1


@pytest.mark.anyio
async def test_a_policy_only_the_client_registered_says_to_register_it_in_the_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # registered in this process for this test only (the registry is the process's:
    # later tests list the built-in names)
    monkeypatch.setitem(policies.REGISTRY._factories["priority"], "test-client-only", ClientOnly)
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager("--no-monitoring")
        async with Cluster(address) as cluster:
            with pytest.raises(UnknownPolicyError) as caught:
                await cluster.set_policy("priority", "test-client-only")
            with pytest.raises(UnknownPolicyError, match="no kind of policy named 'nope'"):
                await cluster.set_policy("nope", "graph")
    text = str(caught.value)
    assert text.startswith(
        "no priority policy named 'test-client-only' in the manager process. Available: "
        "consumers-first, fair, graph, long-first. "
    ), text
    assert "must be registered in the manager's process, not in the client's" in text
    assert "python -m runtime manager --policy-module MODULE" in text
    assert "Register it with policies.register()" not in text


def test_a_policy_module_that_does_not_import_stops_the_manager(tmp_path: Path) -> None:
    home = tmp_path / "home"
    err = assert_nothing_left(manager(home, "--policy-module", "no_such_policies_here"), home)
    assert err.startswith(
        "error: ImportError: --policy-module 'no_such_policies_here' could not be imported: "
        "ModuleNotFoundError: No module named 'no_such_policies_here'. A module name is "
        "looked up on the manager's sys.path"
    ), err
    broken = tmp_path / "broken.py"
    broken.write_text("import policies\n\nraise RuntimeError('no GPU\\nhere')\n")
    err = assert_nothing_left(manager(home, "--policy-module", str(broken)), home)
    assert err == (
        f"error: ImportError: --policy-module {str(broken)!r} could not be imported: "
        "RuntimeError: no GPU here"
    ), err


@pytest.mark.anyio
async def test_a_managers_config_file_sets_the_policies_it_starts_with(tmp_path: Path) -> None:
    """``[policies]`` in ``--config``: a policy of a ``--policy-module`` named there is
    in force from the start; a bad one stops the manager before it listens."""
    module = tmp_path / "lowest.py"
    module.write_text(LOWEST_FIRST)
    config = tmp_path / "corral.toml"
    config.write_text(
        '[policies]\npriority = "test-lowest-first"\n\n[policies.retry]\nname = "default"\n'
        "max_lost = 2\n"
    )
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager(
            "--no-monitoring", "--policy-module", str(module), "--config", str(config)
        )
        async with Cluster(address) as cluster:
            status = await cluster.status()
            assert status["policies"]["priority"] == "test-lowest-first"
            assert status["policy_params"]["retry"] == {"max_lost": 2}
    config.write_text('[policies.retry]\nname = "default"\nmax_lots = 2\n')
    home = tmp_path / "home2"
    err = assert_nothing_left(manager(home, "--config", str(config)), home)
    assert err.startswith(
        f"error: PolicyConfigError: [policies] in {config}: key 'retry' is refused: bad "
        "parameters for "
        "retry policy 'default': no parameter 'max_lots'; did you mean 'max_lost'?"
    ), err
