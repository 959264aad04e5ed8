"""A manager's configuration as it runs, from a file, flags and the environment only (a
user audit of configuration, findings 1 to 3):

- a ``[scheduler]`` table sets the scheduler's settings of a manager process, checked
  like the other tables (an unknown key with the closest one, a wrong type, the file
  named); before, only three of them had flags and the rest needed Python;
- a pool's ``memory_options`` table sets its workers' memory fences (``--memory-options``
  on each worker's command line, local and Slurm), checked as the worker checks them;
  before, ``spill`` or ``memory_options`` in a pool was an unknown key whose
  did-you-mean pointed elsewhere;
- the manager says the settings it runs with, and where each came from: one
  ``configuration`` line at info as it starts, ``status()["config"]`` and the console's
  ``config``; never a token.

The loaders and the rows are pure functions, asserted exactly; one real manager process
(127.0.0.1, ports 57000-57499) is read through its log, the console and its status.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import psutil
import pytest
from rich.console import Console

from actors.pools import load_scheduler, pools_from_dicts, scheduler_settings
from actors.scheduler_records import SchedulerConfig
from runtime.console import ConsoleClient, render_config, render_status
from runtime.errors import PoolConfigError, Refusals, SchedulerConfigError
from runtime.monitor import alerting_config
from runtime.node import pool_worker_argv
from runtime.settings import file_sources, manager_settings, setting_fields
from tests.helpers import ROOT, Cli, free_port_between, wait_until

SEE_SCHEDULER = " See docs/configuration.md#scheduler."
SEE_POOLS = " See docs/configuration.md#pools for every key."


# ----------------------------------------------------------------------------- [scheduler]


def test_the_scheduler_table_gives_typed_settings() -> None:
    table = {
        "stall_timeout": 30, "takeback_after": float("inf"), "unknown_long": False,
        "checkpoint_bytes": "2GiB", "prune_depth": 0, "saturation": 1.5,
        "policy_slow_turns": 4,
    }  # fmt: skip
    settings = scheduler_settings(table, "c.toml")
    assert settings == {**table, "checkpoint_bytes": 2 * 2**30}
    config = SchedulerConfig(**settings)  # what the manager's scheduler is made with
    assert (config.stall_timeout, config.checkpoint_bytes) == (30, 2 * 2**30)


def test_every_refused_scheduler_key_says_the_file_the_key_and_what_to_write() -> None:
    refuse = Refusals(keep=True)
    table = {
        "stall_timout": 30, "stall_timeout": "30", "max_per_core": 2.0, "saturation": 0,
        "unknown_long": "yes", "monitor": True, "drain_periods": {}, "long_task": -1,
        "checkpoint_bytes": "lots", "policy_budget": 5,
    }  # fmt: skip
    assert scheduler_settings(table, "c.toml", refuse) == {"policy_budget": 5}
    where = "[scheduler] in c.toml: key"
    assert [str(e) for e in refuse.errors] == [
        f"{where} 'stall_timout' is unknown; did you mean 'stall_timeout'? The keys are: "
        "saturation, backlog, max_per_core, long_task, unknown_long, unknown_duration, "
        "takeback_after, unreachable_for, stall_timeout, drain_period, walltime_grace, "
        "unknown_output, prune_depth, checkpoint_bytes, checkpoint_inline_bytes, "
        "policy_budget, policy_slow_turns, policy_slow_window, policy_too_slow, "
        f"story_length, feed_length, submit_max_priority.{SEE_SCHEDULER}",
        f"{where} 'stall_timeout' must be seconds > 0, got '30'; did you mean "
        f"stall_timeout = 30.0 (a number, not a string)?{SEE_SCHEDULER}",
        f"{where} 'max_per_core' must be a whole number >= 1, got 2.0; did you mean "
        f"max_per_core = 2?{SEE_SCHEDULER}",
        f"{where} 'saturation' must be a number > 0, got 0.{SEE_SCHEDULER}",
        f"{where} 'unknown_long' must be true or false, got 'yes'.{SEE_SCHEDULER}",
        f"{where} 'monitor' is set by the manager: on with its monitoring database "
        f"(--monitoring, the default), off with --no-monitoring.{SEE_SCHEDULER}",
        f"{where} 'drain_periods' is set per pool: drain_period in [pools.NAME].{SEE_SCHEDULER}",
        f"{where} 'long_task' must be seconds >= 0 (inf: none by its duration), got -1."
        f"{SEE_SCHEDULER}",
        f"{where} 'checkpoint_bytes' must be bytes as a whole number >= 0 or a size such as "
        "'4GiB' or '500MB' (units b, kb, mb, gb, tb, kib, mib, gib, tib); 0: none, got "
        f"'lots'.{SEE_SCHEDULER}",
    ]
    assert all(isinstance(e, SchedulerConfigError) for e in refuse.errors)


def test_a_file_s_scheduler_table_is_read_and_the_first_refusal_raised(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[scheduler]\nstall_timeout = 60\nunreachable_for = "inf"\n')
    with pytest.raises(SchedulerConfigError) as info:
        load_scheduler(good)
    assert str(info.value) == (
        f"[scheduler] in {good}: key 'unreachable_for' must be seconds >= 0 (inf: never), "
        f"got 'inf'; did you mean unreachable_for = inf (a number, not a string)?{SEE_SCHEDULER}"
    )
    good.write_text("[scheduler]\nstall_timeout = 60\nunreachable_for = inf\n")
    assert load_scheduler(good) == {"stall_timeout": 60, "unreachable_for": float("inf")}
    none = tmp_path / "none.toml"
    none.write_text("[pools.cpu]\nmax_blocks = 2\n")
    assert load_scheduler(none) == {}


def test_check_reports_each_refused_scheduler_key(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[scheduler]\nstall_timout = 30\ntakeback_after = "10"\n')
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "check", "--config", str(config), "--no-probe",
         "--json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=dict(os.environ, CORRAL_HOME=str(tmp_path / "home")),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    fails = [r["detail"] for r in json.loads(done.stdout)["results"] if r["status"] == "FAIL"]
    assert len(fails) == 2, fails
    assert "key 'stall_timout' is unknown; did you mean 'stall_timeout'?" in fails[0]
    assert "did you mean takeback_after = 10.0 (a number, not a string)?" in fails[1]


# ----------------------------------------------------------------------------- memory_options


def test_a_pools_memory_options_are_its_workers_fences() -> None:
    pools = pools_from_dicts({
        "cpu": {"memory_per_worker": "1GiB",
                "memory_options": {"spill": "off", "throttle": 0.5, "terminate": 0.8,
                                   "disk_limit": "2GiB"}},
        "plain": {},
    })  # fmt: skip
    assert pools["cpu"].memory_options == {
        "spill": None,
        "throttle": 0.5,
        "terminate": 0.8,
        "disk_limit": 2 * 2**30,
    }
    assert pools["plain"].memory_options == {}


@pytest.mark.parametrize(
    ("options", "key", "problem"),
    [
        ({"spil": 0.5}, "memory_options.spil",
         "is unknown; did you mean 'memory_options.spill'? The names are: spill, throttle, "
         "terminate, first_delay, growth, max_delay, hysteresis, interval, disk_limit, exit (the "
         "worker's --memory-options, docs/configuration.md#memory)"),
        ({"execution": "process"}, "memory_options.execution",
         "is a pool key of its own: write execution = 'process' in the pool's table, beside "
         "memory_options"),
        ({"spill": 0.8}, "memory_options",
         "is refused: spill (0.8) is above throttle (0.7): spilling comes before throttling "
         "(docs/memory.md), or a worker throttles with outputs it could have moved to disk. "
         "Lower spill to at most 0.7, raise throttle, or turn spilling off (None; 'off' on "
         "the command line)"),
        ({"throttle": "0.5"}, "memory_options",
         "is refused: throttle must be a number; got '0.5' (str)"),
        (0.5, "memory_options",
         "must be a table of the workers' memory settings, e.g. memory_options = {spill = "
         "0.5, throttle = 0.6, terminate = 0.9}, got 0.5"),
    ],
)  # fmt: skip
def test_a_refused_memory_option_names_the_file_the_pool_and_the_key(
    options: object, key: str, problem: str
) -> None:
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts({"cpu": {"memory_options": options}}, source="c.toml")
    end = "" if problem.endswith((".", "?")) else "."
    assert str(info.value) == f"pool 'cpu' in c.toml: key {key!r} {problem}{end}{SEE_POOLS}"


def test_a_fence_written_as_a_pool_key_points_at_memory_options() -> None:
    for key, meant in (("spill", "spill"), ("spil", "spill"), ("terminate", "terminate")):
        with pytest.raises(PoolConfigError) as info:
            pools_from_dicts({"cpu": {key: 0.5}}, source="c.toml")
        assert str(info.value).startswith(
            f"pool 'cpu' in c.toml: key {key!r} is unknown; did you mean memory_options = "
            f"{{{meant} = 0.5}} (the workers' memory settings)? The keys are: provider, "
        )
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts({"cpu": {"memory_option": {"spill": 0.5}}})
    assert "did you mean 'memory_options'?" in str(info.value)
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts({"cpu": {"spill_dirs": "/tmp"}})
    assert "did you mean 'spill_dir'?" in str(info.value)


@pytest.mark.parametrize("provider", ["local", "slurm"])
def test_each_worker_a_pool_starts_gets_its_memory_options(provider: str) -> None:
    pool = pools_from_dicts(
        {"cpu": {"provider": provider, "memory_options": {"throttle": 0.5, "spill": "off"}}}
    )["cpu"]
    argv = pool_worker_argv(pool, {"interval": 0.02, "throttle": 0.6}, 1, "ws://m:1", "b", 0)
    options = json.loads(argv[argv.index("--memory-options") + 1])
    assert options == {"interval": 0.02, "throttle": 0.5, "spill": None}  # the pool's win
    assert argv.count("--memory-options") == 1


# ----------------------------------------------------------------------------- the rows


def test_the_rows_say_each_setting_after_the_defaults_and_where_it_came_from(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        "[scheduler]\nstall_timeout = 30\n"
        '[pools.cpu]\nprovider = "slurm"\nmax_blocks = 3\n'
        'worker_init = "export API_TOKEN=hush\\nmodule load hdf5"\n'
        "memory_options = {throttle = 0.65}\n"
        '[alerting]\nalertmanager = "http://ops:pw@am:9093"\n'
        'dashboard_url = "http://dash/?token=hush2"\n'
        '[policies]\npriority = "long-first"\n'
    )
    pools = pools_from_dicts(
        {"cpu": {"provider": "slurm", "max_blocks": 3, "memory_options": {"throttle": 0.65},
                 "worker_init": "export API_TOKEN=hush\nmodule load hdf5"}}
    )  # fmt: skip
    alerting = alerting_config(
        {"alertmanager": "http://ops:pw@am:9093", "dashboard_url": "http://dash/?token=hush2"}
    )
    rows = manager_settings(
        manager=[("config", str(config)), ("worker_timeout", 10.0)],
        pools=pools,
        scheduler=SchedulerConfig(stall_timeout=30, long_task=3.0),
        alerting=alerting,
        policies={"priority": ("long-first", {}), "retry": ("default", {"max_lost": 2})},
        sources={**file_sources(config), "scheduler.long_task": "flag --long-task",
                 "manager.config": "flag --config"},
    )  # fmt: skip
    by = {(r.section, r.key): (r.value, r.source) for r in rows}
    assert by[("manager", "config")] == (str(config), "flag --config")
    assert by[("manager", "worker_timeout")] == ("10", "default")
    assert by[("scheduler", "stall_timeout")] == ("30", "file")
    assert by[("scheduler", "long_task")] == ("3", "flag --long-task")
    assert by[("scheduler", "checkpoint_bytes")] == ("1GiB", "default")
    assert by[("pools.cpu", "max_blocks")] == ("3", "file")
    assert by[("pools.cpu", "min_blocks")] == ("0", "default")
    assert by[("pools.cpu", "worker_host")] == ("{host}", "default")
    assert by[("pools.cpu", "memory_options.throttle")] == ("0.65", "file")
    assert by[("pools.cpu", "memory_options.spill")] == ("0.6", "default")
    assert by[("pools.cpu", "memory_options.terminate")] == ("0.95", "default")
    assert by[("pools.cpu", "worker_init")] == ("export API_TOKEN=***; module load hdf5", "file")
    assert ("pools.cpu", "provision_delay") not in by  # a local key: not a Slurm pool's
    assert by[("alerting", "alertmanager")] == ("http://ops:***@am:9093", "file")
    assert by[("alerting", "dashboard_url")] == ("http://dash/?token=%2A%2A%2A", "file")
    assert by[("policies", "priority")] == ("long-first", "file")
    assert by[("policies", "retry")] == ("default (max_lost=2)", "default")
    assert by[("policies", "placement")] == ("locality", "default")
    assert not any("hush" in r.value or "pw@" in r.value for r in rows)
    fields = setting_fields(rows)
    assert fields["scheduler"]["stall_timeout"] == "30 (file)"
    assert fields["pools"]["cpu"]["max_blocks"] == "3 (file)"
    assert fields["manager"]["worker_timeout"] == "10"


def test_a_token_as_a_url_s_user_or_an_option_s_value_is_masked() -> None:
    """Review 1206e: the configuration in force still showed a token as a URL's user part
    (``https://TOKEN@host``) and as the value of ``--password X`` / ``--token X`` in a
    Slurm pool's ``worker_init``. Each is ``***``; names and options that are not
    secrets, and an option followed by another option, are shown as they are."""
    init = (
        "pip install git+https://ghp_hush1@github.com/org/lib.git\n"
        "mytool --password hush2 --token 'hush 3' --verbose --api-key=hush4 -n 2\n"
        "login --token --verbose\n"
        "curl https://ops:hush5@files.example/x -o out"
    )
    pools = pools_from_dicts({"hpc": {"provider": "slurm", "worker_init": init}})
    alerting = alerting_config({"alertmanager": "https://hush6@am.example:9093/"})
    rows = manager_settings(
        manager=[], pools=pools, scheduler=SchedulerConfig(), alerting=alerting,
        policies={}, sources={},
    )  # fmt: skip
    by = {(r.section, r.key): r.value for r in rows}
    assert by[("pools.hpc", "worker_init")] == (
        "pip install git+https://***@github.com/org/lib.git; "
        "mytool --password *** --token *** --verbose --api-key=*** -n 2; "
        "login --token --verbose; "
        "curl https://ops:***@files.example/x -o out"
    )
    assert by[("alerting", "alertmanager")] == "https://***@am.example:9093/"
    assert not any("hush" in r.value for r in rows)


def test_a_slurm_pool_without_worker_init_has_a_row_of_none() -> None:
    # (a manager with such a pool stopped at start: masked_shell(None), CI's Slurm tests)
    pools = pools_from_dicts({"hpc": {"provider": "slurm", "max_blocks": 2}})
    rows = manager_settings(
        manager=[], pools=pools, scheduler=SchedulerConfig(), alerting=None, policies={},
        sources={},
    )  # fmt: skip
    by = {(r.section, r.key): (r.value, r.source) for r in rows}
    assert by[("pools.hpc", "worker_init")][1] == "default"
    assert by[("pools.hpc", "max_blocks")] == ("2", "default")


def test_the_console_shows_the_rows_and_the_status_says_how_many_are_set() -> None:
    config = {
        "manager": {"config": {"value": "c.toml", "source": "flag --config"}},
        "scheduler": {
            "stall_timeout": {"value": "30", "source": "file"},
            "saturation": {"value": "2", "source": "default"},
        },
    }
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(render_config(config))
    lines = [" ".join(line.strip("│ ").split()) for line in out.getvalue().splitlines()]
    assert "scheduler │ stall_timeout │ 30 │ file" in lines
    assert "manager │ config │ c.toml │ flag --config" in lines
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_status({"config": config}))
    assert (
        "configuration: file c.toml; 2 of 3 settings not at their default (`config` shows "
        "them all, and where each came from)"
    ) in out.getvalue()
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_status({"config": {}}))
    assert "configuration:" not in out.getvalue()  # an embedded cluster: none


# ----------------------------------------------------------------------------- a manager

CONFIG = """
[scheduler]
stall_timeout = 30
takeback_after = inf
checkpoint_bytes = "2GiB"

[pools.cpu]
min_blocks = 1
max_blocks = 1
memory_per_worker = "512MiB"
worker_port_range = "{ports}"
memory_options = {{ spill = 0.4, throttle = 0.5, terminate = "off" }}

[alerting]
alertmanager = "http://ops:hush@127.0.0.1:9"
"""


async def worker_argv_of(manager: int) -> list[str]:
    """The command line of the first worker process the manager ``manager`` started
    (bounded wait: its pool starts it as the manager starts)."""
    found: list[list[str]] = []

    def started() -> bool:
        for child in psutil.Process(manager).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "worker" in (argv := child.cmdline()):
                    found.append(argv)
        return bool(found)

    await wait_until(started, "the pool's worker process started", limit=30, step=0.1)
    return found[0]


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_manager_says_the_configuration_it_runs_with(tmp_path: Path) -> None:
    port = free_port_between(57000, 57399)
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG.format(ports="57400-57499"))
    with Cli(tmp_path / "home") as cli, anyio.fail_after(60):
        manager = cli.start(
            "--log-level", "info", "manager", "--listen", f"127.0.0.1:{port}",
            "--no-monitoring", "--config", str(config), "--long-task", "3",
        )  # fmt: skip
        seen: list[str] = []
        logged = cli.line_with(manager, "event='configuration'", seen=seen)
        cli.line_with(manager, "manager listening on", seen=seen)
        address = f"ws://127.0.0.1:{port}"
        assert "'stall_timeout': '30 (file)'" in logged
        assert "'long_task': '3 (flag --long-task)'" in logged
        assert "'throttle': '0.5 (file)'" not in logged  # (a pool's: under its name)
        assert "'memory_options.throttle': '0.5 (file)'" in logged
        tokens = cli.tokens(address)
        async with ConsoleClient(address, read_only=True) as console:
            shown = json.loads(await console.run_command("config --json"))
            status = await console.status(categories=1)
            text = await console.run_command("config pools.cpu")
        assert status["config"] == shown
        assert shown["scheduler"]["stall_timeout"] == {"value": "30", "source": "file"}
        assert shown["scheduler"]["takeback_after"] == {"value": "inf", "source": "file"}
        assert shown["scheduler"]["long_task"] == {"value": "3", "source": "flag --long-task"}
        assert shown["scheduler"]["saturation"] == {"value": "2", "source": "default"}
        assert shown["manager"]["config"] == {"value": str(config), "source": "flag --config"}
        assert shown["manager"]["monitoring"] == {"value": "off", "source": "flag --no-monitoring"}
        cpu = shown["pools.cpu"]
        assert cpu["memory_options.throttle"] == {"value": "0.5", "source": "file"}
        assert cpu["memory_options.terminate"] == {"value": "none", "source": "file"}
        assert cpu["max_idletime"] == {"value": "120", "source": "default"}
        assert shown["alerting"]["alertmanager"]["value"] == "http://ops:***@127.0.0.1:9"
        # the worker process the pool started has the pool's fences on its command line
        argv = await worker_argv_of(manager.pid)
        options = json.loads(argv[argv.index("--memory-options") + 1])
        assert options == {"spill": 0.4, "throttle": 0.5, "terminate": None}
        assert "memory_options.throttle" in text and "pools.cpu" in text
        assert "scheduler" not in text
        everything = json.dumps(shown) + logged
        assert not any(token in everything for token in tokens.values())
        assert "hush" not in everything
        cli.stop([manager])
