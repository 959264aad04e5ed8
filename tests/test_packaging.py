"""What the package metadata says and what the distributions hold (audit wheel.md F2,
F4, F5, F7): the version has one source, ``runtime.messages.CORRAL_VERSION``, which
pyproject.toml reads as setuptools does (``[tool.setuptools.dynamic]``: the module's
literal, without importing it); the sdist holds what its own tests need; the license
text the metadata declares ships in both; each package is marked typed (PEP 561).

These read the configuration; the distributions themselves were checked by building
them (``python -m build``, then ``unzip -l`` and ``tar tzf``, and the sdist's tests
collected and run from the unpacked sdist), which needs the network for setuptools >= 77
and is not a test here."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import runtime
from runtime.messages import CORRAL_VERSION

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _literal(module: str, name: str) -> object:
    """``name``'s value in ``module``, read as setuptools' ``attr:`` reads it first:
    a module-level assignment of a literal, without importing the module."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"no literal assignment of {name} in {path}")


def test_the_package_version_is_read_from_the_one_constant_the_protocol_names() -> None:
    """pyproject.toml states no version of its own: setuptools reads
    ``CORRAL_VERSION`` (a literal string, so without importing msgspec), which is
    ``runtime.__version__`` and what a refusal names (before: two hard-coded copies)."""
    config = _pyproject()
    assert "version" not in config["project"]
    assert "version" in config["project"]["dynamic"]
    attr = config["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    assert (module, name) == ("runtime.messages", "CORRAL_VERSION")
    assert _literal(module, name) == CORRAL_VERSION == runtime.__version__


PACKAGES = ("runtime", "actors", "policies", "transport")


def _manifest() -> list[list[str]]:
    lines = (ROOT / "MANIFEST.in").read_text().splitlines()
    return [line.split() for line in lines if line.strip() and not line.startswith("#")]


def test_the_sdist_holds_the_helpers_docs_and_scripts_its_tests_use() -> None:
    """setuptools puts tests/test_*.py in the sdist by itself, not tests/helpers.py,
    conftest.py and the rest they import (before: 169 of 202 test files failed to
    import in an unpacked sdist), nor the docs, benchmarks and .ci scripts tests read."""
    grafted = {words[1] for words in _manifest() if words[0] == "graft"}
    assert {"tests", "docs", "benchmarks", "demos", ".ci"} <= grafted
    needed = {
        line.split()[1].split(".")[1]
        for path in (ROOT / "tests").glob("*.py")
        for line in path.read_text().splitlines()
        if line.startswith("from tests.") and not line.startswith("from tests.test_")
    }
    assert needed and all((ROOT / "tests" / f"{name}.py").is_file() for name in needed)
    included = {word for words in _manifest() if words[0] == "include" for word in words[1:]}
    assert {"LICENSE", "README.md"} <= included


def test_the_declared_license_ships_its_text() -> None:
    """BSD-3-Clause is declared: its text, with the copyright line, is LICENSE, which
    the metadata names (License-File) so the wheel and the sdist carry it."""
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Copyright (c) 2026, the Corral authors" in text
    assert "3. Neither the name of the copyright holder" in text


def test_each_package_is_marked_typed_and_the_marker_ships() -> None:
    """The packages are checked with mypy --strict: each has py.typed (PEP 561), and
    package-data puts it in the wheel, so a user's mypy reads Corral's annotations."""
    assert all((ROOT / name / "py.typed").is_file() for name in PACKAGES)
    assert _pyproject()["tool"]["setuptools"]["package-data"] == {"*": ["py.typed"]}


def test_the_readme_names_the_console_script_as_the_same_command() -> None:
    """The printed hints say ``python -m runtime``; the README says once that the
    installed console script (pyproject's ``[project.scripts]``) is the same command
    (audit wheel.md F6: before, only docs/architecture.md named it)."""
    scripts = _pyproject()["project"]["scripts"]
    (name,) = [n for n, target in scripts.items() if target == "runtime.__main__:main"]
    readme = " ".join((ROOT / "README.md").read_text().split())  # lines joined
    assert readme.count(f"the `{name}` script") == 1
    assert f"`{name} --workers 4` is `python3 -m runtime --workers 4`" in readme
