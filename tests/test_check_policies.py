"""``python -m runtime check --config FILE`` checks the ``[policies]`` table as the
manager loads it (``actors.pools.load_policies``, each policy made once): before, the
check passed a table that then stopped the manager with ``PolicyConfigError``. A name
that is not built in cannot be checked without the module that registers it: the check
takes ``--policy-module``, as the manager does. Each run is a real ``check`` process,
bounded (tests/test_preflight.py's ``check``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_preflight import check, results

pytestmark = pytest.mark.timeout(180)

MINE = """
import policies
from policies.base import RetryDecision

@policies.register("retry", "test-mine")
class Mine:
    def __init__(self, tries: int = 3) -> None:
        self.tries = tries

    def decide(self, task, outcome, cause):
        return RetryDecision(False)
"""


def test_a_bad_parameter_of_a_built_in_policy_fails_the_check(tmp_path: Path) -> None:
    config = '[policies.retry]\nname = "default"\nmax_lots = 2\n'
    done = check(tmp_path, config, "--no-probe", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    r = results(done)[("*", "policies")]
    assert r["status"] == "FAIL", r
    assert r["detail"].startswith(
        f"[policies] in {tmp_path / 'corral.toml'}: key 'retry' is refused: bad parameters "
        "for retry policy 'default': no parameter 'max_lots'; did you mean 'max_lost'?"
    ), r
    assert "a manager started with it stops with this error" in r["advice"], r
    text = check(tmp_path, config, "--no-probe")  # the same, as a line of the table
    assert text.returncode == 1 and "FAIL  *  policies" in text.stdout, text.stdout


def test_a_policy_that_is_not_built_in_fails_the_check_saying_why(tmp_path: Path) -> None:
    done = check(tmp_path, '[policies]\nretry = "test-mine"\n', "--no-probe", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    r = results(done)[("*", "policies")]
    assert r["status"] == "FAIL", r
    assert r["detail"] == (
        "[policies] retry: 'test-mine' is not a built-in retry policy, so it cannot be "
        "verified without the module that registers it (built in: default, never)"
    ), r
    assert "--policy-module MODULE" in r["advice"], r


def test_a_misspelt_built_in_name_fails_with_did_you_mean(tmp_path: Path) -> None:
    # The manager started with this file says "did you mean 'round-robin'?": the
    # pre-flight says it too, not "cannot be verified without the module".
    done = check(tmp_path, '[policies]\nplacement = "round-robbin"\n', "--no-probe", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    r = results(done)[("*", "policies")]
    assert r["status"] == "FAIL", r
    assert r["detail"] == (
        "[policies] placement: no placement policy named 'round-robbin'; "
        "did you mean 'round-robin'?"
    ), r
    assert "cannot be verified" not in r["detail"], r
    assert "a manager started with it stops with this error" in r["advice"], r


def test_a_good_table_passes(tmp_path: Path) -> None:
    config = (
        '[policies]\npriority = "long-first"\n\n[policies.retry]\nname = "default"\nmax_lost = 2\n'
    )
    done = check(tmp_path, config, "--no-probe", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    r = results(done)[("*", "policies")]
    assert (r["status"], r["detail"]) == (
        "PASS", "priority = long-first, retry = default (max_lost=2)"
    ), r  # fmt: skip


def test_a_policy_of_a_policy_module_passes_with_it(tmp_path: Path) -> None:
    module = tmp_path / "mine.py"
    module.write_text(MINE)
    config = '[policies.retry]\nname = "test-mine"\ntries = 5\n'
    done = check(tmp_path, config, "--no-probe", "--json", "--policy-module", str(module))
    assert done.returncode == 0, done.stdout + done.stderr
    r = results(done)[("*", "policies")]
    assert (r["status"], r["detail"]) == (
        "PASS", f"retry = test-mine (tries=5) (with --policy-module {module})"
    ), r  # fmt: skip
    # its parameters are checked as the manager checks them
    bad = '[policies.retry]\nname = "test-mine"\ntries = "five"\n'
    done = check(tmp_path, bad, "--no-probe", "--json", "--policy-module", str(module))
    assert done.returncode == 1, done.stdout + done.stderr
    r = results(done)[("*", "policies")]
    assert r["status"] == "FAIL", r
    assert (
        "retry policy 'test-mine': tries must be a whole number (an int), got 'five'"
        in (r["detail"])
    ), r
    # a module that does not import: a FAIL of its own, as the manager would stop
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no GPU here')\n")
    done = check(tmp_path, config, "--no-probe", "--json", "--policy-module", str(broken))
    assert done.returncode == 1, done.stdout + done.stderr
    r = results(done)[("*", "policy module")]
    assert r["status"] == "FAIL", r
    assert r["detail"] == (
        f"--policy-module {str(broken)!r} could not be imported: RuntimeError: no GPU here"
    ), r


def test_every_unknown_key_of_every_section_is_reported_in_one_run(tmp_path: Path) -> None:
    """Three typos are three FAILs of one run, each with its did-you-mean, not three runs:
    the loaders keep each refusal (``runtime.errors.Refusals``) and go on."""
    config = (
        "polices = 1\n"
        "[pools.cpu]\nmax_blockz = 2\nworkers_per_nod = 2\n"
        "[pools.gpu]\ncores_per_workr = 4\n"
        "[pools.ok]\nmax_blocks = 2\n"
        '[policies]\npriorty = "long-first"\nretri = "default"\nplacement = "nope"\n'
        "[alerting]\nintervall = 5\n"
    )
    done = check(tmp_path, config, "--no-probe", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    details = [r["detail"] for r in json.loads(done.stdout)["results"] if r["status"] == "FAIL"]
    for wanted in (
        "key 'polices' is not a setting; did you mean 'policies'?",
        "pool 'cpu' in", "key 'max_blockz' is unknown; did you mean 'max_blocks'?",
        "key 'workers_per_nod' is unknown; did you mean 'workers_per_node'?",
        "pool 'gpu' in", "key 'cores_per_workr' is unknown; did you mean 'cores_per_worker'?",
        "key 'priorty' is not a kind of policy; did you mean 'priority'?",
        "key 'retri' is not a kind of policy; did you mean 'retry'?",
        "'nope' is not a built-in placement policy",
        "key 'alerting.intervall' is unknown; did you mean 'alerting.interval'? The keys are:",
    ):  # fmt: skip
        assert sum(wanted in d for d in details) >= 1, (wanted, details)
    assert len(details) == 8, details  # each once: 'polices' is seen by every section
    assert not any("pool 'ok'" in d for d in details), details


def test_init_blocks_under_the_fixed_policy_is_warned_of(tmp_path: Path) -> None:
    """``init_blocks`` has no effect under ``scaling = "fixed"`` (the pool starts at
    ``min_blocks``): the check says so, naming the fix. Before, it passed silently and
    the manager started no block."""
    config = (
        '[pools.build]\nprovider = "local"\ninit_blocks = 1\nmax_blocks = 2\n'
        '[pools.quiet]\nprovider = "local"\nmax_blocks = 2\n'  # no init_blocks: nothing said
        '[policies]\nscaling = "fixed"\n'
    )
    done = check(tmp_path, config, "--no-probe", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    found = results(done)
    r = found[("build", "scaling")]
    assert r["status"] == "WARN", r
    assert r["detail"].startswith(
        "init_blocks = 1 has no effect under the 'fixed' scaling policy: it starts and "
        "keeps the pool at min_blocks (0) blocks. Set min_blocks = 1"
    ), r
    assert ("quiet", "scaling") not in found
    # the default policy with pools, demand, starts init_blocks: nothing to say
    done = check(tmp_path, config.replace('scaling = "fixed"', 'scaling = "demand"'),
                 "--no-probe", "--json")  # fmt: skip
    assert ("build", "scaling") not in results(done)
    # beside a key the file refuses: both said, in one run
    done = check(tmp_path, "polices = 1\n" + config, "--no-probe", "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert results(done)[("build", "scaling")]["status"] == "WARN"


def test_the_manager_warns_of_init_blocks_under_fixed_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from actors.pools import load_config, load_policies
    from policies import REGISTRY
    from runtime.node import warn_ignored_settings

    path = tmp_path / "corral.toml"
    path.write_text(
        '[pools.build]\ninit_blocks = 2\nmax_blocks = 2\n[policies]\nscaling = "fixed"\n'
    )
    with caplog.at_level("WARNING"):
        found = warn_ignored_settings(path, load_config(path), load_policies(path, REGISTRY))
    assert [pool for pool, _ in found] == ["build"]
    assert "configuration: init_blocks = 2 has no effect under the" in caplog.text
    assert "pool='build'" in caplog.text
