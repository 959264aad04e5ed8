"""The ``submit`` role (docs/security.md#roles): a third token, for the people who share
a manager (a research group's students), between the operator's ``admin`` and the
console's ``read``. A client holding it submits, gathers, cancels and releases its own
keys, waits for workers and looks; the operator's commands (the console's cancel of a
run, drain, policies, scaling, alert rules) and a worker's Hello are refused with a
:class:`PermissionDenied` that says who may and whom to ask. Before, the only token a
client could connect with was the admin token: every student could cancel another's
run and drain the shared workers (audits/multiuser.md, defect 1).

A real manager and worker on 127.0.0.1 (ports 41000-41999); every wait is bounded."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import CancelledError
from runtime.messages import (
    CancelRequest,
    DrainRequest,
    ProgressQuery,
    ReleaseKeysRequest,
    SubmitGraphRequest,
)
from runtime.node import ALLOWED, PermissionDenied, Tokens, _Door
from tests.helpers import Cli, free_port_between

LIMIT = 60
run = anyio.to_thread.run_sync


def _port() -> int:
    """A port of 127.0.0.1 in 41000-41999 free just now."""
    return free_port_between(41_000, 41_999)


def inc(x: int) -> int:
    return x + 1


def held(gate: str) -> int:
    """Runs until the file ``gate`` exists (at most 30 s): a task to cancel while it runs."""
    deadline = time.monotonic() + 30
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    return 0


class Site:
    def __init__(self, cli: Cli, address: str, worker: str, port: int) -> None:
        self.cli = cli
        self.address = address
        self.worker = worker
        self.port = port
        self.tokens = cli.tokens(address)


@pytest.fixture(scope="module")
def site(tmp_path_factory: Any) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("submitrole")
    port = _port()
    with Cli(tmp / "home") as cli:
        cli.env.pop("CORRAL_TOKEN", None)
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", "--keep-tokens"
        )
        line = cli.line_with(manager, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        wport = _port()  # the manager's port is taken now
        worker = cli.start(
            "worker", address, "--host", "127.0.0.1", "--port", str(wport), "--cores", "2"
        )
        cli.line_with(worker, f"joined {address}")
        yield Site(cli, address, f"ws://127.0.0.1:{wport}", port)


# ----------------------------------------------------------------------------- the table


def test_the_submit_role_is_a_client_s_own_work_and_the_reads() -> None:
    """The table: every read, and a client's own work; none of the operator's commands;
    a submit, release or cancel is for the connection's own client only."""

    class _Gateway:
        refused_messages = 0
        progress_runs: dict[str, str] = {}

    submit = ALLOWED["submit"]
    assert ALLOWED["read"] < submit < ALLOWED["admin"]
    operator = {t.__name__ for t in ALLOWED["admin"] - submit}
    assert operator == {
        "AlertRuleAdd", "AlertRuleRemove", "CancelKeysRequest", "DrainRequest",
        "ForgetCategoryRequest", "MoveRequest", "ResumeRequest", "ScaleRequest",
        "SetPolicyRequest", "UndrainRequest",
    }  # fmt: skip
    door = _Door(_Gateway(), None, "submit", "alice")  # type: ignore[arg-type]
    door.check(CancelRequest(("k",), "mine", "alice"))
    door.check(ReleaseKeysRequest(("k",), "alice"))
    door.check(SubmitGraphRequest({}, (), "alice"))
    for msg in (
        CancelRequest(("k",), "yours", "bob"),
        CancelRequest(("k",), "no client: for everyone"),
        ReleaseKeysRequest(("k",), "bob"),
        SubmitGraphRequest({}, (), "bob"),
    ):
        with pytest.raises(PermissionDenied, match="acts for its own client \\('alice'\\) only"):
            door.check(msg)
    with pytest.raises(PermissionDenied) as info:
        door.check(DrainRequest("ws://127.0.0.1:1"))
    assert str(info.value).startswith(
        "DrainRequest needs the admin token (the operator's); this connection has the submit token"
    ), info.value
    assert "Ask the cluster's operator" in str(info.value)


