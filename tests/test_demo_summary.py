"""The demo's closing summary (``runtime.demo.render_summary``): its cluster line counts
in words (``2 in-process workers x 1 thread``, not ``2 worker (in-process) x 1
thread(s)``), and its last line says what to do next: the same on worker processes,
then across machines (the real flags, docs/deployment.md)."""

from __future__ import annotations

import io

import dask
import pytest
from rich.console import Console

from runtime.__main__ import build_parser
from runtime.demo import (
    NEXT_STEP,
    DemoConfig,
    DemoRun,
    build_graph,
    category_totals,
    cluster_text,
    render_summary,
)

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("workers", "threads", "processes", "says"),
    [
        (2, 1, False, "2 in-process workers x 1 thread"),
        (1, 2, False, "1 in-process worker x 2 threads"),
        (4, 1, True, "4 worker processes x 1 thread"),
        (1, 3, True, "1 worker process x 3 threads"),
    ],
)
def test_the_cluster_is_counted_in_words(
    workers: int, threads: int, processes: bool, says: str
) -> None:
    assert cluster_text(workers, threads, processes) == says


def test_the_summary_ends_with_what_to_do_next() -> None:
    cfg = DemoConfig(datasets=1, chunks=2, events=200)
    graph, final = build_graph(cfg)
    result = dask.get(graph, final)
    run = DemoRun(
        config=cfg, graph=graph, final=final, result=result, status={},
        totals=category_totals(graph), workers=2, threads=1, startup=0.1, wall=0.5,
    )  # fmt: skip
    out = io.StringIO()
    render_summary(run, Console(file=out, width=300, color_system=None))
    text = out.getvalue()
    assert "2 in-process workers x 1 thread, started in 100 ms" in text, text
    assert "thread(s)" not in text and "worker (in-process)" not in text, text
    assert text.strip().splitlines()[-1] == NEXT_STEP, text


def test_the_next_step_names_flags_the_command_line_takes() -> None:
    """--workers of the demo, --listen of the manager, a worker's ADDRESS: all real."""
    parser = build_parser()
    assert parser.parse_args(["demo", "--workers", "4"]).workers == 4
    assert parser.parse_args(["manager", "--listen", "0.0.0.0:8786"]).listen == "0.0.0.0:8786"
    assert parser.parse_args(["worker", "ws://HOST:8786"]).address == "ws://HOST:8786"
    for words in ("python -m runtime --workers 4", "manager --listen 0.0.0.0:8786",
                  "worker ws://HOST:8786", "docs/deployment.md"):  # fmt: skip
        assert words in NEXT_STEP, words
