"""``benchmarks/dataframe.py`` at a tiny size: every system run in this process (dask's
threaded scheduler with either shuffle and Corral's in-process cluster; the worker
processes of dask.distributed and Corral are left to the script's own runs) computes
the pipeline and gives the threaded scheduler's results (the script raises otherwise),
and the table is printed. The figures themselves are for
``benchmarks/README.md``, not asserted here."""

from __future__ import annotations

import pytest

from tests.helpers import load_bench


@pytest.mark.timeout(180)
def test_every_system_gives_the_threaded_results(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("dataframe")
    systems = ["threaded", "threaded-tasks", "corral-get"]
    argv = ["--partitions", "3", "--rows", "3000", "--users", "400", "--repeat", "1",
            "--systems", ",".join(systems)]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "every result equal to the threaded scheduler's" in out
    for system in systems:
        assert f"\n{system} " in out, system
