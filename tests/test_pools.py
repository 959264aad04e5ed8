"""Pools configured as data (actors/pools.py): the TOML file and the dicts of
``Cluster(pools=...)`` give the same checked pools; every refusal is a
:class:`PoolConfigError` naming the pool and the key (a typo gets the closest known
name), made before anything starts. Also: what a pool turns into (block shape, limits,
the default policies of a cluster with pools), and ``Cluster(pools=...)`` running a
graph on in-process workers of two pools.
"""

from __future__ import annotations

import operator
import re
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.pools import PoolConfig, load_config, pools_from_dicts
from actors.providers import BlockSpec
from policies.scaling import PoolLimits
from runtime import Cluster
from runtime.errors import GraphError, PoolConfigError
from runtime.messages import StatusRequest
from runtime.node import pool_drain_periods, pool_policies, pool_targets
from tests.helpers import log_lines, status_text, wait_until

EXAMPLE = """
[pools.ckpt]
provider = "slurm"
partition = "ckpt"
account = "astro"
qos = "low"
exclusive = true
min_blocks = 0
init_blocks = 1
max_blocks = 20
nodes_per_block = 2
workers_per_node = 4
cores_per_worker = 2
memory_per_worker = "8GiB"
parallelism = 0.5
walltime = "01:00:00"
drain_period = 300
max_idletime = 60
worker_init = "source ~/venvs/corral/bin/activate"
scheduler_options = "#SBATCH --constraint=haswell"
fallback = "owner"

[pools.owner]
provider = "slurm"
partition = "owner"
min_blocks = 2
max_blocks = 2

[pools.local]
workers_per_node = 2
"""


def refused(pools: Any) -> PoolConfigError:
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts(pools)
    return info.value


def test_the_documented_example_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text(EXAMPLE)
    pools = load_config(path)
    assert list(pools) == ["ckpt", "owner", "local"]
    assert pools["ckpt"] == PoolConfig(
        name="ckpt", provider="slurm", min_blocks=0, max_blocks=20, init_blocks=1,
        nodes_per_block=2, workers_per_node=4, cores_per_worker=2,
        memory_per_worker=8 * 2**30, parallelism=0.5, walltime=3600.0, drain_period=300.0,
        max_idletime=60.0, fallback="owner", partition="ckpt", account="astro", qos="low",
        exclusive=True, worker_init="source ~/venvs/corral/bin/activate",
        scheduler_options="#SBATCH --constraint=haswell",
    )  # fmt: skip
    # min_blocks 2 and nothing else: init and max follow it.
    owner = pools["owner"]
    assert (owner.min_blocks, owner.init_blocks, owner.max_blocks) == (2, 2, 2)
    # Every default.
    assert pools["local"] == PoolConfig(name="local", workers_per_node=2)
    assert pools_from_dicts({"a": {}}) == {"a": PoolConfig("a")}
    assert PoolConfig("a").max_idletime == 120.0 and PoolConfig("a").init_blocks == 1


def test_a_pool_is_a_block_shape_and_limits() -> None:
    ckpt = pools_from_dicts(
        {"ckpt": {"provider": "slurm", "nodes_per_block": 2, "workers_per_node": 3,
                  "cores_per_worker": 4, "memory_per_worker": 2**30, "max_blocks": 5,
                  "parallelism": 0.25, "max_idletime": "00:01:30"}}
    )["ckpt"]  # fmt: skip
    assert ckpt.block_spec() == BlockSpec(6, 4, 2**30, 0, "ckpt")
    assert ckpt.limits() == PoolLimits(0, 5, 1, 0.25, 24, 90.0)


def test_a_cluster_with_pools_gets_demand_scaling_and_the_fallback_in_retry() -> None:
    pools = pools_from_dicts(
        {"ckpt": {"fallback": "owner", "drain_period": 30}, "owner": {"drain_period": 90},
         "spare": {}}
    )  # fmt: skip
    assert pool_policies(pools, None) == {
        "scaling": ("demand", {}),
        "retry": ("default", {"fallback": {"ckpt": "owner"}}),
    }
    # The user's own choices stand; their retry parameters are kept.
    mine = {"retry": ("default", {"max_lost": 2}), "scaling": ("fixed", {})}
    assert pool_policies(pools, mine) == {
        "scaling": ("fixed", {}),
        "retry": ("default", {"max_lost": 2, "fallback": {"ckpt": "owner"}}),
    }
    assert pool_policies(pools, {"retry": ("never", {})})["retry"] == ("never", {})
    # Each pool's workers drain by its own drain_period (not the largest of them all).
    assert pool_drain_periods(pools) == {"ckpt": 30.0, "owner": 90.0}
    assert pool_drain_periods(pools_from_dicts({"a": {}})) == {}
    # The autoscaler starts with min_blocks as the floor and the limits.
    targets = pool_targets(pools)
    assert (targets["ckpt"].n, targets["ckpt"].limits) == (0, pools["ckpt"].limits())