def test_a_read_token_console_may_not_ask_a_compute_s_progress() -> None:
    """ProgressQuery hands over the keys that ended since the last ask (each once) and
    ``stop`` lets the run's counts go: a read-token console asking it of ``run-N`` took
    them from the compute's client (its ProgressBar never saw those tasks end). The
    gateway refuses it from the read role; a client (submit, admin) asks it."""

    class _Gateway:
        refused_messages = 0
        progress_runs = {"run-1": "alice"}  # (alice's connection submitted run-1)

    for role in ("submit", "admin"):
        _Door(_Gateway(), None, role, "alice").check(ProgressQuery("run-1"))  # type: ignore[arg-type]
    _Door(_Gateway(), None, "admin", "operator").check(ProgressQuery("run-1"))  # type: ignore[arg-type]
    bob = _Door(_Gateway(), None, "submit", "bob")  # type: ignore[arg-type]
    for msg in (ProgressQuery("run-1"), ProgressQuery("run-2", stop=True)):
        with pytest.raises(PermissionDenied, match="asks the progress of its own client's"):
            bob.check(msg)
    door = _Door(_Gateway(), None, "read", "console")  # type: ignore[arg-type]
    for msg in (ProgressQuery("run-1"), ProgressQuery("run-1", stop=True)):
        with pytest.raises(PermissionDenied, match="ProgressQuery"):
            door.check(msg)


def test_the_token_file_carries_the_submit_token_and_keep_tokens_keeps_it(
    tmp_path: Path,
) -> None:
    import json

    tokens = Tokens.generate()
    path = tmp_path / "t.json"
    tokens.write(path)
    assert set(json.loads(path.read_text())) == {"admin", "read", "submit", "worker"}
    assert len({tokens.admin, tokens.read, tokens.submit}) == 3
    assert Tokens.kept(path) == tokens
    # A file from before the role: its admin and read tokens kept, a new submit token.
    path.write_text(json.dumps({"admin": tokens.admin, "read": tokens.read}))
    kept = Tokens.kept(path)
    assert kept is not None
    assert (kept.admin, kept.read) == (tokens.admin, tokens.read)
    assert len(kept.submit) == 64 and kept.submit not in (tokens.admin, tokens.read)


# ----------------------------------------------------------------------------- processes


@pytest.mark.anyio
async def test_a_submit_token_client_runs_its_graph_and_cancels_its_own_future(
    site: Site, tmp_path: Path
) -> None:
    gate = str(tmp_path / "gate")
    with anyio.fail_after(LIMIT):
        async with Cluster(site.address, token=site.tokens["submit"]) as cluster:
            await cluster.wait_for_workers(1)
            futures = [cluster.submit(inc, i) for i in range(4)]
            assert await cluster.gather([cluster.submit(sum, futures)]) == [10]
            assert site.worker in str(await cluster.status())
            waiting = cluster.submit(held, gate)
            await cluster.cancel(waiting)
            with pytest.raises(CancelledError):
                await waiting
            await anyio.Path(gate).touch()
            # The operator's commands: a typed refusal at once, saying whom to ask.
            with pytest.raises(PermissionDenied) as info:
                await cluster.set_policy("priority", "graph")
            text = str(info.value)
            assert "SetPolicyRequest needs the admin token (the operator's)" in text, text
            assert "this connection has the submit token" in text, text
            with pytest.raises(PermissionDenied, match="ScaleRequest needs the admin token"):
                await cluster.scale(0)
            with pytest.raises(PermissionDenied, match="MoveRequest needs the admin token"):
                await cluster.move(cluster.submit(inc, 5), priority=1)
            assert await cluster.submit(inc, 41) == 42  # still connected, still served


