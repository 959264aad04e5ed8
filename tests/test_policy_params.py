"""Policy parameters are checked by their declared type, in one place: the registry.

Pure tests: ``REGISTRY.create`` (what ``set_policy``, ``Cluster(policies=...)`` and the
console's ``policy set`` end in) with bad parameters; each names the policy, the
parameter, the value given and the type wanted.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest

from policies import REGISTRY, PolicyParamsError, PolicyRegistry
from runtime.console import _params as console_params


def refused(
    kind: str, name: str, params: dict[str, Any], registry: PolicyRegistry = REGISTRY
) -> str:
    """The message of the error creating the policy raises; it must be exactly a
    ``PolicyParamsError`` naming the policy."""
    with pytest.raises(PolicyParamsError) as info:
        registry.create(kind, name, params)
    assert type(info.value) is PolicyParamsError
    assert (info.value.kind, info.value.name) == (kind, name)
    text = str(info.value)
    assert f"{kind} policy {name!r}" in text
    return text


# ----------------------------------------------------------------------------- one per type


@pytest.mark.parametrize("bad", ["False", "no", "true", 0, 1, None])
def test_a_bool_parameter_takes_only_true_or_false(bad: Any) -> None:
    text = refused("retry", "default", {"charge_lost": bad})
    assert f"charge_lost must be true or false (a bool), got {bad!r}" in text
    assert "charge_lost=true or charge_lost=false" in text  # what to write instead


@pytest.mark.parametrize("bad", [1.5, float("nan"), float("inf"), "3", "abc", True, None, [3]])
def test_an_int_parameter_refuses_fractions_text_and_bools(bad: Any) -> None:
    text = refused("retry", "default", {"max_lost": bad})
    assert f"max_lost must be a whole number (an int), got {bad!r} ({type(bad).__name__})" in text


def test_an_int_parameter_takes_a_whole_float_as_an_int() -> None:
    policy = REGISTRY.create("retry", "default", {"max_lost": 2.0, "max_oom": 3})
    assert (policy.max_lost, policy.max_oom) == (2, 3)
    assert policy.params == {"max_lost": 2, "max_oom": 3}
    assert type(policy.params["max_lost"]) is int
    assert REGISTRY.create("replication", "fixed", {"replicas": 2.0}).count == 2


@pytest.mark.parametrize("bad", ["fast", "5e8", True, False, None, {"x": 1}])
def test_a_float_parameter_takes_numbers_only(bad: Any) -> None:
    text = refused("placement", "locality", {"bandwidth": bad})
    assert f"bandwidth must be a number (a float or an int), got {bad!r}" in text


def test_a_float_parameter_takes_ints_and_floats() -> None:
    assert REGISTRY.create("placement", "locality", {"bandwidth": 5}).bandwidth == 5.0
    assert REGISTRY.create("placement", "locality", {"bandwidth": 2.5e8}).bandwidth == 2.5e8


def test_an_optional_parameter_takes_none_and_says_so() -> None:
    assert REGISTRY.create("scaling", "demand", {"max_headroom": None}).max_headroom is None
    text = refused("scaling", "demand", {"max_headroom": "2"})
    assert "max_headroom must be a whole number (an int) or None" in text


def test_a_mapping_parameter_takes_a_mapping() -> None:
    text = refused("retry", "default", {"fallback": "ckpt:owner"})
    assert "fallback must be a mapping (a dict)" in text and "'ckpt:owner'" in text
    assert REGISTRY.create("retry", "default", {"fallback": {"a": "b"}}).fallback == {"a": "b"}


def test_every_bad_parameter_is_named_at_once() -> None:
    text = refused("speculation", "idle-tail", {"factor": "2", "max_copies": 0.5})
    assert "factor must be a number" in text and "max_copies must be a whole number" in text


# ----------------------------------------------------------------------------- the audit


def test_charge_lost_false_from_the_console_is_refused_not_turned_on() -> None:
    """``policy set retry default charge_lost=False``: the console keeps non-JSON text
    as text; it used to become ``bool('False')``, on."""
    for typed in ("charge_lost=False", "charge_lost=no"):
        params = console_params([typed])
        assert isinstance(params["charge_lost"], str)
        text = refused("retry", "default", params)
        assert "charge_lost" in text and "true or false" in text
    assert (
        REGISTRY.create("retry", "default", console_params(["charge_lost=false"])).charge_lost
        is False
    )
    assert (
        REGISTRY.create("retry", "default", console_params(["charge_lost=true"])).charge_lost
        is True
    )


def test_max_lost_of_one_and_a_half_is_refused_not_cut_to_one() -> None:
    text = refused("retry", "default", console_params(["max_lost=1.5"]))
    assert "max_lost must be a whole number (an int), got 1.5 (float)" in text


@pytest.mark.parametrize(
    ("kind", "name", "param", "bad", "wanted"),
    [
        ("retry", "default", "max_lost", "abc", "a whole number (an int)"),
        ("placement", "locality", "bandwidth", "fast", "a number (a float or an int)"),
        ("replication", "recompute-cost", "threshold", "x", "a number (a float or an int)"),
    ],
)
def test_text_for_a_number_names_the_parameter_and_the_type_wanted(
    kind: str, name: str, param: str, bad: str, wanted: str
) -> None:
    """These used to end in ``'<' not supported between instances of 'str' and 'int'``."""
    text = refused(kind, name, console_params([f"{param}={bad}"]))
    assert f"{param} must be {wanted}, got {bad!r} (str)" in text
    assert "not supported between" not in text


# ----------------------------------------------------------------------------- unchanged


def test_range_checks_keep_their_messages() -> None:
    assert "max_lost must be >= 0" in refused("retry", "default", {"max_lost": -1})
    assert "bandwidth must be positive" in refused("placement", "locality", {"bandwidth": 0})
    assert "ratio must be > 0" in refused("memory", "producers-yield", {"ratio": 0})


def test_an_unknown_parameter_is_named_with_the_closest_and_the_list() -> None:
    """A user audit: `policy set retry default max_lots=3` answered with the Python of
    DefaultRetry.__init__() and no list of the parameters there are."""
    assert refused("retry", "default", {"max_lots": 3}) == (
        "bad parameters for retry policy 'default': no parameter 'max_lots'; did you mean "
        "'max_lost'? (its parameters: max_lost, charge_lost, max_oom, max_crashes, "
        "fallback, max_disk_full, backoff, max_backoff, resumable_keeps_place, lost_keeps_place). "
        "See "
        "docs/policies.md for the parameters each policy takes."
    )
    text = refused("placement", "locality", {"colour": "red"})
    assert "no parameter 'colour' (its parameters: bandwidth, min_duration)" in text
    assert "no parameter 'extra' (it takes none)" in refused("priority", "long-first", {"extra": 1})
    # with a bad value beside it, both are named at once
    text = refused("retry", "default", {"max_lots": 3, "max_lost": "abc"})
    assert "no parameter 'max_lots'" in text and "max_lost must be" in text


def test_any_registered_policy_is_checked_by_its_signature() -> None:
    """The check is the registry's: a policy of one's own gets it from its annotations,
    and ``Annotated`` wording replaces the generic one."""
    registry = PolicyRegistry()

    @registry.register("retry", "mine")
    def mine(
        loud: bool = False,
        tries: Annotated[int, "a whole number of tries"] = 1,
        anything: Any = None,
        **extra: Any,
    ) -> Any:
        return type("Mine", (), {"loud": loud, "tries": tries, "decide": print})()

    assert "loud must be true or false" in refused("retry", "mine", {"loud": "yes"}, registry)
    text = refused("retry", "mine", {"tries": "2"}, registry)
    assert "tries must be a whole number of tries (int), got '2' (str)" in text
    policy = registry.create("retry", "mine", {"loud": True, "anything": "x", "other": 1})
    assert policy.loud is True


def test_a_negative_min_duration_is_refused() -> None:
    with pytest.raises(PolicyParamsError, match=r"min_duration must be >= 0 seconds"):
        REGISTRY.create("placement", "locality", {"min_duration": -1})
