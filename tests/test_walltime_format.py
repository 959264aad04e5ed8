"""A walltime is read by one parser (actors/slurm.py, ``parse_walltime``) wherever it
comes from: a pool's ``walltime`` (TOML or ``Cluster(pools=...)``) and
``SlurmOptions(walltime=...)``. It takes seconds as a number and exactly the forms of
``sbatch --time`` (man sbatch), each field counted as Slurm counts it, and refuses
anything else with one message: the value, the forms, an example. Pure: no Slurm
needed (what Slurm itself makes of these strings is in the comments, seen with
``sbatch --hold`` and ``scontrol show job`` on Slurm 22.05)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.pools import load_config, parse_seconds, pools_from_dicts
from actors.providers import BlockSpec
from actors.slurm import (
    TIME_FORMS,
    SlurmOptions,
    batch_script,
    parse_walltime,
    slurm_time,
    walltime_seconds,
)
from runtime.errors import PoolConfigError, WalltimeError

#: every form sbatch --time takes, with its seconds
ACCEPTED: dict[Any, float] = {
    "90": 5400,  # minutes
    "1": 60,
    "30:00": 1800,  # minutes:seconds
    "1:30": 90,
    "90:00": 5400,
    "01:30:05": 5405,  # hours:minutes:seconds
    "100:00:00": 360000,
    "2-12": 216000,  # days-hours
    "2-03:04": 183840,  # days-hours:minutes
    "1-00:00:01": 86401,  # days-hours:minutes:seconds
    # A field larger than its unit counts for what it is, as Slurm counts it:
    # TimeLimit=01:10:00, 2-00:00:00, 00:02:00 and 1-01:00:00.
    "00:70:00": 4200,
    "1-24:00:00": 172800,
    "0:90": 90,
    "0-25": 90000,
    " 1:00:00 ": 3600,  # spaces around it are dropped
    3600: 3600,  # seconds as a number
    59.5: 59.5,
}

#: what is not a walltime: sbatch refuses these, or they are not one of its documented
#: forms ("1-" is a day to sbatch 22.05; "-1", "INFINITE" and "UNLIMITED" ask for no
#: limit: leave walltime out)
REFUSED: list[Any] = [
    "1h", "1.5", "1:00:00:00", "1-2-3", "1:2-3", "1-", "-1", "-5", "INFINITE",
    "UNLIMITED", "", " ", ":30", "1:", "1-:30", "1--2", "\u0661\u0662",  # Arabic-Indic 12
    -5, -0.5, float("inf"), float("nan"), True, None, [3600], b"3600",
]  # fmt: skip

#: a walltime of no time at all, however it is written
ZEROS: list[Any] = [0, 0.0, "0", "00", "0:00", "00:00:00", "0-0", "0-00:00:00"]


def refusal(value: object) -> str:
    """The message of a walltime that is not one."""
    return f"walltime must be {TIME_FORMS}, got {value!r}. See docs/configuration.md#pools."


# ----------------------------------------------------------------------------- the parser


def test_every_slurm_form_and_seconds_are_read_as_slurm_reads_them() -> None:
    assert {w: parse_walltime(w) for w in ACCEPTED} == ACCEPTED
    # Every duration of a pool's configuration takes the same forms (and 0).
    assert {w: parse_seconds(w) for w in ACCEPTED} == ACCEPTED
    assert [parse_seconds(z) for z in ZEROS] == [0.0] * len(ZEROS)


def test_what_is_not_a_walltime_is_refused_with_the_forms_and_an_example() -> None:
    assert refusal("1h") == (
        "walltime must be seconds (a number, e.g. 5400) or a Slurm time 'MM', 'MM:SS', "
        "'HH:MM:SS', 'D-HH', 'D-HH:MM' or 'D-HH:MM:SS' (sbatch --time's forms: e.g. '90' "
        "is 90 minutes, '1-12:00:00' a day and a half), got '1h'. "
        "See docs/configuration.md#pools."
    )
    for bad in REFUSED:
        with pytest.raises(WalltimeError) as info:
            parse_walltime(bad)
        assert str(info.value) == refusal(bad)
        assert info.value.value is bad and isinstance(info.value, ValueError)
        with pytest.raises(ValueError, match="must be seconds"):
            parse_seconds(bad)


def test_a_walltime_of_0_is_refused_the_same_way_however_it_is_written() -> None:
    for zero in ZEROS:
        with pytest.raises(WalltimeError) as info:
            parse_walltime(zero)
        assert str(info.value) == (
            "walltime must be more than 0 (leave it out for no limit: on Slurm, the "
            f"partition's default): {TIME_FORMS}, got {zero!r}. See docs/configuration.md#pools."
        )


def test_sbatch_gets_the_walltime_as_hh_mm_ss_of_whole_seconds_rounded_up() -> None:
    assert slurm_time(90) == "00:01:30" and slurm_time(59.5) == "00:01:00"
    assert slurm_time(2 * 86400 + 3661) == "2-01:01:01"
    assert slurm_time("90") == "01:30:00" and slurm_time("00:70:00") == "01:10:00"
    assert slurm_time("2-12") == "2-12:00:00" and slurm_time("1-24:00:00") == "2-00:00:00"
    assert walltime_seconds(59.5) == 60 and walltime_seconds("1:30") == 90


# ----------------------------------------------------------------------------- SlurmOptions


def _script(options: SlurmOptions) -> list[str]:
    return batch_script(
        block_id="block-1", job_name="corral-1", workers=[("w-1", ["true"])],
        spec=BlockSpec(), options=options, output=Path("/run/o"), error=Path("/run/e"),
        env_file=None, script=Path("/run/s.sh"),
    ).splitlines()  # fmt: skip


def test_slurm_options_take_the_same_walltimes_as_a_pool_and_the_workers_know_them() -> None:
    for walltime, seconds in ACCEPTED.items():
        lines = _script(SlurmOptions(walltime=walltime))
        assert f"#SBATCH --time={slurm_time(seconds)}" in lines, walltime
        deadline = f"export CORRAL_DEADLINE=$(( $(date +%s) + {walltime_seconds(seconds)} ))"
        assert deadline in lines, walltime
    # None (the default): the partition's default, and no deadline.
    lines = _script(SlurmOptions())
    assert not any("--time" in ln or "CORRAL_DEADLINE" in ln for ln in lines)


def test_slurm_options_refuse_a_walltime_with_the_parser_s_message() -> None:
    for bad in [*REFUSED, *ZEROS]:
        if bad is None:  # the default: the partition's walltime
            continue
        with pytest.raises(WalltimeError) as info:
            SlurmOptions(walltime=bad)
        with pytest.raises(WalltimeError) as parsed:
            parse_walltime(bad)
        assert str(info.value) == str(parsed.value)


# ----------------------------------------------------------------------------- pools


def test_a_pool_s_walltime_is_read_by_the_same_parser(tmp_path: Path) -> None:
    pools = pools_from_dicts(
        {f"p{i}": {"provider": "slurm", "walltime": w} for i, w in enumerate(ACCEPTED)}
    )
    assert [p.walltime for p in pools.values()] == list(ACCEPTED.values())
    assert [p.slurm_options().walltime for p in pools.values()] == list(ACCEPTED.values())
    # The same from a TOML file, as the audit wrote them.
    path = tmp_path / "corral.toml"
    path.write_text(
        '[pools.short]\nprovider = "slurm"\nwalltime = "30:00"\n'
        '[pools.long]\nprovider = "slurm"\nwalltime = "2-12"\n'
        '[pools.odd]\nwalltime = "00:70:00"\n'
    )
    pools = load_config(path)
    assert {n: p.walltime for n, p in pools.items()} == {
        "short": 1800.0, "long": 216000.0, "odd": 4200.0,
    }  # fmt: skip
    assert pools["long"].slurm_options() == SlurmOptions(walltime=216000.0)


def test_a_pool_s_bad_walltime_is_refused_with_the_parser_s_problem(tmp_path: Path) -> None:
    for bad in [*REFUSED, *ZEROS]:
        if bad is None:  # a pool without a walltime has none
            continue
        with pytest.raises(PoolConfigError) as info:
            pools_from_dicts({"ckpt": {"provider": "slurm", "walltime": bad}})
        with pytest.raises(WalltimeError) as parsed:
            parse_walltime(bad)
        assert (info.value.pool, info.value.key) == ("ckpt", "walltime")
        assert info.value.problem == parsed.value.problem
    # From a file: 0 and "0" say the same, but for the value.
    path = tmp_path / "corral.toml"
    said = []
    for zero in ("0", '"0"'):
        path.write_text(f"[pools.ckpt]\nwalltime = {zero}\n")
        with pytest.raises(PoolConfigError) as info:
            load_config(path)
        said.append(str(info.value))
    assert said == [
        f"pool 'ckpt' in {path}: key 'walltime' must be more than 0 (leave it out for no "
        f"limit: on Slurm, the partition's default): {TIME_FORMS}, got {z}. "
        "See docs/configuration.md#pools for every key."
        for z in ("0", "'0'")
    ]