@pytest.mark.anyio
async def test_a_console_with_the_submit_token_looks_but_cannot_drain_or_cancel_a_run(
    site: Site,
) -> None:
    from runtime.console import ConsoleClient

    with anyio.fail_after(LIMIT):
        # Another person's run, with the admin token: the submit console cannot touch it.
        async with Cluster(site.address, token=site.tokens["admin"]) as other:
            assert await other.submit(inc, 1) == 2
            async with ConsoleClient(site.address, token=site.tokens["submit"]) as console:
                runs = list((await console.status())["recent_runs"])
                assert runs and site.worker in await console.run_command("status")
                with pytest.raises(PermissionDenied) as info:
                    await console.drain(site.worker)
                assert "DrainRequest needs the admin token (the operator's)" in str(info.value)
                with pytest.raises(PermissionDenied, match="CancelKeysRequest needs the admin"):
                    await console.cancel(run=runs[-1])
                with pytest.raises(PermissionDenied, match="this connection has the submit"):
                    await console.run_command(f"cancel {runs[-1]}")
            # The worker was not drained: the other client's work still runs.
            assert await other.submit(inc, 2) == 3


@pytest.mark.anyio
async def test_a_worker_with_the_submit_token_exits_1_saying_why(site: Site) -> None:
    with anyio.fail_after(LIMIT):
        worker = site.cli.start(
            "worker", site.address, "--host", "127.0.0.1", "--port", str(_port()),
            "--token", site.tokens["submit"],
        )  # fmt: skip
        assert await run(worker.wait, LIMIT) == 1
        out = "".join(await run(site.cli.rest, worker, LIMIT))
        assert (
            "this token is the submit token; workers need the worker token (the 'worker' entry"
            in out
        ), out


@pytest.mark.anyio
async def test_a_submit_token_client_may_not_ask_or_stop_another_client_s_progress(
    site: Site, tmp_path: Path
) -> None:
    """A compute under dask's callbacks is counted as a run (``run-N``, numbered in
    turn, listed by status); its client asks ``ProgressQuery`` of it. Another client
    with the submit token asking it took the keys that ended since the last ask (each is
    handed over once) or, with ``stop``, let the counts go: the compute's ProgressBar
    never saw those tasks end. Only the client that submitted the run may ask it (the
    admin token may ask any); the run's own client still sees every task end."""
    import dask
    from dask.callbacks import Callback

    ended: list[Any] = []

    class Ended(Callback):  # type: ignore[misc]
        def _posttask(self, key: Any, *_: Any) -> None:
            ended.append(key)

    gate = tmp_path / "gate"
    parts = [dask.delayed(held)(str(gate), dask_key_name=f"part-{i}") for i in range(2)]
    with anyio.fail_after(LIMIT):
        async with (
            Cluster(site.address, token=site.tokens["submit"]) as alice,
            Cluster(site.address, token=site.tokens["submit"]) as bob,
        ):
            await alice.wait_for_workers(1)
            before = set((await bob.status())["recent_runs"])
            async with anyio.create_task_group() as tg:

                async def compute() -> None:
                    with Ended():
                        assert await alice.compute(*parts) == (0, 0)

                tg.start_soon(compute)
                runs: list[str] = []
                while not runs:  # alice's run shows in status once it is submitted
                    runs = [r for r in (await bob.status())["recent_runs"] if r not in before]
                    await anyio.sleep(0.02)
                (run,) = runs
                for msg in (ProgressQuery(run), ProgressQuery(run, stop=True)):
                    with pytest.raises(PermissionDenied, match="ProgressQuery of run"):
                        await bob._manager.ask(msg)
                await anyio.Path(gate).touch()
            assert sorted(ended) == ["part-0", "part-1"]  # alice's bar saw both end
            async with Cluster(site.address, token=site.tokens["admin"]) as operator:
                assert await operator._manager.ask(ProgressQuery(run)) is None  # let go