def test_provisioning_timeout_is_off_by_default_and_reaches_the_limits() -> None:
    assert PoolConfig("a").limits().provisioning_timeout is None
    pools = pools_from_dicts({"cloud": {"provisioning_timeout": "00:10:00"}, "hpc": {}})
    assert pools["cloud"].limits().provisioning_timeout == 600.0
    assert pools["hpc"].limits().provisioning_timeout is None


def test_lost_grace_is_a_pool_key_that_reaches_the_limits(tmp_path: Path) -> None:
    # Before, the autoscaler's lost_grace (60 s) could not be set from a configuration.
    assert PoolConfig("a").limits().lost_grace == 60.0
    pools = pools_from_dicts(
        {"hpc": {"lost_grace": "05:00"}, "cloud": {"lost_grace": 20}, "own": {"lost_grace": "off"},
         "plain": {}}
    )  # fmt: skip
    grace = {name: p.limits().lost_grace for name, p in pools.items()}
    assert grace == {"hpc": 300.0, "cloud": 20.0, "own": None, "plain": 60.0}
    path = tmp_path / "corral.toml"
    path.write_text("[pools.hpc]\nlost_grace = 0\n")
    with pytest.raises(PoolConfigError) as info:
        load_config(path)
    assert (info.value.pool, info.value.key) == ("hpc", "lost_grace")
    assert "must be more than 0" in str(info.value) and '"off"' in str(info.value)


# ----------------------------------------------------------------------------- refusals


def test_a_misspelt_key_is_refused_with_the_closest_name() -> None:
    err = refused({"ckpt": {"max_block": 3}})
    assert (err.pool, err.key) == ("ckpt", "max_block")
    assert "did you mean 'max_blocks'?" in str(err)
    assert "pool 'ckpt'" in str(err) and "'max_block'" in str(err)
    # Parsl's own spelling of a key Corral names differently.
    err = refused({"ckpt": {"max_workers_per_node": 3}})
    assert "did you mean 'workers_per_node'?" in str(err)
    # Nothing close: the known keys are listed instead.
    err = refused({"ckpt": {"colour": "blue"}})
    assert "did you mean" not in str(err) and "The keys are: provider, min_blocks" in str(err)


