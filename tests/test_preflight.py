"""The pre-flight check: ``python -m runtime check --config FILE`` and the same checks,
as warnings, when a manager starts with pools (runtime/preflight.py).

Local pools run end to end through the CLI everywhere. The Slurm checks run against the
one-node test cluster (``.ci/slurm up``) under the same rules as tests/test_slurm.py,
through tests/test_pools_slurm.py's ``cluster_lock`` fixture: without a cluster that
answers they skip (with ``CI=true`` they fail), and they hold the cluster's test lock.
Every test is bounded: pytest's timeout and each subprocess's.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import dask
import psutil
import pytest

import runtime
from actors.pools import pools_from_dicts
from actors.slurm import private_run_dir
from actors.worker import host_cpus
from runtime.errors import size_text
from runtime.messages import PROTOCOL_VERSION
from runtime.preflight import (
    FAIL,
    PASS,
    PROBE_CODE,
    WARN,
    CheckResult,
    Versions,
    _judge_probe,
    check_accelerators,
    check_directories,
    check_directory,
    check_partition,
    compare_versions,
    exit_code,
    judge_probe_gpus,
    log_quick_checks,
    parse_probe_output,
    parse_probe_reports,
    parse_sinfo,
    parse_test_only,
    render,
)
from tests.helpers import ROOT, Cli
from tests.test_enospc import small_fs  # noqa: F401  (the fixture: an 8 MiB tmpfs, root)
from tests.test_pools_slurm import CONF as SLURM_CONF
from tests.test_pools_slurm import cluster_lock  # noqa: F401  (the fixture: skip or lock)
from tests.test_slurm import slurm_conf  # noqa: F401  (cluster_lock needs it)

pytestmark = pytest.mark.timeout(180)


def check(
    tmp_path: Path, config: str, *flags: str, env: dict[str, str] | None = None, limit: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m runtime check --config <config written to tmp_path> FLAGS`` in
    ``tmp_path`` (bounded by ``limit`` seconds)."""
    path = tmp_path / "corral.toml"
    path.write_text(config)
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "runtime", "check", "--config", str(path), *flags],
        cwd=tmp_path, env=base, capture_output=True, text=True, timeout=limit,
    )  # fmt: skip


def results(done: subprocess.CompletedProcess[str]) -> dict[tuple[str, str], dict[str, str]]:
    """The ``--json`` results by (pool, check)."""
    data = json.loads(done.stdout)
    assert data["ok"] == (done.returncode == 0), data
    return {(r["pool"], r["check"]): r for r in data["results"]}


LOCAL = """
[pools.here]
provider = "local"
workers_per_node = 2
memory_per_worker = "64MiB"
"""


# ----------------------------------------------------------------------------- local pools


def test_a_good_local_config_passes_with_the_managers_versions(tmp_path: Path) -> None:
    spill = tmp_path / "not-yet" / "spill"  # missing, but can be created
    done = check(tmp_path, LOCAL, "--spill-dir", str(spill))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    probe = next(line for line in lines if " probe " in line)
    assert probe.startswith("PASS") and "here" in probe
    py = platform.python_version()
    assert f"Python {py}, Corral {runtime.__version__}, dask {dask.__version__}" in probe
    room = next(line for line in lines if "spill directory" in line)
    assert room.startswith("PASS") and str(spill) in room and "will be created" in room
    assert not spill.exists()  # checking creates nothing
    size = next(line for line in lines if "local size" in line)
    assert size.startswith("PASS") and "2 worker process(es) announcing 2 core(s)" in size
    limit = next(line for line in lines if "memory limit" in line)
    assert limit.startswith("WARN") and "here" in limit and "64.0 MiB" in limit, limit
    assert lines[-1] == "4 checks: 0 failed, 1 warnings"


def test_a_rule_on_a_pool_not_configured_is_a_warning(tmp_path: Path) -> None:
    """`check --config` passed a rule on `pool="heer"` (only `here` is configured) without
    a word: it can fire only if workers join with --pool heer."""
    rule = """
[[alerts]]
name = "P2"
expr = 'corral_queue_depth{pool="heer"} > 0 or corral_queue_depth{pool="here"} > 9'
"""
    done = check(tmp_path, LOCAL + rule, "--no-probe")
    assert done.returncode == 0, done.stdout + done.stderr  # a warning, not a failure
    line = next(line for line in done.stdout.splitlines() if "alert rule" in line)
    assert line.startswith("WARN") and line.endswith(
        "alert rule 'P2': no pool 'heer' is configured (pools: here); did you mean 'here'? "
        "The rule can fire only if workers join with --pool heer or tasks ask for pool heer"
    )
    done = check(tmp_path, LOCAL + rule.replace('"heer"', '"here"'), "--no-probe", "--json")
    assert ("*", "alert rule") not in results(done)


def test_a_rule_named_as_a_default_rule_is_a_warning_that_says_how_to_keep_both(
    tmp_path: Path,
) -> None:
    """`check --config` passed an `[[alerts]]` rule named `CorralQueueTime` without a word,
    though it replaces the default rule of that name whole (the manager says nothing
    either): it names the default, what of it the rule drops, and how to keep both."""
    rule = """
[[alerts]]
name = "CorralQueueTime"
expr = "corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 600"
for = "5m"
labels = {team = "corral", priority = "P3"}
"""
    done = check(tmp_path, LOCAL + rule, "--no-probe", "--json")
    assert done.returncode == 0, done.stdout + done.stderr  # a warning, not a failure
    said = results(done)[("*", "alert rule")]
    assert said["status"] == WARN
    assert said["detail"] == (
        "alert rule 'CorralQueueTime' replaces the default rule 'CorralQueueTime': the "
        "default does not run, and nothing of it is kept; yours drops its annotations "
        "summary, description"
    )
    assert said["advice"].startswith("To run both, give yours another name than ")
    done = check(tmp_path, LOCAL + rule.replace("CorralQueueTime", "SlowQueue"), "--no-probe",
                 "--json")  # fmt: skip
    assert ("*", "alert rule") not in results(done)


def test_a_spill_dir_that_cannot_be_created_fails_with_advice(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    spill = blocker / "spill"
    done = check(tmp_path, LOCAL, "--spill-dir", str(spill), "--no-probe")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "spill directory" in line)
    assert lines[at].startswith("FAIL")
    assert f"{spill} cannot be created: {blocker} is not a directory" in lines[at]
    assert "->" in lines[at + 1] and "Choose another spill directory" in lines[at + 1]
    assert not any(" probe " in line for line in lines)  # --no-probe


