"""Python snippets of the docs run as they stand, pasted into ``python -m asyncio``
(top-level ``await`` and ``async with``), each in a fresh interpreter: a user audit
found these failing so (``Cluster`` not imported, a ``stream=f`` with no ``f``, a
``set_policy`` after its cluster had closed). A block is found by a string it holds.
files.md's cluster snippets also run as a script (an ``async def main()`` run by
``asyncio.run``): another audit found them top-level ``async with``, a SyntaxError in a
script (``test_the_snippet_runs_as_a_script``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

LIMIT = 60  # seconds per snippet

#: Top-level await allowed, as in ``python -m asyncio``; no name defined beforehand.
RUN = """
import ast, asyncio, sys
source = sys.stdin.read()
code = compile(source, sys.argv[1], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, {"__name__": "__main__"})
if asyncio.iscoroutine(result):
    asyncio.run(result)
print("snippet ran")
"""

SNIPPETS = [
    ("policies.md", '@policies.register("retry", "survey-retry")'),
    ("policies.md", '@policies.register("priority", "roots-last")'),
    ("configuration.md", 'configure("DEBUG", stream=f)'),
    ("files.md", 'async with Cluster(policies={"priority": "consumers-first"})'),
    ("files.md", 'await cluster.set_policy("priority", "consumers-first")'),
    ("files.md", "async with Cluster(workers=8, prune_depth=2) as cluster:"),
    ("files.md", "def stage(path):"),  # staging inputs from shared storage
    ("files.md", "def extract(image: str, results: str) -> str:"),  # outputs outlive a preemption
    ("api.md", "def count_rows(table: File) -> int:"),  # Coming from Parsl: no port
    ("api.md", 'da.to_npy_stack("stack", x)'),  # a library call that computes inside
    ("api.md", "async def progress(cluster: Cluster, every: float = 2.0) -> None:"),
    ("api.md", "with ProgressBar():"),  # dask's callbacks on Corral's get
    ("api.md", "counts = await cluster.progress(futures)"),  # progress of futures
]


def block(doc: str, holding: str) -> str:
    """The one ```python block of ``docs/doc`` that holds ``holding``."""
    text = (ROOT / "docs" / doc).read_text()
    blocks = [b.split("\n```", 1)[0] for b in text.split("```python\n")[1:]]
    (found,) = [b for b in blocks if holding in b]
    return found + "\n"


@pytest.mark.parametrize(("doc", "holding"), SNIPPETS)
def test_the_snippet_runs_as_it_stands(tmp_path: Path, doc: str, holding: str) -> None:
    env = dict(os.environ, CORRAL_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", RUN, f"docs/{doc}"], input=block(doc, holding), cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 0 and "snippet ran" in done.stdout, done.stderr[-2000:]


#: the snippets that must run as a script too: plain ``python``, no top-level await
SCRIPTS = [(doc, holding) for doc, holding in SNIPPETS if doc == "files.md"]


@pytest.mark.parametrize(("doc", "holding"), SCRIPTS)
def test_the_snippet_runs_as_a_script(tmp_path: Path, doc: str, holding: str) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(block(doc, holding))
    env = dict(os.environ, CORRAL_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_docs_await_status_before_reading_a_key() -> None:
    """``status()`` is a coroutine: ``cluster.status()["policies"]``, copied from the docs,
    is a ``TypeError`` (user audit of policies F5); the docs write the awaited form."""
    unawaited = re.compile(r"(?<!await )\b(?:cluster|Cluster|Cluster\(address\))\.status\(\)\[")
    found = [
        f"{doc.name}:{n}: {line.strip()[:120]}"
        for doc in sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        if unawaited.search(line)
    ]
    assert not found, "\n".join(found)
