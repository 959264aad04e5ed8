"""docs/api.md's errors table names every public error class, so it cannot drift.

A *public* error class is one a user can catch by name:

- every subclass of ``runtime.errors.CorralError`` (and ``CorralError`` itself) whose
  name does not start with ``_``, wherever it is defined;
- every other exception class (a ``BaseException`` subclass, name not starting with
  ``_``) that a module of Corral's packages (``runtime``, ``actors``, ``policies``,
  ``transport``) lists in its ``__all__``, unless :data:`INTERNAL` says why no user
  meets it.

It is *named in the table* when it appears in backticks in the first column of a row
of the ``## Errors`` section of docs/api.md.
"""

from __future__ import annotations

import builtins
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import runtime
import runtime.errors
from runtime.errors import CorralError

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"
PACKAGES = ("runtime", "actors", "policies", "transport")

#: exception classes exported by a module that no user meets, and why; a new one
#: belongs in the table or here, with its reason
INTERNAL = {
    "actors.store.Unpicklable": "the worker turns it into ResultNotPicklable",
    "actors.transfer.StreamBroken": "the reader resumes the stream or asks another holder",
}


def _modules() -> list[object]:
    mods = []
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        mods.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, name + "."):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                mods.append(importlib.import_module(info.name))
    return mods


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


@pytest.fixture(scope="module")
def modules() -> list[object]:
    return _modules()


def public_errors(modules: list[object]) -> dict[str, type]:
    """The public error classes (see the module's docstring), by qualified name."""
    found: set[type] = {  # modules imported first; a test's own subclass is not one
        c
        for c in (CorralError, *_subclasses(CorralError))
        if c.__module__.split(".")[0] in PACKAGES
    }
    for mod in modules:
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name, None)
            if (
                isinstance(obj, type)
                and issubclass(obj, BaseException)
                and obj.__module__.split(".")[0] in PACKAGES
            ):
                found.add(obj)
    return {
        f"{c.__module__}.{c.__qualname__}": c
        for c in found
        if not c.__name__.startswith("_") and f"{c.__module__}.{c.__qualname__}" not in INTERNAL
    }


def table_names(text: str) -> set[str]:
    """The names in backticks in the first column of the rows of ``## Errors``."""
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            names |= set(re.findall(r"`([A-Za-z_]\w*)`", line.split("|")[1]))
    return names


def test_table_names_every_public_error(modules: list[object]) -> None:
    named = table_names(API.read_text())
    missing = sorted(
        name for name, cls in public_errors(modules).items() if cls.__name__ not in named
    )
    assert not missing, (
        f"docs/api.md's errors table has no row naming {', '.join(missing)}: add one (when "
        "it is raised, what to do, what it derives from), or, for an exported exception no "
        "user meets, add it to INTERNAL with why"
    )


def test_table_names_only_errors_that_exist(modules: list[object]) -> None:
    names = {cls.__name__ for cls in public_errors(modules).values()}
    stale = sorted(
        n for n in table_names(API.read_text()) if n not in names and not hasattr(builtins, n)
    )
    assert not stale, f"docs/api.md's errors table names {', '.join(stale)}, no such error class"


def test_corral_errors_live_in_runtime_errors_and_are_exported(modules: list[object]) -> None:
    """What the table's introduction says: every CorralError is defined in
    ``runtime.errors`` (and exported by it, so ``from runtime.errors import X`` and
    ``from runtime import X`` find it)."""
    ours = {
        c
        for c in _subclasses(CorralError)
        if not c.__name__.startswith("_") and c.__module__.split(".")[0] in PACKAGES
    }  # (a test's own subclass is not the project's)
    elsewhere = sorted(
        f"{c.__module__}.{c.__name__}" for c in ours if c.__module__ != "runtime.errors"
    )
    assert not elsewhere, f"CorralErrors defined outside runtime.errors: {elsewhere}"
    for where in (runtime.errors, runtime):
        unlisted = sorted(c.__name__ for c in ours if c.__name__ not in where.__all__)
        assert not unlisted, f"{where.__name__}.__all__ lacks {unlisted}"


def test_table_parser_sees_rows() -> None:
    """The parser reads the table (a broken heading would make every check vacuous)."""
    names = table_names(API.read_text())
    assert {"CorralError", "GraphError", "ConnectFailed", "AuthenticationFailed"} <= names
