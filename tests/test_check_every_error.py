"""``python -m runtime check --config FILE`` reports every bad value of a file in one
run, not the first of each pool or section: each key of a pool, of ``[alerting]`` and
of each ``[[alerts]]`` rule that is refused, and each rule name used twice (the audit's
file: one bad ``[alerting]`` value hid seven other errors). A manager started with the
file still stops at the first. The loaders with a keeping ``Refusals``, then the real
command (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.pools import COMMON_KEYS, LOCAL_KEYS, SLURM_KEYS, load_config
from runtime.errors import AlertConfigError, PoolConfigError, Refusals
from runtime.monitor import load_alerting
from tests.helpers import ROOT

BAD = """
[pools.cpu]
provider = "local"
max_blocks = "2"
cores_per_worker = 0
walltime = "1h"
max_idletime = 3
idle = 3

[pools.slurmy]
provider = "slrum"
partition = "x"

[alerting]
default_rules = "yes"
external_labels = "hpc"
resend = -1
dashboard_url = 5
interval = 2

[[alerts]]
name = "A"
expr = "corral_queue_depth > 0"
for = "1 minute"
labels = "x"

[[alerts]]
name = "B"
expr = "corral_queue_depth > 0"
action = {scale_out = {pool = "gpu", by = 1}}

[[alerts]]
name = "Good"
expr = "corral_queue_depth > 0"

[[alerts]]
name = "B"
expr = "corral_queue_depth > 1"
"""

#: (pool or rule, key) of each problem of BAD, in the order found
EXPECTED = [
    ("cpu", "idle"),  # unknown: the others are checked still
    ("cpu", "max_blocks"),
    ("cpu", "walltime"),
    ("cpu", "cores_per_worker"),
    ("slurmy", "provider"),  # then checked no further: its keys are another provider's
    ("", "alerting.resend"),
    ("", "alerting.default_rules"),
    ("", "alerting.dashboard_url"),
    ("", "alerting.external_labels"),
    ("A", "labels"),
    ("A", "for"),
    ("B", "action.scale_out.pool"),
    ("B", "name"),  # used by two rules
]


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    return path


def test_the_loaders_keep_every_bad_value(bad: Path) -> None:
    refuse = Refusals(keep=True)
    pools = load_config(bad, refuse)
    alerting = load_alerting(bad, refuse=refuse)
    found = [
        (e.pool, e.key) if isinstance(e, PoolConfigError) else (e.rule, e.key)
        for e in refuse.errors
        if isinstance(e, PoolConfigError | AlertConfigError)
    ]
    assert found == EXPECTED, refuse.errors
    assert all(str(bad) in str(e) for e in refuse.errors), refuse.errors
    assert pools == {}  # neither pool is fit to start
    # What was not refused is kept: its good setting, and the one good rule.
    assert alerting.interval == 2.0 and alerting.resend == 60.0
    assert [r["name"] for r in alerting.rules] == ["Good"]


def test_a_manager_still_stops_at_the_first(bad: Path) -> None:
    with pytest.raises(PoolConfigError) as info:
        load_config(bad)
    assert (info.value.pool, info.value.key) == ("cpu", "idle")
    with pytest.raises(AlertConfigError) as alert:
        load_alerting(bad)
    assert alert.value.key == "alerting.resend"


def check(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m runtime check --config PATH --no-probe``, run."""
    return subprocess.run(
        [sys.executable, "-m", "runtime", "check", "--config", str(path), "--no-probe"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=dict(os.environ, CORRAL_HOME=str(tmp_path / "home")),
    )  # fmt: skip


def test_check_prints_them_all_and_exits_1(bad: Path, tmp_path: Path) -> None:
    done = check(bad, tmp_path)
    assert done.returncode == 1, done
    fails = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == len(EXPECTED), done.stdout
    for (_, key), line in zip(EXPECTED, fails, strict=True):
        assert f"key '{key}'" in line, (key, line)


#: the audit's file (checkpoint, finding 6), on local pools: a misspelt fallback in a
#: pool with other bad keys, and another pool with a bad value of its own
FALLBACK_TYPO = """
[pools.ckpt]
provider = "local"
max_blocks = "4"
max_idle_time = 30
fallback = "owners"

[pools.owner]
provider = "local"
walltime = "90"
drain_period = 6000
"""


def test_a_misspelt_fallback_is_reported_with_its_pools_other_errors(tmp_path: Path) -> None:
    """The fallback is checked against the file's pools from every pool's own table,
    also one refused for other keys: before, the check saw only the pools that passed
    theirs, so the typo showed in the second run, once the other keys were fixed."""
    path = tmp_path / "bad.toml"
    path.write_text(FALLBACK_TYPO)
    done = check(path, tmp_path)
    assert done.returncode == 1, done
    keys = ", ".join([*COMMON_KEYS, *LOCAL_KEYS, *SLURM_KEYS])
    see = ". See docs/configuration.md#pools for every key."
    assert [line for line in done.stdout.splitlines() if line.startswith("FAIL")] == [
        f"FAIL  ckpt   config           pool 'ckpt' in {path}: key 'max_idle_time' is "
        f"unknown; did you mean 'max_idletime'? The keys are: {keys}{see}",
        f"FAIL  ckpt   config           pool 'ckpt' in {path}: key 'max_blocks' must be a "
        "whole number >= 1, got '4'; did you mean max_blocks = 4 (a number, not a "
        f"string)?{see[1:]}",
        f"FAIL  owner  config           pool 'owner' in {path}: key 'drain_period' must be "
        f"shorter than walltime (5400 s), got 6000{see}",
        f"FAIL  ckpt   config           pool 'ckpt' in {path}: key 'fallback' names no "
        f"pool: 'owners'; did you mean 'owner'? The pools are: ckpt, owner{see}",
    ], done.stdout
    # The manager still stops at the first problem; a fallback that names a pool the
    # file refused is not a typo (that pool's own lines say what is wrong with it).
    with pytest.raises(PoolConfigError) as info:
        load_config(path)
    assert (info.value.pool, info.value.key) == ("ckpt", "max_idle_time")
    path.write_text(FALLBACK_TYPO.replace('"owners"', '"owner"'))
    refuse = Refusals(keep=True)
    assert load_config(path, refuse) == {}
    assert [(e.pool, e.key) for e in refuse.errors if isinstance(e, PoolConfigError)] == [
        ("ckpt", "max_idle_time"), ("ckpt", "max_blocks"), ("owner", "drain_period"),
    ]  # fmt: skip
