"""Who submits: a client's name (``Cluster(..., name=)``) and its id on the wire.

Apart from runtime/graph.py (dask) so that what only names clients (the policies'
views, the monitoring database, the report) imports nothing heavy.
"""

from __future__ import annotations

import os
import re

__all__ = ["CONSOLE", "client_id", "client_name", "console_id"]


#: What a client's name (``Cluster(..., name=)``) may be: letters, digits, ``.``, ``_``
#: and ``-``, starting with a letter or digit, at most 40 characters.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
#: A client's id: its name, ``-`` and 12 hexadecimal digits (unique per connection).
_CLIENT_ID = re.compile(r"(.+)-[0-9a-f]{12}")
#: What a console's id starts with (:func:`console_id`): a client's name has no ``:``,
#: so a name shown as ``console:alice`` is a console's operator, never a client's.
CONSOLE = "console"


def _user_name() -> str:
    """The user name of this process (``getpass.getuser``) made a valid client name,
    or "" when it has none."""
    import getpass

    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without one)
        return ""
    return re.sub(r"[^A-Za-z0-9._-]", "_", user).lstrip("._-")[:40]


def _checked(name: object, what: str, fix: str) -> str:
    """``name`` if it is a valid client name, else ``ValueError`` saying so, what the
    name is for (``what``) and how to give one (``fix``)."""
    if not isinstance(name, str) or not _CLIENT_NAME.fullmatch(name):
        raise ValueError(
            f"name must be 1 to 40 letters, digits, '.', '_' or '-' starting with a letter "
            f"or digit ({what}), got {name!r}: {fix}, or leave it out for your user name"
        )
    return name


def client_id(name: str | None = None) -> str:
    """A new client id: ``name`` (default: this process's user name; ``client`` when it
    has none), ``-`` and 12 random hexadecimal digits. ``ValueError`` for a name that is
    not a string of 1 to 40 letters, digits, ``.``, ``_`` or ``-`` starting with a
    letter or digit."""
    if name is None:
        name = _user_name() or "client"
    what = "who submits, as the console and the policies show it"
    return f"{_checked(name, what, 'say name=' + repr('alice'))}-{os.urandom(6).hex()}"


def console_id(name: str | None = None) -> str:
    """A new console id: ``console:``, the operator's ``name`` (default: this process's
    user name), ``-`` and 12 random hexadecimal digits, so :func:`client_name` of it is
    ``console:alice``; ``console-`` and the digits (``console``) for a process with no
    user name. ``ValueError`` for a name a client could not have (:func:`client_id`)."""
    if name is None:
        name = _user_name()
    else:
        what = "who operates, as a policy change's records show it"
        name = _checked(name, what, "pass --name alice (ConsoleClient(..., name='alice'))")
    tail = os.urandom(6).hex()
    return f"{CONSOLE}:{name}-{tail}" if name else f"{CONSOLE}-{tail}"


def client_name(client: str) -> str:
    """The name of the client whose id is ``client`` (:func:`client_id`): the id less its
    random tail; an id of another shape as it is ("" stays "": not known)."""
    match = _CLIENT_ID.fullmatch(client)
    return match.group(1) if match else client