def test_a_local_pools_own_spill_dir_is_checked_for_that_pool(tmp_path: Path) -> None:
    """A local pool's ``spill_dir`` is where its workers spill: the check looks at it
    (for that pool); the default spill directory, which no pool uses, is not."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    spill = blocker / "spill"
    done = check(tmp_path, LOCAL + f'spill_dir = "{spill}"\n', "--no-probe", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    r = results(done)[("here", "spill directory")]
    assert r["status"] == "FAIL", r
    assert f"{spill} cannot be created: {blocker} is not a directory" in r["detail"], r
    assert ("*", "spill directory") not in results(done)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_slurm_pools_spill_dir_is_checked_for_that_pool_and_no_unused_default_is(
    tmp_path: Path,
) -> None:
    """The ckpt audit's defect 6: two Slurm pools with ``spill_dir = "/proc/corral-nope"``
    passed (only local pools' were checked), with a PASS for /tmp, which no pool used;
    every block then failed as it started. Now each pool's FAILs, naming the key, and
    no default line; a path nothing of which exists here is a WARN (the nodes may have
    it)."""
    slurm = {"provider": "slurm", "partition": "ckpt", "memory_per_worker": "1GiB"}
    pools = pools_from_dicts({
        "ckpt": {**slurm, "spill_dir": "/proc/corral-nope"},
        "owner": {**slurm, "spill_dir": "/proc/corral-nope"},
    })  # fmt: skip
    got = {(r.pool, r.check): r for r in check_directories(pools, run_dir=tmp_path / "run")}
    assert ("*", "spill directory") not in got, got
    for name in ("ckpt", "owner"):
        r = got[(name, "spill directory")]
        assert r.status == FAIL, r
        assert r.detail.startswith("/proc/corral-nope: /proc is not writable"), r
        assert "the pool's spill_dir (its workers' --spill-dir)" in r.advice, r
    elsewhere = pools_from_dicts({"ckpt": {**slurm, "spill_dir": "/corral-no-such/spill"}})
    (run, nodes) = check_directories(elsewhere, run_dir=tmp_path / "run")
    assert run.check == "run directory" and nodes.pool == "ckpt"
    if os.geteuid() != 0:  # (root may create it in /: then it passes here)
        assert nodes.status == WARN and "nothing of it exists on this machine" in nodes.detail
    # A pool without one spills in the default directory: checked, as before.
    mixed = pools_from_dicts({"ckpt": {**slurm, "spill_dir": str(tmp_path)}, "owner": slurm})
    got = {(r.pool, r.check): r for r in check_directories(mixed, run_dir=tmp_path / "run")}
    assert got[("ckpt", "spill directory")].status == PASS
    assert got[("*", "spill directory")].status == PASS


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_output_dir_that_cannot_be_written_fails_as_not_writable(tmp_path: Path) -> None:
    """``--output-dir /proc/nope``: /proc takes no new directory (whatever os.access
    tells root); it is not full. Before: "0.0 GiB free: the file system is full" and
    "choose a output directory"."""
    done = check(tmp_path, LOCAL, "--output-dir", "/proc/nope", "--no-probe")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "output directory" in line)
    assert lines[at].startswith("FAIL")
    assert "/proc/nope: /proc is not writable (creating a directory there: " in lines[at]
    assert "full" not in lines[at]
    assert "-> Choose an output directory you can write" in lines[at + 1]


def test_a_writable_but_full_file_system_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory that can be written on a file system with no room left: full, and
    the advice says "an output directory"; the probe leaves nothing behind."""
    monkeypatch.setattr(
        shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0)
    )  # type: ignore[attr-defined]
    r = check_directory("output directory", tmp_path / "out", needed=0)
    assert (r.status, r.detail) == (
        FAIL, f"{tmp_path / 'out'} (will be created in {tmp_path}): 0.0 MiB free: "
        "the file system is full (1.00 GiB used of 1.00 GiB)",
    )  # fmt: skip
    assert r.advice == "Free space there, or choose an output directory on another file system."
    assert list(tmp_path.iterdir()) == []


def test_a_small_file_system_with_room_is_too_small_not_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit: an empty 60 MB file system for two workers of disk_per_worker 300MiB
    is too small for them (WARN, naming both sizes), not "full" (FAIL: "0.1 GiB free:
    the file system is full", from any file system with less than 100 MiB free). Full
    is less free than 100 MiB or a hundredth of its size, if that is less: 0.5 MiB of
    an almost used 60 MB one."""
    size = 60 * 10**6
    usage = {"now": shutil._ntuple_diskusage(size, 0, size)}  # type: ignore[attr-defined]
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage["now"])
    r = check_directory("spill directory", tmp_path, needed=600 * 2**20)
    assert (r.status, r.detail) == (
        WARN, f"{tmp_path}: 57.2 MiB free, less than the 600.0 MiB the pools may spill "
        "(the file system is 57.2 MiB in all: too small for them)",
    )  # fmt: skip
    assert check_directory("spill directory", tmp_path, needed=0).status == PASS
    usage["now"] = shutil._ntuple_diskusage(size, size - 2**20, 2**20)  # type: ignore[attr-defined]
    assert check_directory("spill directory", tmp_path, needed=0).status == PASS  # 1 MiB: room
    usage["now"] = shutil._ntuple_diskusage(size, size - 2**19, 2**19)  # type: ignore[attr-defined]
    full = check_directory("spill directory", tmp_path, needed=600 * 2**20)
    assert (full.status, full.detail) == (
        FAIL, f"{tmp_path}: 0.5 MiB free: the file system is full (56.7 MiB used of 57.2 MiB)"
    )  # fmt: skip


def test_check_on_a_real_small_empty_file_system_says_it_is_too_small(
    tmp_path: Path,
    small_fs: Path,  # noqa: F811  (the fixture imported above)
) -> None:
    """The audit's command on a real empty 8 MiB tmpfs: a WARN (exit 0) that it is too
    small for the pool's 2 x 300 MiB, never "full"."""
    config = LOCAL.replace('memory_per_worker = "64MiB"', 'disk_per_worker = "300MiB"')
    done = check(tmp_path, config, "--spill-dir", str(small_fs), "--no-probe")
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if "spill directory  " in ln]
    assert line.startswith("WARN") and "full" not in line, line
    assert "8.0 MiB free, less than the 600.0 MiB the pools may spill" in line, line
    assert "(the file system is 8.0 MiB in all: too small for them)" in line, line


