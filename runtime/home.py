"""Corral's directory of the user's: ``$CORRAL_HOME``, else ``~/.corral``.

It holds the managers' token files (``tokens/``), their run directories (``runs/``)
and the console's history. Whoever makes it first (a manager, a console), it is made
the same way, by :func:`private_dir`: readable by its owner only (0700), as are the
directories Corral makes in it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from runtime.errors import CorralHomeDenied, CorralHomeError

__all__ = ["corral_home", "private_dir"]


def corral_home() -> Path:
    """``$CORRAL_HOME`` if set (and not empty), else ``~/.corral``;
    :class:`~runtime.errors.CorralHomeError` if it is a file or under one (it could not
    be made a directory), :class:`~runtime.errors.CorralHomeDenied` if it is under a
    directory this user may not enter, naming the variable and what to set."""
    given = os.environ.get("CORRAL_HOME")
    home = Path(given or Path.home() / ".corral")
    denied = False
    for path in (home, *home.parents):  # the nearest that exists must be a directory
        try:
            mode = path.stat().st_mode
        except PermissionError:  # a directory above it may not be entered: which one?
            denied = True
            continue
        except OSError:  # not there (or under a file, or a symlink loop): the one above
            continue
        if denied:  # the nearest this user reaches: the one it may not enter
            raise CorralHomeDenied(str(home), str(path), bool(given), os.geteuid())
        if stat.S_ISDIR(mode):
            break
        raise CorralHomeError(str(home), str(path), bool(given))
    return home


def private_dir(directory: Path) -> None:
    """Make ``directory`` and its missing parents readable by their owner only (0700):
    what Corral keeps there (tokens, every task's key and error in a monitoring
    database, console commands) is this user's. Existing ones are left as they are.
    ``OSError`` as ``mkdir``'s."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        if directory.parent == directory:
            break
        directory = directory.parent
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
