"""Corral's directory of the user's: ``$CORRAL_HOME``, else ``~/.corral``.

It holds the managers' token files (``tokens/``), their run directories (``runs/``)
and the console's history. Whoever makes it first (a manager, a console), it is made
the same way, by :func:`private_dir`: readable by its owner only (0700), as are the
directories Corral makes in it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["corral_home", "private_dir"]


def corral_home() -> Path:
    """``$CORRAL_HOME`` if set (and not empty), else ``~/.corral``."""
    return Path(os.environ.get("CORRAL_HOME") or Path.home() / ".corral")


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
