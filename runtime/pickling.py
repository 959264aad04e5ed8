"""Pickling by value that keeps file names: :func:`cloudpickle_dumps`, the one way
Corral pickles what ``pickle`` cannot (a task's function defined in a script run as
``__main__``, a lambda); :mod:`runtime.unpickling` loads it. (Its own module: the
pure cores' modules import :mod:`runtime.graph`, which pickles with it, and may not
import ``threading``, which :mod:`runtime.unpickling` does.)"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Callable
from typing import Any

__all__ = ["cloudpickle_dumps"]


def cloudpickle_dumps(
    obj: Any, protocol: int = 5, buffer_callback: Callable[[Any], Any] | None = None
) -> bytes:
    """``obj`` pickled by cloudpickle (protocol 5), keeping the file names of the code
    it pickles by value: the one way Corral pickles what ``pickle`` cannot (a function
    of a script run as ``__main__``, a lambda).

    cloudpickle (3.1) writes every such code object's file as ``<dynamic-code>``, so a
    task's traceback read ``File "<dynamic-code>", line 28, in parse``: no file, no
    source line. Here the code keeps its ``co_filename``; a traceback names the
    script's file and, where that file can be read (the client's machine, a worker on
    the same machine or a shared file system), shows its line."""
    import io

    out = io.BytesIO()
    _file_keeping_pickler()(out, protocol=protocol, buffer_callback=buffer_callback).dump(obj)
    return out.getvalue()


def _code_reduce_keeping_file(code: types.CodeType) -> tuple[Any, tuple[Any, ...]]:
    from cloudpickle import cloudpickle as inner

    constructor, args = inner._code_reduce(code)
    at = _filename_at()
    if at is None:  # a cloudpickle that no longer blanks it (or builds it otherwise)
        return constructor, args
    return constructor, (*args[:at], code.co_filename, *args[at + 1 :])


@functools.cache
def _filename_at() -> int | None:
    """Where cloudpickle's code reducer puts ``co_filename`` among its arguments."""
    from cloudpickle import cloudpickle as inner

    probe = compile("pass", "<corral-probe>", "exec")
    _, args = inner._code_reduce(probe)
    found = [i for i, arg in enumerate(args) if arg == "<dynamic-code>"]
    return found[0] if len(found) == 1 else None


@functools.cache
def _file_keeping_pickler() -> type:
    """cloudpickle's pickler, with its code reducer keeping file names; cloudpickle's
    own where it has no ``_code_reduce`` to wrap (a later version: file names as it
    writes them, nothing else changed)."""
    import cloudpickle
    from cloudpickle import cloudpickle as inner

    if not callable(getattr(inner, "_code_reduce", None)):  # pragma: no cover
        return cloudpickle.CloudPickler  # type: ignore[no-any-return]

    class FileKeepingPickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        dispatch_table = collections.ChainMap(
            {types.CodeType: _code_reduce_keeping_file}, cloudpickle.CloudPickler.dispatch_table
        )

    return FileKeepingPickler