def test_json_results_and_a_warning_for_too_little_room(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    huge = LOCAL.replace('"64MiB"', '"4000TiB"') + "max_blocks = 2\n"
    done = check(tmp_path, huge, "--json", "--output-dir", str(out), "--spill-dir", str(out))
    assert done.returncode == 0, done.stdout + done.stderr  # a WARN is no failure
    got = results(done)
    assert set(got) == {
        ("here", "probe"), ("*", "local size"), ("*", "spill directory"),
        ("*", "output directory"), ("here", "memory limit"),
    }  # fmt: skip
    assert got[("here", "probe")]["status"] == PASS
    size = got[("*", "local size")]  # 4 workers of 4000 TiB: more than this machine has
    assert size["status"] == WARN and "announce more memory than it has" in size["detail"]
    for what in ("spill directory", "output directory"):
        r = got[("*", what)]
        assert r["status"] == WARN, r
        # 4000 TiB x 2 workers x 2 blocks = 16000 TiB
        assert "less than the 16384000.00 GiB the pools may spill" in r["detail"], r
        assert "memory_per_worker x workers" in r["advice"]


def test_a_local_pool_far_beyond_this_machine_is_a_warning(tmp_path: Path) -> None:
    """1000 blocks of 64 workers on this machine were taken without a word by `check`
    (and by the manager, which would have started 64,000 processes)."""
    huge = '[pools.here]\nprovider = "local"\ninit_blocks = 1000\nmax_blocks = 1000\n'
    huge += "workers_per_node = 64\n"
    done = check(tmp_path, huge, "--json", "--no-probe")
    assert done.returncode == 0, done.stdout + done.stderr  # a WARN is no failure
    size = results(done)[("*", "local size")]
    assert size["status"] == WARN, size
    assert "64000 worker process(es)" in size["detail"]
    assert f"{host_cpus()} CPU(s)" in size["detail"] and "per CPU" in size["detail"]
    assert "Lower max_blocks" in size["advice"]


@pytest.mark.parametrize(
    ("shape", "verdict"),
    [
        ({"workers_per_node": 2, "cores_per_worker": 2}, WARN),  # 4 cores, 2 CPUs
        ({"workers_per_node": 1, "cores_per_worker": 3}, WARN),  # 3 cores, 2 CPUs
        ({"workers_per_node": 2, "cores_per_worker": 1}, PASS),  # 2 cores, 2 CPUs
    ],
)
def test_local_workers_announcing_more_cores_than_cpus_are_a_warning(
    monkeypatch: pytest.MonkeyPatch, shape: dict[str, int], verdict: str
) -> None:
    """`check --config` said ``PASS * local size ... 2 worker process(es) announcing 4
    core(s) ...; this machine: 2 CPU(s)``, while the manager warns of that overcommit as
    its workers join: it is a WARN now, saying to give fewer cores or run fewer workers."""
    import runtime.preflight
    from runtime.preflight import check_local_size

    monkeypatch.setattr(runtime.preflight, "host_cpus", lambda: 2)
    pools = pools_from_dicts({"here": {"provider": "local", **shape}})
    result = check_local_size(pools)
    assert result is not None and result.status == verdict, result
    cores = shape["workers_per_node"] * shape["cores_per_worker"]
    assert f"announcing {cores} core(s)" in result.detail and "2 CPU(s)" in result.detail
    if verdict == WARN:
        assert f"more cores than it has CPUs ({cores} > 2)" in result.detail, result
        assert "fewer cores (cores_per_worker) or run fewer of them" in result.advice
        assert "add up to 2 or fewer" in result.advice
        assert "announce more memory" not in result.detail, result
    else:
        assert result.advice == ""


def test_cores_and_memory_past_the_machine_are_both_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import runtime.preflight
    from runtime.preflight import check_local_size

    monkeypatch.setattr(runtime.preflight, "host_cpus", lambda: 2)
    shape = {"provider": "local", "cores_per_worker": 4, "memory_per_worker": "4000TiB"}
    result = check_local_size(pools_from_dicts({"here": shape}))
    assert result is not None and result.status == WARN, result
    assert "more cores than it has CPUs (4 > 2)" in result.detail, result
    assert "announce more memory than it has" in result.detail, result
    assert "cores_per_worker" in result.advice and "memory_per_worker" in result.advice


def test_missing_slurm_commands_are_a_clear_failure(tmp_path: Path) -> None:
    config = '[pools.hpc]\nprovider = "slurm"\npartition = "ckpt"\n'
    empty = tmp_path / "bin"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty))
    done = check(tmp_path, config, "--json", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    got = results(done)
    r = got[("*", "batch system")]
    assert r["status"] == FAIL
    assert "not found on PATH: sinfo, squeue, sbatch, scontrol" in r["detail"]
    assert "module load slurm" in r["advice"]
    # Nothing else is asked of a batch system that is not there.
    assert not any(pool == "hpc" for pool, _ in got)


def test_a_controller_that_is_down_is_a_clear_failure(tmp_path: Path) -> None:
    # Slurm's own answers when slurmctld is down (22.05), from stand-in commands.
    fake = tmp_path / "bin"
    fake.mkdir()
    said = {
        "sinfo": "echo 'slurm_load_partitions: Unable to contact slurm controller "
        "(connect failure)' >&2; exit 1",
        "scontrol": "echo 'Slurmctld(primary) at vm is DOWN'; exit 1",
        "squeue": "exit 1",
        "sbatch": "exit 1",
    }
    for command, body in said.items():
        (fake / command).write_text(f"#!/bin/sh\n{body}\n")
        (fake / command).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    config = '[pools.hpc]\nprovider = "slurm"\npartition = "ckpt"\n'
    done = check(tmp_path, config, "--json", env=env)
    assert done.returncode == 1
    r = results(done)[("*", "batch system")]
    assert r["status"] == FAIL
    assert "Unable to contact slurm controller (connect failure)" in r["detail"]
    assert "scontrol ping: Slurmctld(primary) at vm is DOWN" in r["detail"]
    assert "slurmctld runs" in r["advice"]


def test_a_failing_or_unrunnable_slurm_command_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm command that exits non-zero, or cannot be started, was a BatchSystemError
    with no advice (the account check's warning then said nothing to do)."""
    from runtime.preflight import check_accounting

    fake = tmp_path / "bin"
    fake.mkdir()
    scontrol = fake / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\necho 'slurm_load_ctl_conf error: Unable to contact' >&2\nexit 1\n"
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))  # (not this machine's own Slurm)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/x.conf")
    pool = pools_from_dicts({"hpc": {"provider": "slurm", "partition": "p", "account": "a"}})["hpc"]
    result = check_accounting(pool, timeout=10.0)
    assert result is not None and result.status == WARN
    assert result.detail == (
        "not known: 'scontrol show' failed with exit code 1: "
        "slurm_load_ctl_conf error: Unable to contact"
    )
    assert result.advice.startswith("Fix what Slurm printed; if it says it cannot reach")
    assert "SLURM_CONF=/etc/slurm/x.conf" in result.advice and "`scontrol ping`" in result.advice
    scontrol.chmod(0o644)  # there, but not a program this user may run
    result = check_accounting(pool, timeout=10.0)
    assert result is not None and result.status == WARN
    assert "could not be run: [Errno 13] Permission denied" in result.detail
    assert result.advice == (
        "Check that 'scontrol' on PATH is the Slurm command and may be run by this user "
        "(its permissions)."
    )


def test_a_memory_limit_without_its_unit_is_refused_by_check(tmp_path: Path) -> None:
    """``memory_per_worker = 512`` (MiB meant) was read as 512 bytes and passed; every
    producer of the pool would then stall. ``corral check`` refuses it, one FAIL (with
    the file's other refusals, if any: tests/test_check_policies.py)."""
    done = check(tmp_path, LOCAL.replace('"64MiB"', "512"))
    assert done.returncode == 1, done.stdout + done.stderr
    fails = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and "'memory_per_worker'" in fails[0], done.stdout
    assert "= 512 is 512 bytes; did you mean 512MiB?" in fails[0], done.stdout


