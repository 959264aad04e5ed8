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

:func:`certificate_hint` says what to do about a certificate a connection refused
(OpenSSL's verify code), and :func:`refused_certificate` tells, without a socket,
whether a connection would refuse the certificate a context serves (a worker checks its
own, dialled at its ``--host``, as it starts; a manager its own chain and dates, with
:func:`own_certificate_verifier`).

Contexts are loaded once per file (again when the file changes). A file that cannot be
read, or does not hold what it should, raises :class:`ValueError` naming the variable.
See docs/security.md.
"""

from __future__ import annotations

import os
import ssl
from typing import Final

__all__ = [
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "certificate_hint",
    "client_context",
    "own_certificate_verifier",
    "refused_certificate",
    "server_context",
]

TLS_CERT_ENV = "CORRAL_TLS_CERT"
TLS_KEY_ENV = "CORRAL_TLS_KEY"
TLS_CA_ENV = "CORRAL_TLS_CA"

#: OpenSSL's verify codes (``ssl.SSLCertVerificationError.verify_code``) for a
#: certificate whose issuer this side does not trust: unknown or self-signed
_UNTRUSTED_ISSUER: Final = frozenset({2, 18, 19, 20, 21, 27})
#: ... for a certificate outside its validity dates (not yet valid, expired)
_OUT_OF_DATE: Final = frozenset({9, 10})
#: ... for a certificate that does not name the host dialled (host name, IP address)
_NAME_MISMATCH: Final = frozenset({62, 64})
#: rounds of an in-memory handshake (TLS 1.3 takes 2, 1.2 three): past them, give up
_HANDSHAKE_ROUNDS: Final = 8

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
        ctx = _trusting(ca)
        _loaded[("client", paths, stamp)] = ctx
    return ctx


def _trusting(ca: str) -> ssl.SSLContext:
    """A new context that verifies servers against the CA certificates in ``ca`` (the
    file of ``CORRAL_TLS_CA``); :class:`ValueError` naming it when it cannot be read or
    holds none."""
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"{TLS_CA_ENV}={ca!r}: not a file of CA certificates ({exc}); give a PEM "
            "file (--tls-ca)"
        ) from None


def certificate_hint(code: int, host: str) -> str:
    """What to do about a server certificate this side refused (OpenSSL's ``code``),
    dialling ``host``."""
    if code in _UNTRUSTED_ISSUER:
        return (
            "The listener is there, but this side does not trust its certificate's issuer: "
            "give the CA certificate that signed it (for a self-signed certificate, the "
            "certificate itself) in CORRAL_TLS_CA=FILE (a manager, worker or console: "
            "--tls-ca FILE; Python: ssl_context=...); without it only the system's CAs are "
            "trusted "
            "(docs/security.md#tls)."
        )
    if code in _OUT_OF_DATE:
        return (
            "The listener is there, but its certificate is outside its validity dates "
            "(openssl x509 -noout -dates -in CERT shows them; check both machines' clocks): "
            "give it a valid certificate (its --tls-cert) and restart it "
            "(docs/security.md#tls)."
        )
    if code in _NAME_MISMATCH:
        return (
            f"The listener is there, but its certificate does not name {host!r}, the host "
            "dialled: its subjectAltName (SAN) must carry it (an IP address as an IP entry, "
            "a host name as a DNS entry). Connect by a name the certificate carries, or "
            "give the listener a certificate that names it; a worker's certificate must "
            "name its --host (docs/security.md#tls)."
        )
    return (
        "The listener is there, but this side could not verify its certificate: check "
        "the CA given with --tls-ca or CORRAL_TLS_CA (else the system's CAs), and the "
        "certificate the listener serves (its --tls-cert) (docs/security.md#tls)."
    )


def own_certificate_verifier() -> ssl.SSLContext | None:
    """A context that verifies the certificate this process serves (``CORRAL_TLS_CERT``)
    as its clients would, but for the host name, which a listener cannot know (they may
    dial it by any name its certificate carries): its chain against ``CORRAL_TLS_CA``
    when that is set (a manager given ``--tls-ca`` and a certificate it does not sign
    is most likely a mistake of files), else against the certificate itself, so that
    only its dates are checked. None without ``CORRAL_TLS_CERT``; :class:`ValueError`
    naming ``CORRAL_TLS_CA`` when its file cannot be read or holds no certificate."""
    cert = os.environ.get(TLS_CERT_ENV)
    if not cert:
        return None
    ca = os.environ.get(TLS_CA_ENV)
    if ca:  # as its clients given that file verify: a partial chain only if theirs take one
        verifier = _trusting(ca)
    else:
        verifier = ssl.create_default_context(cafile=cert)
        verifier.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf is the anchor
    verifier.check_hostname = False
    return verifier


def refused_certificate(
    server: ssl.SSLContext, client: ssl.SSLContext, host: str | None
) -> ssl.SSLCertVerificationError | None:
    """Why a connection verifying with ``client`` and dialling ``host`` would refuse the
    certificate ``server`` serves (None: it would accept it, or the handshake fails for
    another reason): a TLS handshake between the two in memory, no socket, with the
    checks a real connection makes (the chain against the CAs, the dates, the names;
    ``host`` None: no name, for a ``client`` that checks none)."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    dialler = client.wrap_bio(to_client, to_server, server_hostname=host)
    listener = server.wrap_bio(to_server, to_client, server_side=True)
    for _ in range(_HANDSHAKE_ROUNDS):
        finished = 0
        for side in (dialler, listener):
            try:
                side.do_handshake()
                finished += 1
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as exc:
                return exc
            except ssl.SSLError:
                return None
        if finished == 2:
            break
    return None
