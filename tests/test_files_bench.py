"""``benchmarks/files.py`` at its ``--quick`` size: every run of the table completes with
the right sums (and the heavy-tailed mix its right values, with speculative copies and
without), the loss really happened, the peak disk is measured with file outputs too,
nothing stays on the surviving workers' disks once released, and the table has its rows. The figures
themselves are for ``benchmarks/README.md``, not asserted here."""

from __future__ import annotations

import anyio
import pytest

from tests.helpers import load_bench

LIMIT = 280  #: nine runs of a cluster of worker processes, one after the other


@pytest.mark.timeout(300)  # a backstop: the run is bounded by LIMIT
@pytest.mark.anyio
async def test_the_quick_table_completes_with_correct_results() -> None:
    bench = load_bench("files")
    wf = bench.Workflow(seed=1, **bench.QUICK)
    with anyio.fail_after(LIMIT):
        got = await bench.measure(wf, 3, bench.QUICK_TAIL)
    t = bench.table(wf, 3, got)
    assert t["all_correct"]
    assert t["nothing_left"], {name: r["left"] for name, r in t["rows"].items()}
    assert set(t["rows"]) == {
        "prune-1",
        "prune-0",
        "files-prune-1",
        "files-prune-0",
        "replicas-no-loss",
        "loss+replicas",
        "loss-no-replicas",
    }
    for name in ("loss+replicas", "loss-no-replicas"):
        assert t["rows"][name]["killed"] is not None  # a worker was lost in both
    for name in ("prune-1", "prune-0", "files-prune-1", "files-prune-0", "replicas-no-loss"):
        row = t["rows"][name]
        assert row["killed"] is None and row["recomputes"] == 0 and row["recoveries"] == {}
        assert row["peak_disk_mib"] > 0  # every output went to disk
        assert row["peak_disk_db_mib"] <= row["peak_disk_mib"]  # samples of the same reports
    # Without replicas, whatever the loss took was computed again, never in a loop: at
    # most every file's load and skim once more.
    none = t["rows"]["loss-no-replicas"]
    assert none["recomputes"] <= 2 * wf.n_files + wf.datasets
    # (c): the heavy-tailed mix is right with speculative copies and without; none is
    # made with speculation off.
    assert set(t["tail_rows"]) == {"speculation", "no-speculation"}
    assert all(r["correct"] for r in t["tail_rows"].values())
    assert t["tail_rows"]["no-speculation"]["speculative"].get("started", 0) == 0
    # The files-prune runs' loads and skims were file outputs: unpruned, all of them are
    # still on the workers at the end (before the release); pruned, none is.
    files = {name: got["runs"][name].status["files"] for name in ("files-prune-0", "files-prune-1")}
    assert files["files-prune-0"]["file_outputs"] == 2 * wf.n_files
    assert files["files-prune-1"]["file_outputs"] == 0
    text = bench.render(t)
    assert "(a) peak disk" in text and "(c) heavy-tailed mix" in text
    assert "(a) the same with file outputs" in text
