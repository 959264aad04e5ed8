"""The "stage task" of docs/files.md ("Staging inputs from shared storage"): a task
that copies an input file from shared storage to ``output_path`` and returns ``File``,
so that the tasks reading it run where the copy is. A user audit (an astronomer's
frames) found the pattern nowhere in the docs; the docs' own functions are run here,
and what the section says of them is checked: each reader runs on the worker holding
its staged copy when it waits for it (no copy between workers), and the copies are
removed once their readers have run and no Future holds them. (tests/test_docs_snippets.py runs the
snippet as it stands.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from tests.helpers import wait_until
from tests.test_docs_snippets import block

pytestmark = pytest.mark.anyio


def staging_functions() -> dict[str, Any]:
    """The snippet's functions, as the doc defines them (its ``asyncio.run(main())``
    left out: the test runs its own cluster)."""
    source = block("files.md", "def stage(path):").replace("asyncio.run(main())", "")
    names: dict[str, Any] = {"__name__": "staging_snippet"}
    exec(compile(source, "docs/files.md", "exec"), names)
    return names


def sandbox(path: str) -> str:
    """The worker sandbox a file is in (``corral-spill-XXXXXXXX``)."""
    (part,) = [p for p in Path(path).parts if p.startswith("corral-spill-")]
    return part


def frames(where: Path, n: int) -> list[str]:
    """``n`` frames on "shared storage", ``frame-i.fits`` of 50,000 + i bytes."""
    paths = []
    for i in range(n):
        paths.append(str(where / f"frame-{i}.fits"))
        Path(paths[-1]).write_bytes(os.urandom(50_000 + i))
    return paths


def exists(path: Any) -> bool:
    return os.path.exists(os.fspath(path))


async def test_readers_of_a_staged_input_run_where_its_copy_is(tmp_path: Path) -> None:
    fns = staging_functions()
    stage, calibrate = fns["stage"], fns["calibrate"]
    paths = frames(tmp_path, 4)
    with anyio.fail_after(60):
        async with Cluster(workers=2) as cluster:
            await cluster.wait_for_workers(2)
            # In one graph: each calibrate waits for its stage when the copy is made.
            dsk = {f"stage-{i}": (stage, p) for i, p in enumerate(paths)}
            dsk.update({f"calibrate-{i}": (calibrate, f"stage-{i}") for i in range(len(paths))})
            futures = await cluster.submit_graph(dsk, list(dsk))
            raws, cals = futures[: len(paths)], futures[len(paths) :]
            staged = await cluster.gather(raws)
            done = await cluster.gather(cals)
            for i, (raw, cal) in enumerate(zip(staged, done, strict=True)):
                assert (raw.name, raw.size) == (f"frame-{i}.fits", 50_000 + i)
                assert sandbox(os.fspath(cal)) == sandbox(os.fspath(raw))  # ran where it is
            assert len({sandbox(os.fspath(r)) for r in staged}) == 2  # both workers staged
            status = await cluster.status()
            assert not status["storage"]["transfers"].get("fetch")  # nothing copied
            copies = [os.fspath(r) for r in staged]
            del futures, raws, staged, raw
            await wait_until(
                lambda: not any(exists(p) for p in copies),
                "the staged copies removed once only the calibrated frames are held",
                limit=30,
            )
            assert all(exists(c) for c in done)