@pytest.mark.parametrize(
    ("settings", "key", "says"),
    [
        ({"provider": "slrum"}, "provider", "did you mean 'slurm'?"),
        ({"provider": "pbs"}, "provider", "must be one of 'local', 'slurm'"),
        ({"min_blocks": -1}, "min_blocks", "whole number >= 0"),
        ({"max_blocks": 0}, "max_blocks", "whole number >= 1"),
        ({"max_blocks": 2.5}, "max_blocks", "whole number"),
        ({"init_blocks": True}, "init_blocks", "whole number"),
        ({"min_blocks": 3, "max_blocks": 2}, "min_blocks", "more than max_blocks (2)"),
        ({"init_blocks": 3, "max_blocks": 2}, "init_blocks", "from min_blocks (0) to max_blocks"),
        ({"min_blocks": 2, "init_blocks": 1, "max_blocks": 4}, "init_blocks", "from min_blocks"),
        ({"workers_per_node": 0}, "workers_per_node", ">= 1"),
        ({"cores_per_worker": "2"}, "cores_per_worker", "whole number"),
        ({"nodes_per_block": 2}, "nodes_per_block", "a local block is this machine"),
        ({"memory_per_worker": "lots"}, "memory_per_worker", "'4GiB'"),
        ({"memory_per_worker": -5}, "memory_per_worker", "whole number >= 0"),
        # A size without its unit was taken as bytes: every producer stalled.
        (
            {"memory_per_worker": 512},
            "memory_per_worker",
            "= 512 is 512 bytes; did you mean 512MiB?",
        ),
        ({"memory_per_worker": "2"}, "memory_per_worker", "= '2' is 2 bytes; did you mean 2GiB?"),
        ({"parallelism": 1.5}, "parallelism", "from 0 to 1"),
        ({"parallelism": "all"}, "parallelism", "from 0 to 1"),
        ({"walltime": "1h"}, "walltime", "'HH:MM:SS'"),
        ({"walltime": 0}, "walltime", "more than 0"),
        ({"max_idletime": -3}, "max_idletime", "seconds"),
        ({"provisioning_timeout": 0}, "provisioning_timeout", "more than 0"),
        ({"provisioning_timeout": "10m"}, "provisioning_timeout", "'HH:MM:SS'"),
        ({"lost_grace": 0}, "lost_grace", "more than 0"),
        # a negative one: what 0 gets too (before: "must be >= 0", then 0 refused)
        ({"lost_grace": -5}, "lost_grace", 'more than 0 (seconds, or a Slurm time; "off": never)'),
        ({"provisioning_timeout": -1}, "provisioning_timeout", "more than 0 (seconds, or a Slurm"),
        ({"lost_grace": "1m"}, "lost_grace", "'HH:MM:SS'"),
        ({"lost_grace": "never"}, "lost_grace", 'must be "off" (never) or seconds'),
        ({"drain_period": 600, "walltime": "00:05:00"}, "drain_period", "shorter than walltime"),
        ({"fallback": 3}, "fallback", "must be a string"),
        ({"partition": "ckpt"}, "partition", "only for provider 'slurm'"),
        ({"exclusive": True}, "exclusive", "only for provider 'slurm'"),
        ({"provider": "slurm", "exclusive": "yes"}, "exclusive", "true or false"),
        ({"provider": "slurm", "qos": 1}, "qos", "must be a string"),
        # sbatch reads only #SBATCH lines: anything else would run as a command instead.
        (
            {"provider": "slurm", "scheduler_options": "--exclusive"},
            "scheduler_options",
            "must be '#SBATCH ...' directives (or '#' comments), one a line: line 1, "
            "'--exclusive', is not, and sbatch would not apply it: write '#SBATCH --exclusive'",
        ),
        (
            {"provider": "slurm", "scheduler_options": "#SBATCH --x=1\n#sbatch --exclusive"},
            "scheduler_options",
            "line 2, '#sbatch --exclusive', is not",
        ),
        (
            {"provider": "slurm", "scheduler_options": "module load gcc"},
            "scheduler_options",
            "put shell commands in worker_init",
        ),
        # The worker processes' flags (the Slurm audit: a firewalled site's ports).
        ({"worker_port_range": "21049-21010"}, "worker_port_range", "LO <= HI"),
        ({"worker_port_range": "0-9"}, "worker_port_range", "ports from 1 to 65535"),
        ({"worker_port_range": "a-b"}, "worker_port_range", "e.g. 9000-9009, got 'a-b'"),
        (
            {"worker_port_range": [21010, 21049]},
            "worker_port_range",
            'did you mean worker_port_range = "21010-21049" (a string)?',
        ),
        (
            {"worker_port_range": 9100},
            "worker_port_range",
            'did you mean worker_port_range = "9100-9100" (a string)?',
        ),
        ({"worker_host": ""}, "worker_host", "non-empty string"),
        ({"worker_host": "a b"}, "worker_host", "one host name or address"),
        ({"worker_host": 127}, "worker_host", "must be a string"),
        ({"worker_host": "{host}"}, "worker_host", "only for provider 'slurm'"),
        ({"grace": -1}, "grace", "must be >= 0 (seconds, or a Slurm time), got -1"),
        ({"grace": "5s"}, "grace", "must be seconds"),
        ({"execution": "processes"}, "execution", "did you mean 'process'?"),
        ({"execution": "fork"}, "execution", "must be 'thread' or 'process', got 'fork'"),
        ({"spill_dir": ""}, "spill_dir", "non-empty string"),
        ({"spill_dir": "~/spill"}, "spill_dir", "no shell expansion"),
        ({"spill_dir": "$TMPDIR/spill"}, "spill_dir", "no shell expansion"),
        ({"signal_warning": 60}, "signal_warning", "only for provider 'slurm'"),
        ({"provider": "slurm", "signal_warning": 1.5}, "signal_warning", "whole seconds"),
        ({"provider": "slurm", "signal_warning": 70000}, "signal_warning", "0 to 65535"),
        ({"provider": "slurm", "signal_warning": "soon"}, "signal_warning", "must be seconds"),
        (
            {"provider": "slurm", "signal_warning": 600, "walltime": "00:05:00"},
            "signal_warning",
            "shorter than walltime (300 s)",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(
    settings: dict[str, Any], key: str, says: str
) -> None:
    err = refused({"ckpt": settings, "owner": {}})
    assert (err.pool, err.key) == ("ckpt", key)
    assert says in str(err) and f"key {key!r}" in str(err)
    assert isinstance(err, ValueError)  # where a ValueError is caught, so is this


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("min_blocks", "0", "got '0'; did you mean min_blocks = 0 (a number, not a string)?"),
        ("max_blocks", "2", "got '2'; did you mean max_blocks = 2 (a number, not a string)?"),
        ("init_blocks", "1", "did you mean init_blocks = 1 (a number, not a string)?"),
        ("spare_blocks", "1", "did you mean spare_blocks = 1 (a number, not a string)?"),
        ("nodes_per_block", "1", "did you mean nodes_per_block = 1 (a number, not a string)?"),
        ("workers_per_node", "4", "did you mean workers_per_node = 4 (a number, not a string)?"),
        ("cores_per_worker", 2.0, "got 2.0; did you mean cores_per_worker = 2?"),
        ("tasks_per_worker", "1", "did you mean tasks_per_worker = 1 (a number, not a string)?"),
        ("parallelism", "0.5", "did you mean parallelism = 0.5 (a number, not a string)?"),
    ],
)
def test_a_number_written_as_text_gets_the_number_it_meant(key: str, value: Any, says: str) -> None:
    # Every numeric pool key says it alike (one helper), not only tasks_per_worker.
    err = refused({"ckpt": {"max_blocks": 4, key: value}})
    assert (err.pool, err.key) == ("ckpt", key)
    assert says in str(err), str(err)


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_blocks", "0"), ("min_blocks", "x"), ("parallelism", "2"), ("cores_per_worker", 1.5)],
)
def test_a_value_that_would_not_fit_gets_no_did_you_mean(key: str, value: Any) -> None:
    err = refused({"ckpt": {key: value}})
    assert err.key == key and "did you mean" not in str(err), str(err)


