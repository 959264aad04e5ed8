"""``RetryPolicyLoop`` across processes: a client of a manager process gets it with the
task's own error as its ``__cause__``, as in the manager (a task error travels with its
chain: ``runtime.remote.pack_error``), so the client sees why the task failed. Real
manager and worker processes, a retry policy (of a ``--policy-module``, named in
``--config``'s ``[policies]``) that always retries, a task that fails at once: the
default ceiling, 100 free retries, is reached in a few seconds."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from runtime import Cluster, RetryPolicyLoop
from tests.helpers import Cli

LIMIT = 120  # seconds: a manager, a worker, 101 fast tries

ALWAYS = """
import policies
from policies.base import RetryDecision

@policies.register("retry", "test-always")
class Always:
    def decide(self, task, outcome, cause):
        return RetryDecision(True, reason="again")
"""


def fails() -> None:
    raise ValueError("disk /scratch is read-only")


@pytest.mark.anyio
async def test_a_client_of_a_manager_is_told_the_error_behind_a_retry_loop(
    tmp_path: Path,
) -> None:
    module = tmp_path / "always.py"
    module.write_text(ALWAYS)
    config = tmp_path / "corral.toml"
    config.write_text('[policies]\nretry = "test-always"\n')
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager(
            "--no-monitoring", "--policy-module", str(module), "--config", str(config)
        )
        cli.worker(address, "--cores", "1")
        async with Cluster(address) as cluster:
            (future,) = await cluster.submit_graph({"f": (fails,)}, ["f"])
            with pytest.raises(RetryPolicyLoop) as caught:
                await future.result()
    err = caught.value
    assert (err.policy, err.free, err.tries) == ("test-always", 100, 101), err.fields
    assert "the task's own error is this one's __cause__" in str(err), str(err)
    cause = err.__cause__
    assert isinstance(cause, ValueError) and str(cause) == "disk /scratch is read-only", cause
