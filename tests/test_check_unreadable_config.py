"""``python -m runtime check --config FILE`` on a file it cannot read as TOML reports a
``FAIL`` row and its summary, as for any other refused configuration (docs/api.md,
``PoolConfigError``).

A bad-input audit: a file that is not valid TOML (``[pools.a`` with no ``]``) printed one
bare ``error: PoolConfigError: ...`` line and exited 1, with no FAIL row, none of the
other checks and no summary. Each run is a real ``check`` process, bounded
(tests/test_preflight.py's ``check``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.test_preflight import ROOT, check, results


def test_a_file_that_is_not_toml_is_a_fail_row_with_the_summary(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    done = check(tmp_path, "[pools.a\n", "--no-probe", "--spill-dir", str(spill))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error:" not in done.stderr
    first, advice, spilled, summary = done.stdout.splitlines()
    assert first.startswith("FAIL  *  config") and "is not valid TOML: Expected ']'" in first
    assert "corral.toml" in first and "(at line 1, column 9)" in first
    assert advice.strip().startswith("-> fix it in ") and "corral.toml" in advice
    assert spilled.startswith("PASS  *  spill directory") and str(tmp_path) in spilled
    assert summary == "2 checks: 1 failed, 0 warnings"
    done = check(tmp_path, "[pools.a\n", "--no-probe", "--json")
    assert done.returncode == 1 and done.stderr == ""
    row = results(done)["*", "config"]
    assert row["status"] == "FAIL"
    assert "is not valid TOML" in row["detail"]


def test_a_file_that_is_not_utf8_or_not_there_is_a_fail_row_too(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[pools.caf\xe9]\nprovider = "local"\n'.encode("latin-1"))
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    for config, why in ((path, "is not UTF-8 text"), (tmp_path / "nope.toml", "cannot read")):
        done = subprocess.run(
            [sys.executable, "-m", "runtime", "check", "--config", str(config), "--no-probe"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 1 and "error:" not in done.stderr, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("FAIL  *  config") and config.name in lines[0]
        assert why in lines[0]
        assert lines[-1].endswith(" checks: 1 failed, 0 warnings")  # (and its directories)
