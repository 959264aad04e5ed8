"""``benchmarks/cluster_processes.py``: the manager and workers the process benchmarks
run on (``transfer.py``, ``disk_recovery.py``, ``dataframe.py``, ``restore_takeback.py``)
are started, joined, and on the way out stopped with their output pipes closed (an
open one is a ResourceWarning, an error under pytest)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tests.helpers import load_bench


@pytest.mark.timeout(60)
def test_the_processes_join_and_are_stopped_with_their_pipes_closed(tmp_path: Path) -> None:
    bench = load_bench("cluster_processes")
    log = tmp_path / "manager.log"
    one = [["--cores", "1", "--name", "w1"]]
    with bench.manager_and_workers(str(tmp_path), one, ["--no-monitoring"], str(log)) as (
        address,
        workers,
    ):
        assert address.startswith("ws://127.0.0.1:")
        assert [w.poll() for w in workers] == [None]
    assert [w.poll() is not None for w in workers] == [True]
    assert [w.stdout.closed for w in workers] == [True]
    assert "manager listening on" in log.read_text()
    gc.collect()  # the manager's Popen, gone with its pipe (unclosed: a ResourceWarning)


@pytest.mark.timeout(60)
def test_a_manager_that_cannot_start_says_why(tmp_path: Path) -> None:
    bench = load_bench("cluster_processes")
    with (
        pytest.raises(
            AssertionError, match=r"ended before printing 'manager listening on'.*--no-such-flag"
        ),
        bench.manager_and_workers(str(tmp_path), [["--cores", "1"]], ["--no-such-flag"]),
    ):
        pass
