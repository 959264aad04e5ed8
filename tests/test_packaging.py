"""What the package metadata says (audit wheel.md F2): the version has one source,
``runtime.messages.CORRAL_VERSION``, which pyproject.toml reads as setuptools does
(``[tool.setuptools.dynamic]``: the module's literal, without importing it)."""

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
