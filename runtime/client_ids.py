"""Who submits: a client's name (``Cluster(..., name=)``) and its id on the wire.

Apart from runtime/graph.py (dask) so that what only names clients (the policies'
views, the monitoring database, the report) imports nothing heavy.
"""

from __future__ import annotations

import os
import re

__all__ = ["client_id", "client_name"]


#: What a client's name (``Cluster(..., name=)``) may be: letters, digits, ``.``, ``_``
#: and ``-``, starting with a letter or digit, at most 40 characters.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
#: A client's id: its name, ``-`` and 12 hexadecimal digits (unique per connection).
_CLIENT_ID = re.compile(r"(.+)-[0-9a-f]{12}")


def _default_client_name() -> str:
    """The user name of this process (``getpass.getuser``) made a valid client name,
    or ``client`` when it has none."""
    import getpass

    try:
        user = getpass.getuser()
    except Exception:  # no user name (a container without one): the generic name
        return "client"
    name = re.sub(r"[^A-Za-z0-9._-]", "_", user).lstrip("._-")[:40]
    return name or "client"


def client_id(name: str | None = None) -> str:
    """A new client id: ``name`` (default: this process's user name), ``-`` and 12
    random hexadecimal digits. ``ValueError`` for a name that is not a string of 1 to
    40 letters, digits, ``.``, ``_`` or ``-`` starting with a letter or digit."""
    if name is None:
        name = _default_client_name()
    elif not isinstance(name, str) or not _CLIENT_NAME.fullmatch(name):
        raise ValueError(
            f"name must be 1 to 40 letters, digits, '.', '_' or '-' starting with a letter "
            f"or digit (who submits, as the console and the policies show it), got {name!r}: "
            "say name='alice', or leave it out for your user name"
        )
    return f"{name}-{os.urandom(6).hex()}"


def client_name(client: str) -> str:
    """The name of the client whose id is ``client`` (:func:`client_id`): the id less its
    random tail; an id of another shape as it is ("" stays "": not known)."""
    match = _CLIENT_ID.fullmatch(client)
    return match.group(1) if match else client
