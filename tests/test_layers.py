"""The module graph is a stack without cycles (docs/architecture.md, "Layers").

`lint-imports` (in .ci/run) checks the layers contract of pyproject.toml. These tests
check what it does not: no cycle between any two modules of the four packages (across
packages too), and, at run time, that the layers below the user API load without it
although the package ``runtime`` re-exports ``Cluster``, ``Future`` and ``get``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "actors", "policies", "transport")
USER_API = ("runtime.client", "runtime.node", "runtime.console", "runtime.demo")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    # Every import statement counts: function-local and TYPE_CHECKING ones too, and a
    # package's __init__ is a module like the others.
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert len(edges) > 30  # the graph really holds the project
    assert cycles(edges) == []


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(done.stdout.split())


def test_the_layers_below_the_user_api_load_without_it() -> None:
    loaded = _loaded_after(
        "import runtime, runtime.kernel, runtime.lifeline, transport, policies, "
        "runtime.remote, actors.worker, actors.processes, actors.autoscaler, "
        "actors.manager, actors.registry, actors.scheduler"
    )
    assert "actors.worker" in loaded
    assert not loaded & set(USER_API)


def test_the_user_api_is_still_importable_from_the_package() -> None:
    loaded = _loaded_after(
        "from runtime import Cluster, Future, get\n"
        "import runtime.client as c\n"
        "assert (Cluster, Future, get) == (c.Cluster, c.Future, c.get)"
    )
    assert "runtime.client" in loaded


def test_every_error_is_importable_from_the_package() -> None:
    """docs/api.md: the errors are in ``runtime.errors``, also re-exported by ``runtime``
    (all of them: ``from runtime import TaskTooLarge`` failed before)."""
    import runtime
    import runtime.errors as errors

    mine = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }
    assert len(mine) > 40
    assert {
        name for name in mine if getattr(runtime, name, None) is not vars(errors)[name]
    } == set()
    assert mine <= set(runtime.__all__)