def test_the_manager_starts_despite_a_check_and_says_why(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(LOCAL.replace('"64MiB"', '"4000TiB"') + "init_blocks = 0\n")
    with Cli(tmp_path / "home") as cli:
        proc = cli.start("manager", "--listen", "127.0.0.1:0", "--config", str(config))
        cli.line_with(proc, "manager listening on")  # then the checks, in the background
        warning = cli.line_with(proc, "pre-flight WARN")  # 8000 TiB on this machine
        assert "local size" in warning and "announce more memory than it has" in warning
        warning = cli.line_with(proc, "pre-flight WARN")  # a limit in thread execution
        assert "memory limit" in warning and "not enforced on a task" in warning
        warning = cli.line_with(proc, "pre-flight WARN")
        assert "spill directory" in warning and "the pools may spill" in warning
        assert proc.poll() is None
        cli.stop([proc])


def held_slurm(bin_dir: Path, marks: Path) -> None:
    """Stand-in Slurm commands in ``bin_dir``: ``sinfo`` writes its pid to
    ``marks/sinfo.pid`` and answers (partition ckpt, one idle node) only once
    ``marks/release`` exists; ``sbatch --test-only`` refuses the account; the others
    answer nothing."""
    bin_dir.mkdir()
    marks.mkdir()
    said = {
        "sinfo": f'echo $$ > "{marks}/pid.tmp" && mv "{marks}/pid.tmp" "{marks}/sinfo.pid"\n'
        f'while [ ! -e "{marks}/release" ]; do sleep 0.05; done\n'
        "echo 'ckpt|up|1|idle'",
        "sbatch": "cat > /dev/null\necho 'sbatch: error: Batch job submission failed: "
        "Invalid account or account/partition combination specified' >&2\nexit 1",
        "squeue": "exit 0",
        "scontrol": "exit 1",
    }
    for command, body in said.items():
        (bin_dir / command).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / command).chmod(0o755)


def held_manager(tmp_path: Path, cli: Cli) -> tuple[subprocess.Popen[str], str, int]:
    """A manager with a Slurm pool whose pre-flight ``sinfo`` (:func:`held_slurm`) does
    not answer: the manager, its address and the waiting ``sinfo``'s pid, once it runs."""
    held_slurm(tmp_path / "bin", tmp_path / "marks")
    cli.env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{cli.env['PATH']}"
    config = tmp_path / "corral.toml"
    config.write_text('[pools.hpc]\nprovider = "slurm"\npartition = "ckpt"\ninit_blocks = 0\n')
    proc, address = cli.manager("--config", str(config))
    pid_file = tmp_path / "marks" / "sinfo.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():  # the pre-flight asks Slurm (bounded)
        assert time.monotonic() < deadline, "the pre-flight's sinfo did not start"
        assert proc.poll() is None, "the manager ended"
        time.sleep(0.05)
    return proc, address, int(pid_file.read_text())


@pytest.mark.anyio
async def test_the_manager_answers_while_its_pre_flight_waits_for_slurm(tmp_path: Path) -> None:
    """With Slurm not answering (SLURM_CONF=/nonexistent), the manager listened only
    once its pre-flight checks had given up (10 s per command): a console got
    ConnectFailed meanwhile. It now listens at once and checks in the background,
    logging what it found when Slurm answers."""
    from runtime import Cluster

    with Cli(tmp_path / "home") as cli:
        proc, address, sinfo = held_manager(tmp_path, cli)
        with anyio.fail_after(60):
            async with Cluster(address) as cluster:
                status = await cluster.status()
        assert "hpc" in status["autoscaler"]["targets"]
        # Answered while the pre-flight still waits for sinfo (it gives up after 10 s).
        assert psutil.pid_exists(sinfo), "sinfo was killed before the status answered"
        (tmp_path / "marks" / "release").touch()
        line = cli.line_with(proc, "pre-flight FAIL")  # the checks go on with its answer
        assert "Slurm refuses a block: Invalid account" in line, line
        cli.stop([proc])
        assert proc.returncode == 0


def test_a_manager_stopped_during_its_pre_flight_kills_the_waiting_command(
    tmp_path: Path,
) -> None:
    with Cli(tmp_path / "home") as cli:
        proc, _address, sinfo = held_manager(tmp_path, cli)
        started = time.monotonic()
        cli.stop([proc])  # SIGTERM; SIGKILL after 10 s
        assert proc.returncode == 0
        assert time.monotonic() - started < 8  # not held by the check's thread
        assert not psutil.pid_exists(sinfo), "the pre-flight's sinfo outlived the manager"


