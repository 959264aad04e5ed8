"""TLS for ``wss://`` from the environment, so every process of a cluster (the manager,
its workers, their peer listeners, clients and consoles) speaks it without code.

What lives here: :func:`server_context` and :func:`client_context`, which the ``wss``
transport calls when it was given no ``ssl_context``:

- ``CORRAL_TLS_CERT`` (and ``CORRAL_TLS_KEY`` when the key is in a file of its own):
  the certificate chain a process serves ``wss://`` with: the manager's listener and a
  worker's listener for its peers. ``python -m runtime manager`` and ``worker`` set them
  from ``--tls-cert`` and ``--tls-key`` (their children inherit them).
- ``CORRAL_TLS_CA``: a file of CA certificates to verify the ``wss://`` servers a
  process connects to (a self-signed certificate, or a private CA's); without it, the
  system's CAs. ``--tls-ca`` sets it.

Contexts are loaded once per file (again when the file changes). A file that cannot be
read, or does not hold what it should, raises :class:`ValueError` naming the variable.
See docs/security.md.
"""

from __future__ import annotations

import os
import ssl

__all__ = ["TLS_CA_ENV", "TLS_CERT_ENV", "TLS_KEY_ENV", "client_context", "server_context"]

TLS_CERT_ENV = "CORRAL_TLS_CERT"
TLS_KEY_ENV = "CORRAL_TLS_KEY"
TLS_CA_ENV = "CORRAL_TLS_CA"

#: (purpose, files, their modification times) -> the context made from them
_loaded: dict[tuple[str, tuple[str, ...], tuple[float, ...]], ssl.SSLContext] = {}


def _stamp(files: tuple[tuple[str, str], ...]) -> tuple[float, ...]:
    """The modification times of ``files`` ((path, the variable naming it) each)."""
    stamps = []
    for path, env in files:
        try:
            stamps.append(os.stat(path).st_mtime)
        except OSError as exc:
            raise ValueError(f"{env}={path!r}: cannot read it ({exc.strerror})") from None
    return tuple(stamps)


def server_context() -> ssl.SSLContext | None:
    """The context to listen on ``wss://`` with, from ``CORRAL_TLS_CERT`` (and
    ``CORRAL_TLS_KEY``); None when the certificate is not set."""
    cert = os.environ.get(TLS_CERT_ENV, "")
    if not cert:
        return None
    key = os.environ.get(TLS_KEY_ENV, "")
    files = ((cert, TLS_CERT_ENV), (key, TLS_KEY_ENV)) if key else ((cert, TLS_CERT_ENV),)
    paths = tuple(path for path, _ in files)
    stamp = _stamp(files)
    ctx = _loaded.get(("server", paths, stamp))
    if ctx is None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(cert, key or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"{TLS_CERT_ENV}={cert!r}{f', {TLS_KEY_ENV}={key!r}' if key else ''}: not a "
                f"certificate chain and its private key ({exc}); give PEM files, the key in "
                f"the certificate's file or in {TLS_KEY_ENV} (--tls-cert, --tls-key)"
            ) from None
        _loaded[("server", paths, stamp)] = ctx
    return ctx


def client_context() -> ssl.SSLContext | None:
    """The context to verify ``wss://`` servers with, from ``CORRAL_TLS_CA``; None when
    it is not set (then the system's CAs)."""
    ca = os.environ.get(TLS_CA_ENV, "")
    if not ca:
        return None
    paths = (ca,)
    stamp = _stamp(((ca, TLS_CA_ENV),))
    ctx = _loaded.get(("client", paths, stamp))
    if ctx is None:
        try:
            ctx = ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"{TLS_CA_ENV}={ca!r}: not a file of CA certificates ({exc}); give a PEM "
                "file (--tls-ca)"
            ) from None
        _loaded[("client", paths, stamp)] = ctx
    return ctx
