"""A user's module or folder named like one of Corral's top-level packages (``runtime``,
``actors``, ``policies``, ``transport``) next to the script or in the working directory
(audit wheel.md F1): importing ``runtime`` says which file shadows which package
(``PackageShadowed``) instead of an obscure ImportError later; the worker processes
Corral starts (``python -P -m runtime worker``) are not shadowed, and still load a
task's function from a module in their working directory. Real processes; ports in
43500-43999."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.errors import CorralError, PackageShadowed

ROOT = Path(__file__).resolve().parent.parent


def _shadow(where: Path, kind: str) -> Path:
    """Make ``where``'s shadowing module: ``policies/`` (a package) or ``transport.py``."""
    if kind == "policies":
        (where / "policies").mkdir()
        (where / "policies" / "__init__.py").write_text("ppo = 1\n")
        return where / "policies"
    (where / "transport.py").write_text("def ship(x):\n    return x\n")
    return where / "transport.py"


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", ["policies", "transport"])
def test_python_m_runtime_in_a_directory_that_shadows_a_package_says_which(
    tmp_path: Path, kind: str
) -> None:
    """``python -m runtime`` puts the working directory first on sys.path: a
    ``policies/`` or ``transport.py`` there stops it at once, naming the shadow, the
    package, and what to do (before: ``cannot import name 'DEFAULTS' from
    'policies'``, or ``No module named 'transport.ws'``)."""
    shadow = _shadow(tmp_path, kind)
    done = _run([sys.executable, "-m", "runtime", "version"], tmp_path)
    assert done.returncode == 1, done
    line = (
        f"runtime.errors.PackageShadowed: {shadow} shadows Corral's package {kind!r} "
        f"(Corral is installed in {ROOT})"
    )
    assert done.stderr.count(line) == 1, done.stderr
    assert "Rename it, or run from another directory" in done.stderr


def test_a_script_next_to_a_module_named_actors_gets_the_error_at_import(
    tmp_path: Path,
) -> None:
    """``python run.py`` puts the script's directory first: ``import runtime`` raises
    PackageShadowed (an ImportError) for the ``actors.py`` beside it, before anything
    imports it."""
    (tmp_path / "actors.py").write_text("x = 1\n")
    (tmp_path / "run.py").write_text(
        textwrap.dedent("""\
            import sys
            try:
                import runtime
            except ImportError as exc:
                print(type(exc).__name__, exc.package, exc.shadow, "actors" in sys.modules)
            """)
    )
    done = _run([sys.executable, "run.py"], tmp_path)
    assert done.returncode == 0, done
    assert done.stdout.split() == [
        "PackageShadowed",
        "actors",
        str(tmp_path / "actors.py"),
        "False",
    ]


def test_the_error_is_an_import_error_that_pickles() -> None:
    err = PackageShadowed("policies", "/p/policies", "/site")
    assert isinstance(err, ImportError) and isinstance(err, CorralError)
    back = pickle.loads(pickle.dumps(err))
    assert (back.package, back.shadow, back.corral, str(back)) == (
        "policies", "/p/policies", "/site", str(err)
    )  # fmt: skip


DRIVER = """\
import os, sys
import anyio
from runtime import Cluster  # all of Corral loaded; the working directory is not on sys.path

sys.path.append(os.getcwd())  # as a console script's user would for mymod
import mymod

# one worker in process execution: a task process (spawned, with the worker's sys.path)
# loads mymod.triple and runs it
POOLS = {"default": {"min_blocks": 1, "worker_port_range": "43510-43519", "execution": "process"}}


async def main():
    with anyio.fail_after(60):
        async with Cluster(pools=POOLS, processes=True, port=43500) as c:
            await c.wait_for_workers(1, timeout=45)
            print(await c.submit(mymod.triple, 5))


anyio.run(main)
"""


@pytest.mark.slow
def test_local_worker_processes_started_in_a_shadowing_directory_run_its_tasks(
    tmp_path: Path,
) -> None:
    """A client (not itself shadowed, as the ``corral`` console script is not) started
    in a directory with a ``policies/`` folder and a ``mymod.py``: its local worker
    processes start there (``python -P``: the folder does not shadow Corral's
    ``policies``), and their task processes load ``mymod.triple`` (pickled by
    reference) from that directory (before: every worker crashed on
    ``cannot import name 'DEFAULTS' from 'policies'``, and the run ended in
    WorkersTimeout)."""
    project = tmp_path / "project"
    project.mkdir()
    _shadow(project, "policies")
    (project / "mymod.py").write_text("def triple(x):\n    return 3 * x\n")
    (tmp_path / "driver.py").write_text(DRIVER)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py")],
        cwd=project, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["15"]


def test_worker_processes_run_with_safe_path_unless_corral_is_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-P`` keeps a user's folder in the working directory from shadowing Corral in
    the workers it starts; but where Corral itself is the working directory (a checkout,
    run in place, installed or not), ``-P`` would make them import another copy of
    Corral (an installed one) or none, while no folder there can shadow it: no ``-P``
    then (review 1206f: the workers of a manager run in a checkout loaded the installed
    copy)."""
    from runtime.node import worker_argv
    from runtime.packages import corral_home

    monkeypatch.chdir(tmp_path)
    assert worker_argv("ws://h:1", 1, 0, "p")[1:5] == ["-P", "-m", "runtime", "worker"]
    monkeypatch.chdir(corral_home())
    assert worker_argv("ws://h:1", 1, 0, "p")[1:4] == ["-m", "runtime", "worker"]
