"""docs/architecture.md, the truth about the code, cannot fall behind the code unseen.

- Every module of the four packages (``actors``, ``runtime``, ``policies``,
  ``transport``; an empty ``__init__.py`` is no module to describe) is named in it, by
  path (``actors/worker.py``) or dotted name (``actors.worker``), and has a row of its
  own in the "Modules" table, which names no module that is gone.
- Its "Layers" drawing has the rows of the ``layers`` contract of pyproject.toml (what
  ``lint-imports`` checks), in the same order.
- What it cites of the code is there (read from the source: nothing is imported): each
  ``pkg/module.py`` path is a file (and the name after ``path: `` is defined in it),
  each dotted name under the packages (``runtime.node.worker_shape``, or
  ``node.gateway_routes`` for a module name that is unique) is defined, each
  ``Class.attribute`` of a class of the packages is defined on that class or a base,
  and each file it cites elsewhere in the repository (``benchmarks/preemption.py``,
  ``tests/test_layers.py``, ``.ci/run``) exists.
- The links of README.md and docs/*.md to its headings resolve.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("actors", "runtime", "policies", "transport")


@cache
def modules() -> list[str]:
    """The paths of the packages' modules, ``actors/worker.py``: every ``.py`` file of
    each package but an empty ``__init__.py``."""
    return sorted(
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).glob("*.py")
        if path.name != "__init__.py" or path.read_text().strip()
    )


@cache
def tree(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text())


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def named(path: str, text: str) -> bool:
    """Whether ``text`` names the module at ``path``: by its path, or (but for a
    package's ``__init__``, whose dotted name is the package's) by its dotted name."""
    if re.search(rf"(?<![\w/.]){re.escape(path)}", text):
        return True
    if path.endswith("/__init__.py"):
        return False
    return re.search(rf"(?<![\w.]){re.escape(dotted(path))}(?!\w)", text) is not None


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]


def table_modules(text: str) -> list[str]:
    """The module paths in the first column of the "Modules" section's table rows."""
    try:
        body = section(text, "Modules")
    except ValueError:
        return []
    return re.findall(r"^\| `([\w/]+\.py)` \|", body, re.M)


def drawn_layers(text: str) -> list[frozenset[str]]:
    """The rows of the "Layers" section's drawing, as sets of modules: a row's first
    column (up to two spaces) splits at ``|``; a bare name that is not a package is a
    module of the package of the row's first dotted name (``runtime.demo | console``)."""
    drawing = section(text, "Layers").split("```")[1]
    rows = []
    for line in drawing.strip("\n").split("\n"):
        names = [name.strip() for name in re.split(r"\s{2,}", line.strip())[0].split("|")]
        package = next((name.split(".")[0] for name in names if "." in name), "")
        rows.append(
            frozenset(
                name if "." in name or name in PACKAGES else f"{package}.{name}" for name in names
            )
        )
    return rows


