"""The small documentation and wording gaps of the configuration audit (its finding 7),
each checked where it is said: a bad pool name's error names the table's name, not a
key ``name`` the user never wrote (and the rule is in configuration.md); a negative
time says it must be >= 0; ``exclusive = "true"``, ``console scale cpuu`` and
``--memory-options '{"spil": 0.5}'`` get their did-you-mean; a relative ``spill_dir``
is made absolute under the manager's working directory; ``manager --help`` names
``[policies]`` for ``--config``; configuration.md's console row has ``--tls-ca``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.autoscaler import Autoscaler
from actors.memory import MemoryConfig
from actors.pools import pools_from_dicts
from runtime.__main__ import main
from runtime.errors import MemoryConfigError, PoolConfigError
from tests.helpers import ROOT

DOC = (ROOT / "docs" / "configuration.md").read_text()


def _refusal(pools: dict[str, Any]) -> PoolConfigError:
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts(pools, source="one.toml")
    return info.value


def test_a_bad_pool_name_is_the_tables_name_not_a_key() -> None:
    err = _refusal({"my pool/x": {"provider": "local"}})
    assert err.key == ""
    assert str(err) == (
        "pool 'my pool/x' in one.toml: the pool's name (its table's, [pools.NAME]) must be "
        "letters, digits, '_', '.' and '-', starting with a letter or digit, got "
        "'my pool/x'. See docs/configuration.md#pools for every key."
    )
    assert "key 'name'" not in str(err)
    assert "A pool's name is\nletters, digits, `_`, `.` and `-`, starting with a letter" in DOC


@pytest.mark.parametrize("key", ["max_idletime", "drain_period", "grace", "provision_delay"])
def test_a_negative_time_must_be_at_least_0(key: str) -> None:
    err = _refusal({"cpu": {key: -1}})
    assert (err.key, err.problem) == (key, "must be >= 0 (seconds, or a Slurm time), got -1")


def test_exclusive_as_a_string_gets_its_did_you_mean() -> None:
    err = _refusal({"gpu": {"provider": "slurm", "exclusive": "true"}})
    assert err.problem == (
        "must be true or false, got 'true'; did you mean exclusive = true (a boolean, not a "
        "string)?"
    )
    assert _refusal({"gpu": {"provider": "slurm", "exclusive": "yes"}}).problem == (
        "must be true or false, got 'yes'"
    )


def test_a_misspelt_pool_to_scale_gets_its_did_you_mean() -> None:
    auto = Autoscaler({"cpu": object(), "dflt": object()}, None, {})  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        auto.provider_for("cpuu")
    assert str(info.value) == (
        "there is no pool 'cpuu'; did you mean 'cpu'? The configured pools: cpu, dflt"
    )
    with pytest.raises(ValueError, match=r"^there is no pool 'zzz'\. The configured pools"):
        auto.provider_for("zzz")


def test_a_misspelt_memory_option_gets_its_did_you_mean() -> None:
    with pytest.raises(MemoryConfigError) as info:
        MemoryConfig.of(1 << 30, {"spil": 0.5, "zzz": 1})
    assert "unknown option(s) spil (did you mean 'spill'?), zzz; known: spill," in str(info.value)


def test_a_relative_spill_dir_is_made_absolute_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    pools = pools_from_dicts({"cpu": {"spill_dir": "relspill"}, "abs": {"spill_dir": "/s/x"}})
    assert pools["cpu"].spill_dir == str(tmp_path / "relspill")
    assert pools["abs"].spill_dir == "/s/x"
    assert "a relative path is under the manager's working directory" in DOC


def test_manager_help_names_policies_for_config(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["runtime", "manager", "--help"])
    with pytest.raises(SystemExit):
        main()
    text = " ".join(capsys.readouterr().out.split())
    assert "[policies]" in text.split("--config PATH", 2)[2].split("--alertmanager")[0]


def test_the_console_row_names_tls_ca() -> None:
    (row,) = [line for line in DOC.splitlines() if line.startswith("| `console` |")]
    assert "`--tls-ca FILE`" in row