def test_cross_references_are_checked() -> None:
    err = refused({"ckpt": {"fallback": "ownr"}, "owner": {}})
    assert (err.pool, err.key) == ("ckpt", "fallback")
    assert "did you mean 'owner'?" in str(err) and "The pools are: ckpt, owner" in str(err)
    err = refused({"ckpt": {"fallback": "ckpt"}})
    assert "cannot fall back to itself" in str(err)
    assert refused({}).key == "pools"
    assert refused({"bad name": {}}).key == ""  # the table's name: no key of it
    assert refused({"ckpt": "slurm"}).pool == "ckpt"


def test_a_file_is_refused_naming_the_file_pool_and_key(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text('[pools.ckpt]\nprovider = "slurm"\nwalltme = "01:00:00"\n')
    with pytest.raises(PoolConfigError) as info:
        load_config(path)
    assert (info.value.pool, info.value.key, info.value.source) == ("ckpt", "walltme", str(path))
    assert str(path) in str(info.value) and "did you mean 'walltime'?" in str(info.value)
    path.write_text('[pool.ckpt]\nprovider = "slurm"\n')
    with pytest.raises(PoolConfigError, match="did you mean 'pools'"):
        load_config(path)
    # The audit: [[pools]] with a name key (what architecture.md said) is a list.
    path.write_text('[[pools]]\nname = "cpu"\nprovider = "local"\n')
    with pytest.raises(PoolConfigError) as info:
        load_config(path)
    assert (info.value.key, info.value.source) == ("pools", str(path))
    assert "is a list of tables ([[pools]])" in str(info.value)
    assert "write [pools.NAME] tables" in str(info.value) and "[pools.cpu]" in str(info.value)
    path.write_text('[pools.cpu]\nprovider = "local"\n')  # what it says to write works
    assert list(load_config(path)) == ["cpu"]
    path.write_text("[pools.ckpt\n")
    with pytest.raises(PoolConfigError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(PoolConfigError, match="cannot read the file"):
        load_config(tmp_path / "missing.toml")
    # Latin-1 and UTF-16 files: a typed error naming the file, not UnicodeDecodeError
    for encoding in ("latin-1", "utf-16"):
        path.write_bytes('[pools.caf\u00e9]\nprovider = "local"\n'.encode(encoding))
        with pytest.raises(PoolConfigError, match="is not UTF-8 text, as TOML must be") as info:
            load_config(path)
        assert str(path) in str(info.value)


def test_a_local_pool_may_have_a_provision_delay(tmp_path: Path) -> None:
    pools = pools_from_dicts({"ci": {"provision_delay": "00:00:30"}, "b": {}})
    assert pools["ci"].provision_delay == 30.0 and pools["b"].provision_delay == 0.0
    with pytest.raises(PoolConfigError, match=r"'provision_delay' must be >= 0 \(seconds"):
        pools_from_dicts({"ci": {"provision_delay": -1}})
    with pytest.raises(PoolConfigError, match="is a local setting"):
        pools_from_dicts({"ckpt": {"provider": "slurm", "provision_delay": 5}})
    # The file may hold alerting tables beside the pools, or only them.
    path = tmp_path / "corral.toml"
    path.write_text('[alerting]\ninterval = 2\n\n[[alerts]]\nname = "x"\nexpr = "y"\n')
    assert load_config(path) == {}
    path.write_text("[pools.ci]\nprovision_delay = 2\n\n[alerting]\ninterval = 2\n")
    assert load_config(path)["ci"].provision_delay == 2.0
    path.write_text("[alert]\ninterval = 2\n")
    with pytest.raises(PoolConfigError, match="did you mean 'alerts'"):
        load_config(path)


WORKER_KEYS = """
[pools.ckpt]
provider = "slurm"
walltime = "01:00:00"
worker_port_range = "21010-21049"
grace = 30
execution = "process"
spill_dir = "/scratch/corral"
signal_warning = 120

[pools.here]
provider = "local"
worker_host = "127.0.0.1"
worker_port_range = "21050-21059"
grace = "1:00"
"""


@pytest.mark.anyio
async def test_the_worker_keys_reach_each_providers_worker_command_line(tmp_path: Path) -> None:
    """The Slurm audit: no pool key passed ``--port-range`` (which a firewalled site
    must), ``--host``, ``--grace``, ``--execution``, ``--spill-dir`` nor the Slurm
    ``--signal``; the auditor injected them with a sitecustomize.py. Each is a key now,
    on the command line of the workers of both providers the manager builds."""
    from actors.slurm import HOST_PLACEHOLDER, batch_script
    from runtime.kernel import ActorSystem
    from runtime.node import Tokens, start_control_plane, start_pools

    path = tmp_path / "corral.toml"
    path.write_text(WORKER_KEYS)
    pools = load_config(path)
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            plane = await start_control_plane(system)
            providers = await start_pools(
                plane, pools, "ws://0.0.0.0:8786", Tokens.generate(), run_dir=tmp_path
            )
            ckpt, here = providers["ckpt"], providers["here"]
            slurm, local = ckpt.argv_for("block-1", 0), here.argv_for("block-1", 0)  # type: ignore[attr-defined]

    def flag(argv: list[str], name: str) -> str:
        assert argv.count(name) == 1, argv
        return argv[argv.index(name) + 1]

    # A Slurm worker still listens on its node's address; its other flags are the keys'.
    assert flag(slurm, "--host") == HOST_PLACEHOLDER
    assert flag(slurm, "--port-range") == "21010-21049"
    assert flag(slurm, "--grace") == "30"
    assert flag(slurm, "--execution") == "process"
    assert flag(slurm, "--spill-dir") == "/scratch/corral"
    assert ckpt.options.signal_warning == 120  # type: ignore[attr-defined]
    script = batch_script(
        block_id="block-1", job_name="corral-ckpt-1", workers=[("ckpt-1", slurm)],
        spec=pools["ckpt"].block_spec(), options=ckpt.options,  # type: ignore[attr-defined]
        output=tmp_path / "o", error=tmp_path / "e", env_file=None, script=tmp_path / "s",
    )  # fmt: skip
    assert "#SBATCH --signal=B:TERM@120" in script
    assert "export CORRAL_SIGNAL_WARNING=120" in script  # its stop is the walltime
    assert "--port-range 21010-21049 --grace 30 --execution process" in script
    # A local pool's keys; what it does not set is the worker's default (no flag).
    assert flag(local, "--host") == "127.0.0.1"
    assert flag(local, "--port-range") == "21050-21059"
    assert flag(local, "--grace") == "60"
    assert "--execution" not in local and "--spill-dir" not in local
    # A Slurm pool's worker_host replaces {host}: one --host, the pool's.
    ckpt_here = pools_from_dicts({"c": {"provider": "slurm", "worker_host": "127.0.0.1"}})["c"]
    from runtime.node import pool_worker_argv

    argv = pool_worker_argv(ckpt_here, None, 1, "ws://login1:8786", "block-1", 0)
    assert flag(argv, "--host") == "127.0.0.1"


def test_a_misspelt_worker_key_gets_the_closest_name() -> None:
    for typo, meant in (
        ("worker_port_rang", "worker_port_range"),
        ("port_range", "worker_port_range"),
        ("worker_hosts", "worker_host"),
        ("spilldir", "spill_dir"),
        ("signal_warnings", "signal_warning"),
        ("executon", "execution"),
    ):
        err = refused({"ckpt": {"provider": "slurm", typo: "x"}})
        assert (err.pool, err.key) == ("ckpt", typo)
        assert f"did you mean {meant!r}?" in str(err), str(err)


def test_in_process_workers_take_no_worker_process_key() -> None:
    """An embedded cluster's in-process workers have no command line: a worker key
    there is refused, saying to give ``processes=True``."""
    said = re.escape("give Cluster(pools=..., processes=True)")
    with pytest.raises(PoolConfigError, match=said) as info:
        Cluster(pools={"a": {"worker_port_range": "21010-21019"}})
    assert (info.value.pool, info.value.key) == ("a", "worker_port_range")
    Cluster(pools={"a": {"worker_port_range": "21010-21019"}}, processes=True)  # taken


def test_a_cluster_refuses_bad_pools_when_made() -> None:
    with pytest.raises(PoolConfigError, match="did you mean 'max_blocks'"):
        Cluster(pools={"a": {"max_block": 2}})
    with pytest.raises(PoolConfigError, match="need a manager process") as info:
        Cluster(pools={"ckpt": {"provider": "slurm"}})
    assert info.value.key == "provider"
    with pytest.raises(ValueError, match="give no workers="):
        Cluster(workers=2, pools={"a": {}})


# ----------------------------------------------------------------------------- a cluster


@pytest.mark.anyio
async def test_a_cluster_runs_a_graph_on_the_workers_of_its_pools() -> None:
    pools = {
        "big": {"init_blocks": 2, "max_blocks": 2, "cores_per_worker": 2},
        "small": {"min_blocks": 1, "max_blocks": 1, "workers_per_node": 2},
    }
    with anyio.fail_after(30):
        async with Cluster(pools=pools) as cluster:
            await cluster.wait_for_workers(4)
            workers = {w: ws.pool for w, ws in cluster.scheduler_state.workers.items()}
            assert workers == {
                "big-1": "big", "big-2": "big", "small-1.0": "small", "small-1.1": "small",
            }  # fmt: skip
            assert cluster.scheduler_state.workers["big-1"].cores == 2
            dsk = {"a": 1, "b": (operator.add, "a", 10), "c": (operator.mul, "b", 2)}
            assert await cluster.compute(dsk, "c") == 22
            (on_small,) = await cluster.submit_graph({"d": (operator.neg, 4)}, ["d"], pool="small")
            assert await on_small == -4
            auto = (await cluster.status())["autoscaler"]
            assert auto["policy"] == "demand"
            assert sorted(auto["blocks"]) == ["big/block-1", "big/block-2", "small/block-1"]
            # scale(n) without a pool names the first pool: a floor for the strategy.
            assert await cluster.scale(1) == {"big": 2, "small": 1}
            with pytest.raises(ValueError, match="there is no pool 'nope'"):
                await cluster.scale(1, pool="nope")


@pytest.mark.anyio
async def test_a_task_of_one_pool_reads_an_output_another_pools_worker_holds() -> None:
    """In-process pools are one provider each; their workers find each other's outputs
    all the same (before, the fetch failed with "gone" over and over, and the task
    never ran)."""
    state = await _b_on_gpu_reads_a_on_cpu()
    assert [state.tasks[k].tries[-1].worker for k in "ab"] == ["cpu-1", "gpu-1"]


async def _b_on_gpu_reads_a_on_cpu() -> Any:
    """Pools ``cpu`` and ``gpu`` of one in-process worker each: ``a`` runs on cpu-1,
    then ``b`` on gpu-1 reads it; the scheduler's core once both are done."""
    pools = {"cpu": {"min_blocks": 1, "max_blocks": 1}, "gpu": {"min_blocks": 1, "max_blocks": 1}}
    with anyio.fail_after(30):
        async with Cluster(pools=pools) as cluster:
            await cluster.wait_for_workers(2)
            (a,) = await cluster.submit_graph({"a": (operator.add, 1, 2)}, ["a"], pool="cpu")
            assert await a == 3
            (b,) = await cluster.submit_graph({"b": (operator.mul, "a", 10)}, ["b"], pool="gpu")
            assert await b == 30
            return cluster.scheduler_state


@pytest.mark.anyio
async def test_a_task_whose_input_cannot_be_fetched_backs_off_then_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gpu-1 cannot reach cpu-1 for its first four tries (it finds no way to it, as a
    worker cut off from a peer that stays connected to the scheduler): each time a is
    made again on cpu-1 and b sent back, from the second time on held back 0.5 s, then
    1 s, then 2 s (before, the two went round as fast as they could: thousands of
    tries a second). Once the way is open, b runs."""
    import runtime.node

    left = [4]
    asked: list[str] = []
    real = runtime.node.worker_factory

    def factory(scheduler: Any, **options: Any) -> Any:
        make = real(scheduler, **options)

        def make_cut(block: str, wid: str, spec: BlockSpec, resolve: Any) -> Any:
            def cut(peer: str) -> Any:
                if peer == "cpu-1":
                    asked.append(peer)
                    if left[0]:
                        left[0] -= 1
                        return None  # no way to it from here
                return resolve(peer)

            return make(block, wid, spec, cut if spec.pool == "gpu" else resolve)

        return make_cut

    monkeypatch.setattr(runtime.node, "worker_factory", factory)
    state = await _b_on_gpu_reads_a_on_cpu()
    held = [f for k, s, f, *_ in state.story("b") if s == "unreachable"]
    assert held == ["2 times: held 0.5 s", "3 times: held 1 s", "4 times: held 2 s"]
    assert len(state.tasks["a"].tries) == 5  # made again after each of the four
    assert asked == ["cpu-1"] * 5 and state.tasks["b"].tries[-1].worker == "gpu-1"


@pytest.mark.anyio
async def test_submit_takes_each_calls_pool_and_settings() -> None:
    """``submit(..., pool=, priority=, retries=, resources=)`` are the task's settings,
    not the function's arguments. Calls made together go as one graph per run of calls
    with the same settings, in the order made, so a task may need another pool's."""
    pools = {"cpu": {"min_blocks": 1, "max_blocks": 1}, "gpu": {"min_blocks": 1, "max_blocks": 1}}
    with anyio.fail_after(30):
        async with Cluster(pools=pools) as cluster:
            await cluster.wait_for_workers(2)
            a = cluster.submit(operator.add, 1, 2, pool="cpu")
            b = cluster.submit(operator.mul, a, 10, pool="gpu", priority=5, retries=2)
            c = cluster.submit(operator.neg, b, pool="cpu", resources={"cores": 1})
            d = cluster.map(operator.add, [1, 2], [10, 20], pool="gpu")
            assert await c == -30 and await cluster.gather(d) == [11, 22]
            tasks = cluster.scheduler_state.tasks
            for fut, pool in ((a, "cpu"), (b, "gpu"), (c, "cpu"), (d[0], "gpu"), (d[1], "gpu")):
                ts = tasks[fut.key]
                assert ts.spec.pool == pool and ts.tries[-1].worker == f"{pool}-1", fut.key
            assert (tasks[b.key].spec.priority, tasks[b.key].spec.retries) == (5.0, 2)
            assert tasks[c.key].spec.resources == {"cores": 1.0}
            assert (tasks[a.key].spec.priority, tasks[a.key].spec.retries) == (0.0, 0)
            # The same call with other settings is another task, which has them; with
            # the same ones, the same task.
            e, f, g = (cluster.submit(operator.add, 1, 2, pool=p) for p in ("gpu", "gpu", None))
            assert e.key == f.key and len({a.key, e.key, g.key}) == 3
            assert await e == await g == 3
            assert tasks[e.key].tries[-1].worker == "gpu-1" and tasks[g.key].spec.pool is None
            # A bad setting is refused at the call, naming the task; nothing is sent.
            for bad, match in (
                ({"retries": -1}, "retries=-1; it must be >= 0"),
                ({"pool": 3}, "pool=3; it must be a pool's name"),
                ({"pool": ""}, "pool=''; it must be a pool's name"),
                ({"priority": "high"}, "priority must be a number"),
                ({"resources": {"cores": "two"}}, "resources a mapping of names to numbers"),
            ):
                with pytest.raises(GraphError, match=match):
                    cluster.submit(operator.neg, 1, key="bad-1", **bad)
            assert "bad-1" not in tasks and not cluster._client_actor.pending


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("listen", "warned"),
    [("ws://127.0.0.1:8786", True), ("ws://localhost:8786", True), ("ws://[::1]:8786", True),
     ("ws://0.0.0.0:8786", False), ("ws://10.1.2.3:8786", False)],
)  # fmt: skip
async def test_slurm_workers_told_to_dial_loopback_are_warned_of(
    tmp_path: Path, listen: str, warned: bool
) -> None:
    """A manager listening on loopback gives its Slurm pools' workers that address,
    which compute nodes cannot reach: it says so when it starts the pool, and how to
    listen instead (local pools are fine on loopback)."""
    from runtime.kernel import ActorSystem
    from runtime.node import Tokens, start_control_plane, start_pools

    pools = pools_from_dicts(
        {"ckpt": {"provider": "slurm", "init_blocks": 0}, "here": {"init_blocks": 0}}
    )
    with anyio.fail_after(30), log_lines("corral.node") as log:
        async with ActorSystem() as system:
            plane = await start_control_plane(system)
            await start_pools(plane, pools, listen, Tokens.generate(), run_dir=tmp_path)
    line = log.with_("Slurm workers will dial this machine's loopback address")
    if not warned:
        assert line is None, line
        return
    assert line is not None and "pool='ckpt'" in line and f"address='{listen}'" in line, line
    assert "--listen 0.0.0.0:PORT" in line and "pool='here'" not in " ".join(log.lines)


@pytest.mark.anyio
async def test_each_pool_gets_its_provider_with_the_pools_options(tmp_path: Path) -> None:
    from actors.processes import LocalProcessProvider
    from actors.slurm import HOST_PLACEHOLDER, SlurmOptions, SlurmProvider
    from runtime.kernel import ActorSystem
    from runtime.node import Tokens, start_control_plane, start_pools

    pools = pools_from_dicts(
        {
            "ckpt": {
                "provider": "slurm", "partition": "ckpt", "account": "astro", "qos": "low",
                "exclusive": True, "nodes_per_block": 2, "workers_per_node": 2,
                "cores_per_worker": 3, "walltime": "00:30:00", "worker_init": "module load x",
                "scheduler_options": "#SBATCH --constraint=a", "init_blocks": 0,
                "fallback": "here",
            },
            "here": {"init_blocks": 0, "walltime": 600, "memory_per_worker": "1GiB"},
        }
    )  # fmt: skip
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            plane = await start_control_plane(system, policies=pool_policies(pools, None))
            tokens = Tokens.generate()
            providers = await start_pools(
                plane, pools, "ws://0.0.0.0:8786", tokens, run_dir=tmp_path
            )
            ckpt, here = providers["ckpt"], providers["here"]
            assert plane.providers == providers
            assert isinstance(ckpt, SlurmProvider) and isinstance(here, LocalProcessProvider)
            assert ckpt.options == SlurmOptions(
                partition="ckpt", account="astro", qos="low", nodes_per_block=2,
                walltime=1800.0, exclusive=True, scheduler_options="#SBATCH --constraint=a",
                worker_init="module load x",
            )  # fmt: skip
            assert ckpt.prefix == "ckpt" and ckpt.run_dir == tmp_path / "ckpt"
            assert ckpt.env == here.env == {"CORRAL_TOKEN": tokens.worker}  # not the admin token
            assert here.pool == "here"  # its log lines name blocks here/block-<n>
            argv = ckpt.argv_for("block-1", 0)
            at = argv.index("worker")  # (after `python [-P] -m runtime`)
            assert argv[at - 2 : at + 4] == [
                "-m",
                "runtime",
                "worker",
                argv[at + 1],
                "--cores",
                "3",
            ]
            assert argv[at + 1].endswith(":8786") and "0.0.0.0" not in argv[at + 1]
            # no memory_per_worker: each of a node's 2 workers takes half the node's
            assert argv[-6:] == [
                "--pool", "ckpt", "--memory-share", "2", "--host", HOST_PLACEHOLDER,
            ]  # fmt: skip
            # A local worker reaches a wildcard listener on loopback, and knows its
            # deadline when its pool has a walltime.
            local = here.argv_for("block-1", 0)
            assert local[local.index("worker") + 1] == "ws://127.0.0.1:8786"
            assert local[local.index("--memory") + 1] == str(2**30)
            deadline = float(local[local.index("--deadline") + 1])
            assert 590 < deadline - time.time() <= 600
            status = await plane.refs["autoscaler"].ask(StatusRequest())
            assert status.targets == {"ckpt": 0, "here": 0} and status.blocks == {}
            retry = plane.scheduler.state.policies["retry"]
            assert retry.fallback == {"ckpt": "here"}


@pytest.mark.anyio
async def test_spare_blocks_come_up_idle_and_stay_beyond_the_busy_ones() -> None:
    """``("demand", {"spare": 2})`` on a pool of at most 3 blocks: two idle workers with
    no task at all; a task that runs takes one, and a third block comes for the
    spare."""
    pools = {"p": {"max_blocks": 3}}
    with anyio.fail_after(30):
        async with Cluster(pools=pools, policies={"scaling": ("demand", {"spare": 2})}) as cluster:
            await cluster.wait_for_workers(2)
            auto = (await cluster.status())["autoscaler"]
            assert auto["policy"] == "demand" and auto["desired"] == {"p": 2}
            assert auto["policy_params"] == {"spare": 2}
            st = await cluster.status()  # the console's policies table shows it too
            text = status_text({k: st[k] for k in ("policies", "policy_params", "autoscaler")})
            assert re.search(r"scaling\W+demand\W+spare=2", text), text
            started, release = threading.Event(), threading.Event()

            def hold() -> str:
                started.set()
                if not release.wait(30):
                    raise TimeoutError("the test never released the task")
                return "done"

            (fut,) = await cluster.submit_graph({"h": (hold,)}, ["h"])
            await wait_until(started.is_set, "the task to start", limit=10)
            await cluster.wait_for_workers(3)
            assert (await cluster.status())["autoscaler"]["desired"] == {"p": 3}
            release.set()
            assert await fut == "done"


@pytest.mark.anyio
async def test_the_next_wave_gets_its_blocks_before_its_inputs_are_done() -> None:
    """The ``demand`` strategy looks ahead by default: while the one task of a graph's
    first stage runs, the three tasks that wait for it are the next wave, due within
    the first stage's mean duration (learnt from an earlier one), and their blocks come
    up before it is done (Parsl's view, ready and running tasks only, would keep one
    block until then)."""
    pools = {"p": {"max_blocks": 4}}
    with anyio.fail_after(30):
        async with Cluster(pools=pools, policies={"scaling": "demand"}) as cluster:
            started, release = threading.Event(), threading.Event()

            def first(hold: bool) -> int:
                if not hold:
                    time.sleep(2.0)  # the category's mean: 2 s
                    return 0
                started.set()
                if not release.wait(30):
                    raise TimeoutError("the test never released the task")
                return 1

            (earlier,) = await cluster.submit_graph({"first-0": (first, False)}, ["first-0"])
            assert await earlier == 0
            graph: dict[str, Any] = {"first-1": (first, True)}
            graph.update({f"then-{i}": (operator.add, "first-1", i) for i in range(3)})
            futs = await cluster.submit_graph(graph, [f"then-{i}" for i in range(3)])
            await wait_until(started.is_set, "the first task to start", limit=10)
            await cluster.wait_for_workers(4)
            status = await cluster.status()
            assert status["autoscaler"]["desired"] == {"p": 4}
            assert status["tasks_by_state"].get("waiting") == 3  # still waiting for it
            release.set()
            assert [await f for f in futs] == [1, 2, 3]


def test_spare_blocks_is_a_pool_key_within_max_blocks() -> None:
    pools = pools_from_dicts({"ci": {"max_blocks": 4, "spare_blocks": 2}, "gpu": {}})
    assert pools["ci"].limits().spare_blocks == 2
    assert pools["gpu"].limits().spare_blocks == 0
    for bad, words in (
        (5, "must be from 0 to max_blocks (4), got 5"),
        (-1, "must be a whole number >= 0, got -1"),
        (1.5, "must be a whole number >= 0, got 1.5"),
        (True, "must be a whole number >= 0, got True"),
    ):
        err = refused({"ci": {"max_blocks": 4, "spare_blocks": bad}})
        assert (err.pool, err.key) == ("ci", "spare_blocks") and words in str(err), bad