def contract_layers() -> list[frozenset[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (layers,) = [
        contract["layers"]
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract["id"] == "layers"
    ]
    return [frozenset(name.strip() for name in row.split("|")) for row in layers]


def spans(text: str) -> set[str]:
    """The inline code spans of ``text`` (outside its fenced blocks)."""
    prose = "".join(text.split("```")[::2])
    return set(re.findall(r"`([^`\n]+)`", prose))


@cache
def class_attributes() -> dict[str, set[str]]:
    """Class name -> the names defined on it (methods, fields, class attributes and
    ``self.x`` assignments), with its bases' by name, over every class of the packages
    (classes of one name in several modules share one set: a lenient check)."""
    own: dict[str, set[str]] = defaultdict(set)
    bases: dict[str, set[str]] = defaultdict(set)
    for path in modules():
        found = [n for n in tree(path).body if isinstance(n, ast.ClassDef)]
        while found:
            node = found.pop()
            found.extend(n for n in node.body if isinstance(n, ast.ClassDef))
            names = own[node.name]
            for base in node.bases:
                bases[node.name].add(ast.unparse(base).split(".")[-1].split("[")[0])
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                    names.add(item.attr)

    def closed(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found = set(own.get(name, ()))
        for base in bases.get(name, set()) - seen:
            found |= closed(base, seen | {name})
        return found

    return {name: closed(name) for name in own}


@cache
def top_level(path: str) -> frozenset[str]:
    """The names a module defines or imports at its top level, and its ``__all__``."""
    names: set[str] = set()
    for node in tree(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names.update(ast.literal_eval(node.value))
    return frozenset(names)


def resolves(name: str) -> bool:
    """Whether ``a.b.c`` is a module of the packages and names defined in it (a class's
    attribute after a class), read from the source: nothing is imported."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = "/".join(parts[:cut])
        path = next(
            (p for p in (f"{base}.py", f"{base}/__init__.py") if (ROOT / p).is_file()), None
        )
        if path is not None:
            break
    else:
        return False
    rest = parts[cut:]
    if not rest:
        return True
    if rest[0] not in top_level(path):
        return False
    return (
        len(rest) == 1
        or rest[0] not in class_attributes()
        or (rest[1] in class_attributes()[rest[0]])
    )


def stale_references(text: str) -> list[str]:
    """The code the text cites that is not there (see the module docstring)."""
    paths = set(modules()) | {f"{package}/__init__.py" for package in PACKAGES}
    unique: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        unique[dotted(path).split(".")[-1]].append(dotted(path))
    classes = class_attributes()
    stale = []
    for span in sorted(spans(text)):
        for path in re.findall(rf"(?<![\w/])((?:{'|'.join(PACKAGES)})/\w+\.py)", span):
            if path not in paths:
                stale.append(span)
        for path in re.findall(
            r"(?<![\w/.])((?:benchmarks|tests|docs|demos|\.ci)/[\w./-]*\w)", span
        ):
            if not (ROOT / path).exists():
                stale.append(span)
        cited = re.fullmatch(rf"((?:{'|'.join(PACKAGES)})/\w+\.py): (\w+)", span)
        if cited and not resolves(f"{dotted(cited[1])}.{cited[2]}"):
            stale.append(span)
        if re.fullmatch(r"\w+\.py", span):  # a module of one package: `scheduler_state.py`
            if len(unique.get(span.removesuffix(".py"), ())) != 1:
                stale.append(span)
            continue
        name = re.fullmatch(r"(\w+(?:\.\w+)+)(?:\(.*\))?", span)
        if name is None:
            continue
        first, rest = name[1].split(".", 1)
        if first in PACKAGES:
            if not resolves(name[1]):
                stale.append(span)
        elif len(unique.get(first, ())) == 1 and first not in classes:
            if not resolves(f"{unique[first][0]}.{rest}"):
                stale.append(span)
        elif first in classes and rest.split(".")[0] not in classes[first]:
            stale.append(span)
    return stale


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    prose = "".join(text.split("```")[::2])
    return {slug(h) for h in re.findall(r"^#+ (.*)$", prose, re.M)}


def broken_links(sources: list[Path]) -> list[str]:
    """The links of ``sources`` to a heading of architecture.md that it lacks."""
    known = anchors(DOC.read_text())
    broken = []
    for source in sources:
        for link, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", source.read_text()):
            target = (source.parent / link).resolve() if link else source.resolve()
            if target == DOC.resolve() and anchor not in known:
                broken.append(f"{source.relative_to(ROOT)}: {link}#{anchor}")
    return broken


# --------------------------------------------------------------------- the checks


def test_the_checks_see_what_they_check() -> None:
    assert "actors/worker.py" in modules() and "runtime/__main__.py" in modules()
    assert named("runtime/node.py", "see `runtime.node.worker_shape`")
    assert not named("actors/worker.py", "`actors.worker_state`")
    assert not named("policies/__init__.py", "`policies.base`")
    assert table_modules("x\n## Modules\n\n| `a/b.py` | b |\n| `c` | no |\n## Next\n") == ["a/b.py"]
    drawing = "\n## Layers\n\n```\n runtime.a | b    top\n actors    below\n```\n"
    assert drawn_layers(drawing) == [frozenset({"runtime.a", "runtime.b"}), {"actors"}]
    assert stale_references("`runtime/gone.py`, `runtime.node.no_such_thing`") == [
        "runtime.node.no_such_thing",
        "runtime/gone.py",
    ]
    assert stale_references("`SchedulerState.no_such`, `node.no_such`") == [
        "SchedulerState.no_such",
        "node.no_such",
    ]
    assert stale_references("`SchedulerState._assign`, `WorkerState.away`") == []
    assert stale_references("`scheduler_state.py`, `no_such_module.py`") == ["no_such_module.py"]
    assert stale_references("`.ci/run`, `tests/test_layers.py`, `benchmarks/gone.py`") == [
        "benchmarks/gone.py"
    ]
    assert slug("The seeds' lessons: where they live") == "the-seeds-lessons-where-they-live"


def test_every_module_is_named() -> None:
    text = DOC.read_text()
    assert [path for path in modules() if not named(path, text)] == []


def test_the_module_table_lists_every_module_once_and_no_other() -> None:
    rows = table_modules(DOC.read_text())
    assert sorted(set(modules()) - set(rows)) == [], "add a row for each to the Modules table"
    assert sorted(set(rows) - set(modules())) == [], "these modules are gone"
    assert len(rows) == len(set(rows)), "a module has two rows"


def registered_messages() -> list[str]:
    """The classes of the packages registered as messages (``@message(...)``)."""
    return sorted(
        node.name
        for path in modules()
        for node in tree(path).body
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(d).startswith("message(") for d in node.decorator_list)
    )


def test_every_message_is_in_the_messages_section() -> None:
    assert "SubmitGraphRequest" in registered_messages() and "Hello" in registered_messages()
    listed = spans(section(DOC.read_text(), "The messages"))
    assert [name for name in registered_messages() if name not in listed] == []


def test_the_layers_drawing_is_the_layers_contract() -> None:
    assert drawn_layers(DOC.read_text()) == contract_layers()


def test_what_it_cites_of_the_code_is_there() -> None:
    assert stale_references(DOC.read_text()) == []


@pytest.mark.parametrize(
    "source",
    sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]),
    ids=lambda p: p.name,
)
def test_links_to_its_headings_resolve(source: Path) -> None:
    assert broken_links([source]) == []
