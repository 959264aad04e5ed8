"""At an orderly stop, a manager process says which policies were set at runtime: they
are not kept (the next start has its --config's), as the alert rules changed from the
console are said to be lost (a user audit of policies, F3: a swap vanished silently at
a restart). A real manager process on a port of this file's range; the console in this
process."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from policies import policies_toml
from runtime.__main__ import main
from tests.helpers import Cli, free_port_between

#: the ports of 127.0.0.1 this file's managers listen on
PORTS = (64000, 64999)
LIMIT = 20


@pytest.mark.timeout(2 * LIMIT)
def test_a_manager_stop_says_which_runtime_policies_are_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)  # the console reads the token file
    with Cli(tmp_path) as cli:
        manager, address = cli.manager(port=free_port_between(*PORTS))
        for words in (["priority", "long-first"], ["retry", "default", "max_lost=2"]):
            assert main(["console", address, "policy", "set", *words]) == 0
        manager.send_signal(signal.SIGTERM)
        line = cli.line_with(manager, "policies set at runtime are lost at this stop", LIMIT)
        assert "level='warning'" in line, line
        assert "'priority': 'long-first()'" in line and "'retry': 'default(max_lost=2)'" in line
        toml = policies_toml(
            {"priority": ("long-first", {}), "retry": ("default", {"max_lost": 2})}
        )
        assert toml.encode("unicode_escape").decode() in line, line


def test_the_policies_table_that_keeps_them_reads_back() -> None:
    import tomllib

    policies = {
        "priority": ("long-first", {}),
        "retry": ("default", {"max_lost": 2, "fallback": {"ckpt": "owner"}, "backoff": None}),
        "scaling": ("demand", {"spare": 1, "lookahead": "provisioning"}),
    }
    assert tomllib.loads(policies_toml(policies)) == {
        "policies": {
            "priority": "long-first",
            "retry": {"name": "default", "max_lost": 2, "fallback": {"ckpt": "owner"}},
            "scaling": {"name": "demand", "spare": 1, "lookahead": "provisioning"},
        }
    }
