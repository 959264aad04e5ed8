"""The pool key (runtime/messages.py): the scheduler counts, queues' metrics and stalls
the tasks of a pool under ``pool_key(spec.pool)``, ``"*"`` (``ANY_POOL``) for the tasks
any pool may run; ``pool_of_key`` turns a key back into the pool the watchdogs look
for (None: any), ``pool_name`` says either for people. One helper each, exact values.
No pool is named ``""``, blank or ``"*"``: ``pool_name_problem`` says why, for every
entry that takes a pool's name (tests/test_pool_names.py)."""

from __future__ import annotations

import pytest

from runtime.messages import ANY_POOL, pool_key, pool_name, pool_name_problem, pool_of_key


def test_any_pool_key_is_a_star() -> None:
    assert ANY_POOL == "*"


@pytest.mark.parametrize(("pool", "key"), [(None, "*"), ("gpu", "gpu")])
def test_pool_key(pool: str | None, key: str) -> None:
    assert pool_key(pool) == key


@pytest.mark.parametrize(("key", "pool"), [("*", None), ("gpu", "gpu")])
def test_pool_of_key(key: str, pool: str | None) -> None:
    assert pool_of_key(key) == pool


@pytest.mark.parametrize(("pool", "name"), [(None, "any"), ("*", "any"), ("gpu", "gpu")])
def test_pool_name(pool: str | None, name: str) -> None:
    """The watchdogs' pools are None for any pool, their accounts' keys "*": the log,
    the errors and the console call both ``any``."""
    assert pool_name(pool) == name


@pytest.mark.parametrize("pool", [None, "gpu", "gpu-a100", "owner.2"])
def test_a_key_turns_back_into_its_pool(pool: str | None) -> None:
    assert pool_of_key(pool_key(pool)) == pool


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("gpu", ""),
        ("", "a pool's name is not empty nor blank"),
        (" ", "a pool's name is not empty nor blank"),
        (
            "*",
            "'*' is not a pool's name: it is the key of any pool, under which the tasks "
            "submitted without pool= are counted",
        ),
        (3, "a pool's name is a string, not int"),
    ],
)
def test_the_names_no_pool_may_have(name: object, problem: str) -> None:
    assert pool_name_problem(name) == problem
