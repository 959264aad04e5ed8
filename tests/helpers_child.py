"""Tiny child programs for tests/test_processes.py (run as ``python helpers_child.py MODE``).

Modes:

- ``sleep [--no-lifeline] [--ignore-term] [--hook]``: print ``ready <pid> <worker id>``,
  then wait for ever; by default it runs :func:`actors.processes.watch_lifeline`
  meanwhile (``--hook``: with a hook printing ``hook ran``). ``--ignore-term`` sets
  SIGTERM to SIG_IGN *before* printing ``ready``.
- ``exit N``: print ``exiting N`` and exit with status ``N``.
- ``log``: log a warning through Corral's logger (``disk nearly full``, with fields
  ``free=12`` and ``where=['a b']``) to stderr, then exit with status 0.
- ``orphan``: start a ``sleep --no-lifeline`` grandchild (in its own process group),
  print ``grandchild <pid>`` and exit 0 without stopping it.
- ``parent pdeathsig|lifeline``: the intermediate parent of the no-orphans tests. It runs
  a :class:`~actors.processes.LocalProcessProvider` with one block of two ``sleep``
  grandchildren and prints ``pids <pid> <pid>``, then waits for ever (watching its own
  lifeline, so it cannot outlive the test either); its log, grandchildren's output
  included, goes to its stdout. With ``pdeathsig`` the grandchildren
  rely on PDEATHSIG alone (``--no-lifeline``); with ``lifeline`` PDEATHSIG is off and only
  their lifeline can end them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio

from actors.processes import LocalProcessProvider, watch_lifeline
from actors.providers import BlockSpec
from runtime.log import configure


def say(text: str) -> None:
    print(text, flush=True)


async def wait_forever(lifeline: bool, hook: bool) -> None:
    async with anyio.create_task_group() as tg:
        if lifeline:
            tg.start_soon(watch_lifeline, (lambda: say("hook ran")) if hook else None)
        await anyio.sleep_forever()


def sleep(args: list[str]) -> None:
    if "--ignore-term" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    say(f"ready {os.getpid()} {os.environ.get('CORRAL_WORKER_ID', '-')}")
    anyio.run(wait_forever, "--no-lifeline" not in args, "--hook" in args)


async def parent(kind: str) -> None:
    if kind not in ("pdeathsig", "lifeline"):
        raise SystemExit(f"unknown parent kind {kind!r}")
    child_args = ["--no-lifeline"] if kind == "pdeathsig" else []

    def argv_for(block_id: str, index: int) -> list[str]:
        return [sys.executable, __file__, "sleep", *child_args]

    pdeathsig = signal.SIGTERM if kind == "pdeathsig" else None
    configure("INFO", sys.stdout)  # the grandchildren's "ready" lines reach the test
    async with (
        LocalProcessProvider(argv_for, pdeathsig=pdeathsig) as provider,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(watch_lifeline)
        block = await provider.start_block(BlockSpec(workers=2))
        say("pids " + " ".join(str(pid) for pid in provider.pids(block).values()))
        await anyio.sleep_forever()


def main(argv: list[str]) -> None:
    mode, args = argv[0], argv[1:]
    if mode == "sleep":
        sleep(args)
    elif mode == "log":
        from runtime.log import get_logger

        configure("INFO")
        get_logger("corral.child").warning("disk nearly full", free=12, where=["a b"])
    elif mode == "exit":
        say(f"exiting {args[0]}")
        sys.exit(int(args[0]))
    elif mode == "orphan":
        grandchild = subprocess.Popen([sys.executable, __file__, "sleep", "--no-lifeline"])
        say(f"grandchild {grandchild.pid}")
    elif mode == "parent":
        anyio.run(parent, args[0])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
