"""docs/embedding.md stays true: its example test module runs, and what it says of
``cancel`` and ``release`` within one client holds.

The example is the Python block after the marker comment in docs/embedding.md; it is
written to a temporary directory and run by pytest in a child process (with ``-W
error``, as the page advises), bounded in time. The cancel and release tests use
tasks held at a gate (a ``threading.Event`` the test opens) and wait for them to start
on another event, never sleeping and then asserting.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from runtime import Cluster, Future
from runtime.errors import CancelledError
from tests.helpers import wait_until

DOC = Path(__file__).resolve().parent.parent / "docs" / "embedding.md"
MARKER = "<!-- the example test module: tests/test_docs_embedding.py runs it -->"
LIMIT = 30


def example() -> str:
    text = DOC.read_text()
    assert MARKER in text, f"{DOC} lost its marker {MARKER!r}"
    block = text.split(MARKER, 1)[1].split("```python\n", 1)[1]
    return block.split("\n```", 1)[0] + "\n"


def test_the_pages_example_test_module_passes(tmp_path: Path) -> None:
    (tmp_path / "test_service_example.py").write_text(example())
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider",
            "-p", "no:randomly", "--rootdir", str(tmp_path), "-c", "/dev/null",
            "test_service_example.py",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=100,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout


GATE, STARTED = threading.Event(), threading.Event()


def held(x: int) -> int:
    STARTED.set()
    if not GATE.wait(LIMIT):
        raise TimeoutError("the gate never opened")
    return x * 10


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    GATE.clear()
    STARTED.clear()
    yield GATE
    GATE.set()  # never leave a worker thread blocked


async def started() -> None:
    assert await anyio.to_thread.run_sync(STARTED.wait, LIMIT), "the task never started"


@asynccontextmanager
async def two_users() -> AsyncIterator[tuple[Cluster, Future, Future]]:
    """A cluster and two futures of one pure call (two users' equal requests), running."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as c:
            fa, fb = c.submit(held, 7), c.submit(held, 7)
            assert fa.key == fb.key
            await started()
            yield c, fa, fb


@pytest.mark.anyio
async def test_a_cancel_ends_every_future_of_the_key_in_this_client(
    gate: threading.Event,
) -> None:
    async with two_users() as (c, fa, fb):
        await c.cancel(fa)
        assert isinstance(await fb.exception(), CancelledError)


@pytest.mark.anyio
async def test_a_release_ends_one_futures_interest_and_the_last_one_the_task(
    gate: threading.Event,
) -> None:
    async with two_users() as (c, fa, fb):
        fa.release()
        gate.set()
        assert await fb == 70 and fa.status == "released"
        fb.release()
        # The last holder of a running task lets go: the task is cancelled.
        gate.clear()
        STARTED.clear()
        fc = c.submit(held, 8)
        await started()
        key = fc.key
        fc.release()

        async def cancelled() -> bool:
            return ("processing", "cancelled") in [(r[1], r[2]) for r in await c.story(key)]

        await wait_until(cancelled, "the released task cancelled")
        gate.set()
