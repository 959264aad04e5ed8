"""``CORRAL_SIGNAL_WARNING`` (a Slurm pool's ``signal_warning``, which its block's
script exports) with a bad value is refused as the other numeric variables are: a
``ValueError`` that names the variable, its value and what to set, raised before the
worker joins. Before, a bad value was silently 0, so a walltime stop could be told as
a preemption."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from runtime.node import _signal_warning
from tests.helpers import ROOT, free_port_between


@pytest.mark.parametrize("text", ["abc", "-5", "nan", "inf", "2m"])
def test_a_bad_value_is_refused_saying_what_to_set(text: str) -> None:
    with pytest.raises(ValueError) as info:
        _signal_warning({"CORRAL_SIGNAL_WARNING": text})
    assert str(info.value).startswith(
        f"CORRAL_SIGNAL_WARNING={text!r} is not a number of seconds >= 0 "
    ), info.value
    assert "set it to one (such as 120), or unset it for none" in str(info.value)


@pytest.mark.parametrize(
    ("text", "seconds"), [("", 0.0), (" ", 0.0), ("0", 0.0), ("120", 120.0), ("1.5", 1.5)]
)
def test_a_good_value_or_none_is_read(text: str, seconds: float) -> None:
    assert math.isclose(_signal_warning({"CORRAL_SIGNAL_WARNING": text}), seconds)
    assert _signal_warning({}) == 0.0


def test_a_worker_with_a_bad_value_stops_before_it_joins() -> None:
    """Nothing listens at the address: the worker stops on the variable before it
    tries to reach a manager (exit 1, the error on stderr)."""
    address = f"ws://127.0.0.1:{free_port_between(57500, 57999)}"
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", address],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env=dict(os.environ, CORRAL_SIGNAL_WARNING="abc"),
    )  # fmt: skip
    assert done.returncode == 1, done
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("error: ValueError: CORRAL_SIGNAL_WARNING='abc' is not a number"), err
    assert "could not reach" not in done.stderr, done.stderr
