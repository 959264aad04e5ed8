"""Corral's four top-level packages come from one installation, or a clear error.

What lives here: :func:`check_packages`, run when this module is imported, which
``runtime/__init__.py`` does before it imports anything else of Corral's; and
:func:`working_directory_last`, for the worker processes Corral starts. Corral installs
four generic top-level names (:data:`PACKAGES`); a user's own ``policies/`` folder or
``transport.py`` next to the script (or in the working directory under ``python -m``)
comes first on ``sys.path`` and would be imported in their place, failing later with
an obscure ``ImportError`` (``cannot import name 'DEFAULTS' from 'policies'``). The
check finds where each would be imported from without importing it
(:func:`importlib.util.find_spec`) and raises :class:`~runtime.errors.PackageShadowed`
naming the file or folder.

The worker processes Corral starts (:func:`runtime.node.worker_argv`) run as
``python -P -m runtime worker`` (not when Corral's own directory is the working one, a
checkout run in place: there ``-P`` would import another copy of Corral): ``-P`` keeps
the working directory off the front of ``sys.path``, so a user's ``policies/`` there
cannot shadow Corral's, and the worker puts it back at the end
(:func:`working_directory_last`), so a task's function from a module there
(``mymod.py``, pickled by reference) still loads, in the worker and in its task
processes (``spawn`` gives them the worker's ``sys.path``).

Base layer: it imports nothing of Corral's but ``runtime.errors``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from runtime.errors import PackageShadowed

__all__ = ["PACKAGES", "check_packages", "corral_home", "working_directory_last"]

#: Corral's top-level packages, installed side by side
PACKAGES = ("runtime", "actors", "policies", "transport")


def corral_home() -> Path:
    """The directory that holds Corral's packages: this ``runtime``'s parent."""
    return Path(__file__).resolve().parent.parent


def _found(name: str) -> Path | None:
    """Where ``import name`` takes (or took) the top-level ``name`` from: a package's
    folder or a module's file; None when not found or not a file on disk (a zip, a
    frozen build: then nothing is checked). Nothing is imported."""
    module = sys.modules.get(name)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
    except (ImportError, ValueError):  # (a module in sys.modules without a __spec__)
        return None
    if spec is None:
        return None
    if spec.origin is None or not spec.has_location:
        # A namespace package (a folder without __init__.py) would have lost to Corral's
        # regular package further on sys.path: it is one only when Corral's is missing.
        locations = list(spec.submodule_search_locations or ())
        return Path(locations[0]) if locations else None
    origin = Path(spec.origin)
    return origin.parent if spec.submodule_search_locations is not None else origin


def check_packages() -> None:
    """Raise :class:`~runtime.errors.PackageShadowed` if one of Corral's packages other
    than this ``runtime`` would be imported from outside :func:`corral_home` (a user's
    module or folder of that name first on ``sys.path``)."""
    home = corral_home()
    for name in PACKAGES[1:]:
        where = _found(name)
        if where is None:
            continue
        if where.resolve() != home / name:
            raise PackageShadowed(name, str(where), str(home))


def working_directory_last() -> None:
    """In a process started with ``python -P`` (Corral's own worker processes), add the
    working directory at the end of ``sys.path``, where ``-P`` left it out: modules of
    the user's there load (a task's function pickled by reference), after Corral's
    packages and everything installed. Without ``-P`` nothing changes (the working
    directory, or the script's, is first already)."""
    if not sys.flags.safe_path:
        return
    # Corral's own directory first: an editable install's finder (a `pip install -e`)
    # is asked only after every sys.path entry, the working directory's too, and this
    # process's task processes (spawned) import Corral's packages afresh from this path.
    for entry in (str(corral_home()), os.getcwd()):
        if entry not in sys.path:
            sys.path.append(entry)


check_packages()  # at import: `import runtime` runs this first (runtime/__init__.py)