def test_a_slurm_command_that_does_not_answer_says_what_to_look_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check` with SLURM_CONF=/nonexistent said only 'no answer within 20 s', after
    40 s (sinfo, then scontrol ping). It now names the command, what it printed first,
    SLURM_CONF and `scontrol ping`, and asks nothing more of a Slurm that does not
    answer."""
    fake = tmp_path / "bin"
    fake.mkdir()
    retry = (
        "sinfo: error: s_p_parse_file: cannot stat file /nonexistent: No such file or "
        "directory, retrying in 1sec up to 60sec"
    )
    said = {
        "sinfo": f"echo '{retry}' >&2\necho '{retry}' >&2\nsleep 60",  # Slurm's own words
        "scontrol": f"touch '{tmp_path}/pinged'\nsleep 60",
        "squeue": "exit 1",
        "sbatch": "exit 1",
    }
    for command, body in said.items():
        (fake / command).write_text(f"#!/bin/sh\n{body}\n")
        (fake / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", "/nonexistent")
    from runtime.preflight import check_batch_system

    started = time.monotonic()
    result, parts = check_batch_system(timeout=1.0)
    assert time.monotonic() - started < 10  # one command's time, its `sleep` killed with it
    assert parts is None and result.status == FAIL
    assert result.detail == f"`sinfo` gave no answer within 1 s (killed); it printed: {retry}"
    assert "SLURM_CONF=/nonexistent: check that this file exists" in result.advice
    assert "`scontrol ping`" in result.advice
    assert not (tmp_path / "pinged").exists()  # it would not answer either
    monkeypatch.delenv("SLURM_CONF")
    result, _ = check_batch_system(timeout=0.5)
    assert "SLURM_CONF is not set" in result.advice


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """Slurm's commands (sinfo, squeue, sbatch, scontrol) first on PATH, each a shell
    script running ``body``: no real cluster is asked."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for command in ("sinfo", "squeue", "sbatch", "scontrol"):
        (fake / command).write_text(f"#!/bin/sh\n{body}\n")
        (fake / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.anyio
async def test_the_checks_at_manager_start_never_hold_it_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slurm commands that hang (a controller that does not answer): the manager waits
    # for the quick checks at most `limit` seconds, then starts.
    fake_slurm(tmp_path, monkeypatch, "sleep 30")
    pools = pools_from_dicts({"hpc": {"provider": "slurm", "partition": "ckpt"}})
    started = time.monotonic()
    assert await log_quick_checks(pools, limit=1.0) == []
    assert time.monotonic() - started < 5


# ----------------------------------------------------------------------------- recorded output


def test_version_comparison_names_both_sides() -> None:
    mine = Versions("3.11.7", "0.1.0", "2025.1.0")
    same = parse_probe_output(
        'corral: block probe ...\nCORRAL-PROBE {"python": "3.11.9", "corral": "0.1.0", '
        f'"dask": "2025.1.0", "protocol": {PROTOCOL_VERSION}, '
        '"executable": "/usr/bin/python3"}\n'
    )
    assert same is not None and compare_versions(mine, same) == []  # patch level ignored
    other = parse_probe_output(
        f'CORRAL-PROBE {{"python": "3.12.1", "corral": "0.2.0", "dask": "2024.12.1", '
        f'"protocol": {PROTOCOL_VERSION}}}'
    )
    assert other is not None
    assert compare_versions(mine, other) == [
        "Python 3.12.1 on the workers, 3.11.7 in the manager",
        "Corral 0.2.0 on the workers, 0.1.0 in the manager",
        "dask 2024.12.1 on the workers, 2025.1.0 in the manager",
    ]
    assert parse_probe_output("Traceback (most recent call last):\n...") is None


def test_the_probe_fails_a_checkout_of_another_protocol_of_the_same_release() -> None:
    """A user audit (upgrade F3): a worker environment of an older checkout of the same
    release (both say Corral 0.1.0) passed the probe, and the manager then refused
    every worker of the pool. The protocol version tells them apart: a report without
    one is of a Corral from before protocol versions (0)."""
    mine = Versions("3.11.7", "0.1.0", "2025.1.0", 1)
    old = {"python": "3.11.7", "corral": "0.1.0", "dask": "2025.1.0"}  # no protocol
    assert compare_versions(mine, old) == [
        "Corral protocol 0 on the workers, 1 in the manager: the workers run an older "
        "Corral checkout than the manager, which would refuse them at their Hello; install "
        "the manager's Corral where the workers run"
    ]
    assert compare_versions(mine, {**old, "protocol": 2}) == [
        "Corral protocol 2 on the workers, 1 in the manager: the workers run a newer "
        "Corral checkout than the manager, which would refuse them at their Hello; upgrade "
        "the manager first, or give the workers its Corral"
    ]
    here = Versions.here()
    old = {"python": here.python, "corral": here.corral, "dask": here.dask}
    got = _judge_probe("cpu", old, "here", "")
    assert got.status == FAIL and got.detail.startswith("version mismatch: Corral protocol 0")
    assert "Corral of the same release and checkout: the same protocol" in got.advice


def test_the_real_probe_reports_the_protocol_of_the_corral_it_imports(tmp_path: Path) -> None:
    """PROBE_CODE run by a Python: this Corral's protocol; an older Corral's (a
    ``runtime`` package whose node module has no PROTOCOL_VERSION), 0, which fails."""
    here = subprocess.run(
        [sys.executable, "-c", PROBE_CODE], capture_output=True, text=True, timeout=60
    )
    report = parse_probe_output(here.stdout)
    assert report is not None and report["protocol"] == PROTOCOL_VERSION, here
    assert compare_versions(Versions.here(), report) == []
    older = tmp_path / "older"
    (older / "runtime").mkdir(parents=True)
    (older / "runtime" / "__init__.py").write_text(f"__version__ = {runtime.__version__!r}\n")
    for module in ("messages", "node"):  # as in a Corral from before protocol versions
        (older / "runtime" / f"{module}.py").write_text("CORRAL_VERSION = '0.1.0'\n")
    env = {**os.environ, "PYTHONPATH": str(older)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE_CODE], capture_output=True, text=True, timeout=60,
        cwd=older, env=env,
    )  # fmt: skip
    report = parse_probe_output(done.stdout)
    assert report is not None and report["protocol"] == 0, done
    result = _judge_probe("cpu", report, "here", "")
    assert result.status == FAIL, result
    assert "Corral protocol 0 on the workers" in result.detail, result


def test_the_probe_of_a_gpu_pool_says_which_gpu_each_worker_took() -> None:
    """A user audit: `check --config` of a Slurm GPU pool said only the versions; which
    GPU its workers get was seen only once they ran. The probe runs one worker a node,
    each on its own line of the block script, and says what each was pinned to and what
    Slurm gave the job; a worker pinned to none, or two to one GPU, fails it."""
    pool = pools_from_dicts(
        {"gpu": {"provider": "slurm", "workers_per_node": 2, "accelerators": 2}}
    )["gpu"]
    run = subprocess.run(
        [sys.executable, "-c", PROBE_CODE], capture_output=True, text=True, timeout=60,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "3", "SLURM_JOB_GPUS": "2,3"},
    )  # fmt: skip
    (real,) = parse_probe_reports(run.stdout)
    assert real is not None and (real["accelerator"], real["job_gpus"]) == ("3", "2,3"), run
    one = {**real, "accelerator": "2"}
    pinned = "its 2 worker(s) pinned to GPU(s) 2, 3 (Slurm gave the job the GPUs 2,3)"
    assert judge_probe_gpus(pool, [real, one]) == (pinned, "")
    got = _judge_probe("gpu", real, "Slurm job 7 COMPLETED", "", (pinned, ""))
    assert got.status == PASS and f"as in the manager; {pinned} (Slurm job 7" in got.detail
    seen, wrong = judge_probe_gpus(pool, [real, real])
    assert wrong == "two workers of the node were pinned to one GPU (3)", seen
    got = _judge_probe("gpu", real, "Slurm job 7 COMPLETED", "", (seen, wrong))
    assert got.status == FAIL and "#SBATCH --gres=gpu:N" in got.advice, got
    none = {**real, "accelerator": "", "job_gpus": ""}
    assert judge_probe_gpus(pool, [real, none]) == (
        "its 2 worker(s) pinned to GPU(s) -, 3 (Slurm gave the job the GPUs 2,3)",
        "1 of its workers were pinned to no accelerator",
    )
    assert judge_probe_gpus(pool, [real])[1] == "1 of its 2 workers printed no report"


def test_test_only_answers_are_parsed() -> None:
    ok = "sbatch: Job 101 to start at 2026-12-01T18:32:50 using 1 processors on nodes vm in partition ckpt\n"  # noqa: E501
    assert parse_test_only(0, ok) == (
        True,
        "estimated start 2026-12-01T18:32:50 using 1 CPUs on vm",
    )
    account = (
        "sbatch: error: Batch job submission failed: Invalid account or account/partition "
        "combination specified\n"
    )
    assert parse_test_only(1, account) == (
        False,
        "Invalid account or account/partition combination specified",
    )
    qos = "allocation failure: Invalid qos specification\n"
    assert parse_test_only(1, qos) == (False, "Invalid qos specification")
    assert parse_test_only(1, "") == (False, "exit code 1, no message")


def test_partition_states_from_recorded_sinfo() -> None:
    pool = pools_from_dicts({"p": {"provider": "slurm", "partition": "x"}})["p"]

    def state(text: str) -> tuple[str, str]:
        r = check_partition(pool, parse_sinfo(text))
        return r.status, r.detail

    assert state("x|up|1|idle\ny*|up|1|idle") == (PASS, "partition x is up; nodes: 1 idle")
    assert state("x|drain|2|idle") == (
        FAIL,
        "partition x is drain; nodes: 2 idle: it takes no new jobs",
    )
    assert state("x|down|2|idle")[0] == FAIL
    assert state("x|inact|2|idle")[1].endswith("it takes no jobs")
    assert state("x|up|2|down*\nx|up|1|drained") == (
        FAIL,
        "partition x is up; nodes: 2 down*, 1 drained: no node can run jobs",
    )
    assert state("x|up|3|allocated")[0] == WARN  # blocks will queue
    assert state("y|up|1|idle")[1] == "partition 'x' does not exist (Slurm has: y)"
    # No partition in the pool: Slurm's default one.
    default = pools_from_dicts({"p": {"provider": "slurm"}})["p"]
    r = check_partition(default, parse_sinfo("a|up|1|idle\nb*|up|1|mixed"))
    assert (r.status, r.detail) == (PASS, "partition b (default) is up; nodes: 1 mixed")


def test_render_and_exit_code() -> None:
    rs = [
        CheckResult("a", "probe", PASS, "fine"),
        CheckResult("*", "spill directory", WARN, "small", "free some"),
    ]
    assert exit_code(rs) == 0
    assert exit_code([*rs, CheckResult("a", "partition", FAIL, "gone", "fix")]) == 1
    text = render(rs)
    assert "WARN  *  spill directory  small\n" in text and "-> free some" in text


def test_a_full_file_system_fails(tmp_path: Path) -> None:
    usage = shutil.disk_usage(tmp_path)
    ok = check_directory("output directory", tmp_path, needed=0)
    assert ok.status == PASS and f"{size_text(usage.free)} free" in ok.detail
    short = check_directory("output directory", tmp_path, needed=usage.total * 2)
    assert short.status == WARN


# ----------------------------------------------------------------------------- real Slurm


def slurm_check(
    tmp_path: Path, config: str, *flags: str
) -> tuple[int, dict[tuple[str, str], dict[str, str]], str]:
    """The check against the test cluster: its exit code, results and stderr."""
    env = dict(os.environ, SLURM_CONF=SLURM_CONF)
    done = check(tmp_path, config, "--json", *flags, env=env, limit=150)
    return done.returncode, results(done), done.stderr


@pytest.mark.usefixtures("cluster_lock")
def test_an_existing_partition_passes_and_a_wrong_name_fails(
    tmp_path: Path,
) -> None:
    config = """
[pools.ok]
provider = "slurm"
partition = "ckpt"
walltime = "00:05:00"
[pools.typo]
provider = "slurm"
partition = "ckpt-typo"
"""
    code, got, _stderr = slurm_check(tmp_path, config, "--no-probe")
    assert code == 1
    assert got[("*", "batch system")]["status"] == PASS
    part = got[("ok", "partition")]
    assert part["status"] == PASS and "partition ckpt is up; nodes:" in part["detail"]
    test_only = got[("ok", "test-only")]
    assert test_only["status"] == PASS and "estimated start" in test_only["detail"]
    typo = got[("typo", "partition")]
    assert typo["status"] == FAIL
    assert "partition 'ckpt-typo' does not exist" in typo["detail"]
    assert "ckpt, ckpt-cancel, owner" in typo["detail"]
    assert ("typo", "test-only") not in got  # nothing more is asked of a missing partition


@pytest.mark.usefixtures("cluster_lock")
def test_sbatch_test_only_reports_slurms_reason(tmp_path: Path) -> None:
    config = """
[pools.huge]
provider = "slurm"
partition = "ckpt"
memory_per_worker = "100TiB"
[pools.acct]
provider = "slurm"
partition = "ckpt"
account = "no-such-account"
qos = "no-such-qos"
[pools.feat]
provider = "slurm"
partition = "ckpt"
scheduler_options = "#SBATCH --constraint=haswell"
"""
    code, got, _stderr = slurm_check(tmp_path, config, "--no-probe")
    assert code == 1
    huge = got[("huge", "test-only")]
    assert huge["status"] == FAIL
    assert (
        "Slurm refuses a block: Requested node configuration is not available" in (huge["detail"])
    )
    assert "scheduler_options" not in huge["advice"]  # it sets none
    # A feature no node has: the advice names the pool's own #SBATCH line.
    feat = got[("feat", "test-only")]
    assert feat["status"] == FAIL
    assert "Invalid feature specification" in feat["detail"], feat
    assert "scheduler_options (#SBATCH --constraint=haswell: " in feat["advice"], feat
    acct = got[("acct", "test-only")]
    if acct["status"] == FAIL:  # a cluster that enforces associations
        assert "Invalid account" in acct["detail"] or "Invalid qos" in acct["detail"], acct
    else:  # the test cluster has no accounting: Slurm accepts any name, and we say so
        assert "account no-such-account, qos no-such-qos" in acct["detail"]
        note = got[("acct", "account/qos")]
        assert note["status"] == WARN
        assert "AccountingStorageEnforce=none" in note["detail"]
        assert "account 'no-such-account', qos 'no-such-qos'" in note["detail"]


def probe_pool(tmp_path: Path, pool: str, worker_init: str) -> tuple[int, dict[str, str], str]:
    """The check of one Slurm pool on partition ckpt with ``worker_init``: its exit code,
    the probe's result and stderr."""
    config = f"""
[pools.{pool}]
provider = "slurm"
partition = "ckpt"
walltime = "00:05:00"
worker_init = {json.dumps(worker_init)}
"""
    code, got, stderr = slurm_check(tmp_path, config, "--probe-timeout", "90")
    return code, got[(pool, "probe")], stderr


@pytest.mark.usefixtures("cluster_lock")
def test_the_probe_job_reports_the_managers_versions(tmp_path: Path) -> None:
    code, probe, stderr = probe_pool(tmp_path, "ck", "echo corral-probe-init >&2")
    assert code == 0, probe
    assert probe["status"] == PASS, probe
    py = platform.python_version()
    assert (
        f"Python {py}, Corral {runtime.__version__}, dask {dask.__version__}" in (probe["detail"])
    )
    assert "COMPLETED" in probe["detail"]
    assert "probe of pool ck: Slurm job" in stderr  # progress is printed
    (err,) = tmp_path.glob("corral-slurm/check-*/ck.err")  # the job ran worker_init
    assert "corral-probe-init" in err.read_text()


@pytest.mark.usefixtures("cluster_lock")
def test_a_probe_reporting_another_version_fails(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "dask").mkdir(parents=True)
    (fake / "dask" / "__init__.py").write_text('__version__ = "0.0.1+fake"\n')
    code, probe, _stderr = probe_pool(tmp_path, "stale", f"export PYTHONPATH={fake}:$PYTHONPATH")
    assert code == 1
    assert probe["status"] == FAIL, probe
    assert f"dask 0.0.1+fake on the workers, {dask.__version__} in the manager" in (probe["detail"])
    assert "install the same Corral and dask" in probe["advice"]


@pytest.mark.usefixtures("cluster_lock")
def test_a_probe_whose_worker_init_fails_fails_with_its_stderr(tmp_path: Path) -> None:
    # The workers run the manager's Python by its absolute path, so a failed worker_init
    # used to go unseen: the probe passed and the blocks started in the wrong setting.
    code, probe, _stderr = probe_pool(tmp_path, "broken", "source /nonexistent/bin/activate")
    assert code == 1
    assert probe["status"] == FAIL, probe
    assert "FAILED, exit code 1" in probe["detail"]
    assert "/nonexistent/bin/activate: No such file or directory" in probe["detail"]
    assert "corral: worker_init failed (exit status 1): no worker started" in probe["detail"]
    assert "A command of the pool's worker_init failed" in probe["advice"]


def test_pools_from_dicts_checks_need_no_file() -> None:
    # The checks take pools however they were made (Cluster(pools=...) too).
    pools = pools_from_dicts({"p": {"provider": "local"}})
    from runtime.preflight import run_checks

    rs = run_checks(pools, probe=False)
    assert [(r.pool, r.check) for r in rs] == [("*", "local size"), ("*", "spill directory")]


def test_a_short_walltime_without_drain_period_is_a_warning() -> None:
    """A one-minute walltime and no drain_period passed `check` without a word, while
    the default drain margin (a minute plus the longest task) drained every worker as
    it joined. Now capped at half the walltime, and `check` (and the manager) says so;
    a drain_period of the pool's own, or a walltime long enough, passes."""
    from runtime.preflight import run_checks

    pools = pools_from_dicts({
        "short": {"walltime": "00:01:00"},
        "set": {"walltime": "00:01:00", "drain_period": 10},
        "long": {"walltime": "00:10:00"},
        "none": {},
    })  # fmt: skip
    got = {(r.pool, r.check): r for r in run_checks(pools, probe=False)}
    short = got[("short", "drain")]
    assert short.status == WARN, short
    assert "walltime 60 s and no drain_period" in short.detail
    assert "drained 30 s after they start" in short.detail
    assert "Set drain_period in [pools.short]" in short.advice
    assert got[("set", "drain")].status == PASS
    assert "drained 10 s before their walltime of 60 s" in got[("set", "drain")].detail
    assert got[("long", "drain")].status == PASS
    assert ("none", "drain") not in got


def test_a_signal_warning_not_shorter_than_the_drain_is_a_warning() -> None:
    """Audit slurmscale F3: `signal_warning = 40` with `drain_period = 15` passed `check`
    with 0 warnings, and Slurm's SIGTERM, 40 s before the walltime, came before the
    drain: the workers left as `walltime` with tasks running (2 tries lost). Now a WARN
    saying what to set; a signal after the drain (or none) gets no line. Without a
    drain_period the default margin is at least the scheduler's walltime_grace (60 s),
    at most half the walltime."""
    from runtime.preflight import check_drain

    pools = pools_from_dicts({
        "run2": {"provider": "slurm", "walltime": "00:02:30", "signal_warning": 40,
                 "drain_period": 15},
        "equal": {"provider": "slurm", "walltime": 600, "signal_warning": 30, "drain_period": 30},
        "fine": {"provider": "slurm", "walltime": 600, "signal_warning": 30, "drain_period": 90},
        "default": {"provider": "slurm", "walltime": 600, "signal_warning": 90},
        "default-fine": {"provider": "slurm", "walltime": 600, "signal_warning": 50},
        "short": {"provider": "slurm", "walltime": 60, "signal_warning": 40},
        "none": {"provider": "slurm", "walltime": 600, "drain_period": 15},
    })  # fmt: skip
    got = {r.pool: r for r in check_drain(pools) if r.check == "signal warning"}
    assert sorted(got) == ["default", "equal", "run2", "short"]
    run2 = got["run2"]
    assert run2.status == WARN
    assert run2.detail.startswith(
        "signal_warning 40 s is not shorter than drain_period 15 s: Slurm's SIGTERM comes 40 s "
        "before the walltime, before the drain (or with it), so its workers leave with their "
        "tasks still running"
    ), run2.detail
    assert run2.advice.startswith(
        "Set drain_period in [pools.run2] to more than signal_warning plus the pool's longest "
        "task (e.g. drain_period = 100 for tasks of up to 60 s), or leave signal_warning out"
    ), run2.advice
    assert "the default drain margin, which may be as short as 60 s" in got["default"].detail
    assert "as short as 30 s" in got["short"].detail  # half the walltime


@pytest.mark.anyio
async def test_the_manager_warns_of_a_signal_warning_before_the_drain_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same WARN among the checks the manager logs as it starts (no Slurm here: its
    commands fail at once, which is a FAIL of its own)."""
    fake_slurm(tmp_path, monkeypatch, "exit 1")
    pools = pools_from_dicts({
        "scav": {"provider": "slurm", "partition": "ckpt", "walltime": 150,
                 "signal_warning": 40, "drain_period": 15},
    })  # fmt: skip
    results = await log_quick_checks(pools, run_dir=tmp_path, limit=20.0)
    (warned,) = [r for r in results if r.check == "signal warning"]
    assert warned.pool == "scav" and warned.status == WARN
    assert "Set drain_period in [pools.scav]" in warned.advice


def test_a_memory_limit_in_thread_execution_is_a_warning_naming_process() -> None:
    """An audit's 800 MiB task finished on a 512 MiB `cpu` worker with only warnings:
    thread execution (the default) cannot kill a task past `memory_per_worker`, and
    `check` said nothing. Now a pool that sets the limit in threads (default or given)
    is a WARN naming `execution = "process"`; one in process execution, or one without
    a limit of its own, gets no line."""
    from runtime.preflight import run_checks

    pools = pools_from_dicts({
        "cpu": {"memory_per_worker": "512MiB"},
        "given": {"memory_per_worker": "1GiB", "execution": "thread"},
        "gpu": {"memory_per_worker": "512MiB", "execution": "process"},
        "share": {},
    })  # fmt: skip
    got = {(r.pool, r.check): r for r in run_checks(pools, probe=False)}
    cpu = got[("cpu", "memory limit")]
    assert cpu.status == WARN, cpu
    assert cpu.detail.startswith(
        "memory_per_worker = 512.0 MiB with thread execution (the default): "
        "the limit is not enforced on a task"
    ), cpu.detail
    assert "a task that grows past it runs on" in cpu.detail
    assert cpu.advice.startswith('Set execution = "process" in [pools.cpu]'), cpu.advice
    assert "TaskOutOfMemory" in cpu.advice
    given = got[("given", "memory limit")]
    assert given.status == WARN and "1.00 GiB with thread execution:" in given.detail, given
    assert ("gpu", "memory limit") not in got
    assert ("share", "memory limit") not in got


def test_bad_worker_keys_are_refused_by_check_with_did_you_mean(tmp_path: Path) -> None:
    """The pool keys that set the workers' flags (``worker_port_range``, ``execution``,
    ...) are checked by ``check --config`` as the manager reads them: a bad value is a
    FAIL naming the key, a misspelt one gets the closest name."""
    config = (
        LOCAL
        + 'worker_port_range = [21010, 21049]\nexecution = "processes"\n'
        + '[pools.other]\nworker_port_rang = "21010-21049"\n'
    )
    done = check(tmp_path, config, "--no-probe", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    details = [r["detail"] for r in json.loads(done.stdout)["results"] if r["status"] == "FAIL"]
    assert any(
        "key 'worker_port_range' must be a string LO-HI" in d
        and 'did you mean worker_port_range = "21010-21049" (a string)?' in d
        for d in details
    ), details
    assert any(
        "key 'worker_port_rang' is unknown; did you mean 'worker_port_range'?" in d for d in details
    ), details
    # The right values pass (execution's typo is the next refusal once the range is right).
    done = check(tmp_path, config.replace("[21010, 21049]", '"21010-21049"'), "--no-probe")
    assert "did you mean 'process'?" in done.stdout, done.stdout
    good = LOCAL + 'worker_port_range = "21010-21049"\nexecution = "process"\ngrace = 30\n'
    done = check(tmp_path, good, "--no-probe")
    assert done.returncode == 0, done.stdout + done.stderr


#: ``nvidia-smi -L`` of a machine with two GPUs, the second split into a MIG device
NVIDIA_SMI_L = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1111aaaa-0000-0000-0000-000000000000)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2222bbbb-0000-0000-0000-000000000000)
  MIG 1g.5gb      Device  0: (UUID: MIG-3333cccc-0000-0000-0000-000000000000)
"""


def _gpu_pool(accelerators: object, provider: str = "local") -> Any:
    return pools_from_dicts(
        {"gpu": {"provider": provider, "max_blocks": 2, "accelerators": accelerators}}
    )["gpu"]


def _nvidia_smi(tmp_path: Path, listing: str, status: int = 0) -> str:
    """A directory holding an ``nvidia-smi`` program that prints ``listing`` for
    ``-L`` (this machine has no GPU: the program stands in for the driver's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "listing").write_text(listing)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\n[ "$1" = -L ] && cat "{bin_dir}/listing"\nexit {status}\n')
    tool.chmod(0o755)
    return str(bin_dir)


def test_a_local_gpu_pool_on_a_machine_without_accelerators_is_warned_of(tmp_path: Path) -> None:
    """``check --config`` said nothing of a local pool's ``accelerators``: a pool pinned
    to GPUs on a machine with none passed. Now: a WARN naming what was looked for."""
    empty = tmp_path / "dev"
    empty.mkdir()
    got = check_accelerators(_gpu_pool(2), path=str(tmp_path), dev=empty, environ={})
    assert got is not None and (got.pool, got.check, got.status) == ("gpu", "accelerators", WARN)
    assert got.detail == (
        f"no accelerator on this machine: no nvidia-smi on PATH, and no {empty}/nvidiaN, "
        f"{empty}/kfd nor {empty}/dri/renderD*, yet accelerators = ['0', '1'] in "
        "[pools.gpu] pins each worker to one"
    )
    assert "`nvidia-smi -L` lists them" in got.advice
    (empty / "kfd").touch()  # a ROCm machine: its devices are there
    got = check_accelerators(_gpu_pool(2), path=str(tmp_path), dev=empty, environ={})
    assert got is not None and got.status == PASS, got
    # Neither a pool without accelerators nor a Slurm pool (its nodes are elsewhere).
    assert check_accelerators(_gpu_pool(None), path=str(tmp_path), dev=empty) is None
    slurm = _gpu_pool(2, "slurm")
    assert check_accelerators(slurm, path=str(tmp_path), dev=empty) is None


def test_a_local_gpu_pool_s_ids_are_those_nvidia_smi_lists(tmp_path: Path) -> None:
    path = _nvidia_smi(tmp_path, NVIDIA_SMI_L)
    mig = "MIG-3333cccc-0000-0000-0000-000000000000"
    for ids in (2, ["1", "0"], [mig, "GPU-1111aaaa-0000-0000-0000-000000000000"]):
        got = check_accelerators(_gpu_pool(ids), path=path, environ={})
        assert got is not None and got.status == PASS, got
    got = check_accelerators(_gpu_pool(4), path=path, environ={})
    assert got is not None and got.status == FAIL, got
    assert got.detail.startswith(
        "accelerators = ['0', '1', '2', '3'] in [pools.gpu], but `nvidia-smi -L` lists no "
        "['2', '3'] on this machine (exit status 0; it said: GPU 0: NVIDIA A100-SXM4-40GB"
    ), got.detail
    assert "List the indices (0, 1, ...) or UUIDs `nvidia-smi -L` shows" in got.advice
    # This process limited to GPU 1 (a Slurm allocation's CUDA_VISIBLE_DEVICES): a
    # worker pinned to 0 would take a GPU it was not given.
    got = check_accelerators(_gpu_pool(2), path=path, environ={"CUDA_VISIBLE_DEVICES": "1"})
    assert got is not None and got.status == WARN, got
    assert "CUDA_VISIBLE_DEVICES=1" in got.detail and "(['0'])" in got.detail, got.detail


def test_a_failing_nvidia_smi_fails_the_check_with_what_it_said(tmp_path: Path) -> None:
    path = _nvidia_smi(
        tmp_path,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        status=9,
    )
    got = check_accelerators(_gpu_pool(2), path=path, environ={})
    assert got is not None and got.status == FAIL, got
    assert "exit status 9" in got.detail and "couldn't communicate" in got.detail, got.detail


@pytest.mark.parametrize(
    ("run_mode", "pool_mode", "refused"),
    [
        (0o777, None, True),  # others may rename the pool's away and put theirs in its place
        (0o755, 0o770, True),  # others may write in the pool's
        (0o1777, None, False),  # a sticky one (as /tmp): nobody else renames in it
        (0o755, 0o700, False),
    ],
)
def test_check_warns_of_a_run_dir_the_manager_would_refuse(
    tmp_path: Path, run_mode: int, pool_mode: int | None, refused: bool
) -> None:
    """check and the manager agree on the Slurm run directory: where the manager refuses
    a pool's (``<--run-dir>/<pool>``: PermissionError before any sbatch,
    actors.slurm.private_run_dir), check WARNs with the same reason and what to do;
    where the manager takes it, check passes. The check changes nothing (a missing
    directory stays missing)."""
    slurm = pools_from_dicts({"hpc": {"provider": "slurm", "partition": "x"}})
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(run_mode)
    if pool_mode is not None:
        (run / "hpc").mkdir()
        (run / "hpc").chmod(pool_mode)
    (result,) = [r for r in check_directories(slurm, run_dir=run) if r.check == "run directory"]
    assert (run / "hpc").exists() == (pool_mode is not None)  # nothing made
    if not refused:
        assert result.status == PASS, result
        private_run_dir(run / "hpc")  # the manager takes it
        return
    with pytest.raises(PermissionError) as manager_said:
        private_run_dir(run / "hpc")
    why = str(manager_said.value).partition(". Run the manager")[0]
    assert result.status == WARN, result
    assert result.detail == f"the manager would refuse pool hpc's: {why}", result
    assert "--run-dir DIR" in result.advice and "chmod go-w" in result.advice, result
