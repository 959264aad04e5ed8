"""A script that calls ``logging.basicConfig()`` gets each Corral record once: Corral
adds no handler of its own unless :func:`runtime.log.configure` is called, and that one
stops propagation to the root logger (docs/configuration.md#logging). Each case runs in
a process of its own (the ``corral`` logger's handlers are process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

EMIT = (
    "from runtime.log import get_logger\n"
    "get_logger('corral.client').warning('lost the manager', address='ws://x')\n"
)


def _stderr(script: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if "lost the manager" in line]


def test_under_basic_config_a_record_is_one_root_line() -> None:
    lines = _stderr("import logging\nlogging.basicConfig()\n" + EMIT)
    assert len(lines) == 1, lines
    assert lines[0].startswith("WARNING:corral.client:timestamp="), lines


def test_configure_prints_corrals_line_alone_not_the_roots_too() -> None:
    lines = _stderr(
        "import logging\nlogging.basicConfig()\n"
        "from runtime.log import configure\nconfigure('WARNING')\n" + EMIT
    )
    assert len(lines) == 1, lines
    assert lines[0].startswith("timestamp="), lines
