"""A worker that rejoins its manager after failed tries says so: ``rejoined the manager
after N failed tries (X s)``, at warning. Before, a worker that got error-level refusals
while rejoining (a 403 after a manager restart, then the right token) never said it got
back in: the last word of its log was ``the manager refused our token; retrying``
while it was working (a user audit). And each refused try's line says the likely cause
and what mends it (``hint``: the manager restarted without ``--keep-tokens``; copy its
new worker token into the token file, read again at each try), which it did not (a
multimachine audit).

A real manager process, restarted on a port of this file's range with new tokens, and
a worker (``run_worker``, in this process, where its log is read as it comes) whose
token file is written again meanwhile.
"""

from __future__ import annotations

import json
import logging
import re
from functools import partial
from pathlib import Path

import anyio
import pytest

from runtime.node import _back_after_tries, run_worker, stale_token_hint, token_path
from tests.helpers import Cli, free_port_between, log_lines, wait_until

#: the ports of 127.0.0.1 this file's managers and workers listen on
PORTS = (53150, 53299)
LIMIT = 30
run = anyio.to_thread.run_sync
CAUSE = (
    "the manager probably restarted without --keep-tokens and made new tokens "
    "(docs/security.md#keeping-tokens-across-restarts)"
)
BACK = re.compile(r"event='rejoined the manager after (\d+) failed tries \((\d+\.\d) s\)'")


def _worker_token(path: Path, tokens: Path) -> None:
    """Write the worker token of the manager's token file ``tokens`` into ``path``, a
    file of one token (mode 0600), as an operator copies it."""
    path.write_text(json.loads(tokens.read_text())["worker"])
    path.chmod(0o600)


@pytest.mark.anyio
async def test_a_worker_refused_while_rejoining_says_once_it_is_back_in(tmp_path: Path) -> None:
    tokens, mine = tmp_path / "tokens.json", tmp_path / "worker.token"
    port = free_port_between(*PORTS)
    address = f"ws://127.0.0.1:{port}"
    manager = ["manager", "--listen", f"127.0.0.1:{port}", "--token-file", str(tokens)]
    with (
        Cli(tmp_path / "home") as cli,
        log_lines("corral.node", logging.INFO) as log,
        anyio.fail_after(3 * LIMIT),
    ):
        first = cli.start(*manager)
        await run(cli.line_with, first, "manager listening on")
        _worker_token(mine, tokens)
        joined = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                partial(
                    run_worker,
                    address,
                    token_file=mine,
                    ready=lambda _: joined.set(),
                    port=free_port_between(*PORTS),
                    # (longer than a loaded machine takes to start the second manager
                    # and the test to copy its token: CI 110 saw the worker give up)
                    connect_retry=2 * LIMIT,
                )
            )
            await joined.wait()
            await run(cli.stop, [first])  # on purpose: it tries to rejoin (connect_retry)
            second = cli.start(*manager)  # new tokens: the worker's is refused (403)
            refused = await wait_until(lambda: log.with_("the manager refused our token"))
            # the likely cause, and what mends it (a multimachine audit, finding 5)
            assert (
                f"hint=\"{CAUSE}: copy the 'worker' entry of the manager's token file into "
                f'{mine}, which this worker reads again at each try"'
            ) in refused, refused
            _worker_token(mine, tokens)  # as the hint says: no restart of the worker
            line = await wait_until(
                lambda: log.with_("rejoined the manager"), "the rejoin's line", limit=LIMIT
            )
            tg.cancel_scope.cancel()
        cli.stop([second])

    back = BACK.search(line)
    assert back is not None and "level='warning'" in line, line
    # each failed try was logged: could not reach the stopped one, the new one refused
    tried = log.lines[: log.lines.index(line)]
    failed = [ln for ln in tried if "; retrying" in ln]
    assert int(back.group(1)) == len(failed) >= 2, tried
    assert any("level='error'" in ln and "status=403" in ln for ln in failed), failed
    assert 0 < float(back.group(2)) < 3 * LIMIT, line


def test_a_join_after_failed_tries_is_told_at_the_level_of_the_failures() -> None:
    with log_lines("corral.node", logging.INFO) as log:
        _back_after_tries("w", "ws://h:1", 1, 0.34, rejoin=False, loud=False)
        _back_after_tries("w", "ws://h:1", 3, 12.06, rejoin=True, loud=True)
    quiet, loud = log.lines
    assert (
        "level='info'" in quiet and "event='joined the manager after 1 failed try (0.3 s)'" in quiet
    )
    assert "level='warning'" in loud and BACK.search(loud) is not None
    assert "failed=3" in loud and "seconds=12.1" in loud and "worker='w'" in loud


def test_the_stale_token_hint_says_what_mends_each_source_of_the_token() -> None:
    address = "ws://127.0.0.1:53151"
    assert stale_token_hint(address, "t0k3n", None) == (
        f"{CAUSE}: stop this worker and start it again with its new worker token (--token)"
    )
    assert stale_token_hint(address, None, None, from_env=True) == (
        f"{CAUSE}: stop this worker and start it again with its new worker token "
        "(CORRAL_TOKEN set to it)"
    )
    assert stale_token_hint(address, None, None) == (
        f"{CAUSE}: copy the 'worker' entry of the manager's token file into "
        f"{token_path(address)}, which this worker reads again at each try"
    )
