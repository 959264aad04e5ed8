"""The configuration a manager process runs with, as rows of settings.

What lives here: :func:`manager_settings`, which turns what a manager runs with (its
own settings, its pools with every key after the defaults and their workers' memory
fences, the scheduler's settings, the alerting, the policies it starts with) into
:class:`~runtime.messages.ConfigSetting` rows, each with where it came from
(``default``, ``file``, ``flag --NAME``, ``env NAME``); :func:`file_sources`, the
settings a configuration file gives; :func:`setting_fields`, the rows as the
structured ``configuration`` log line's fields. The manager logs them once as it
starts and answers them in ``status()["config"]`` (the console's ``config``;
docs/configuration.md#the-configuration-in-force).

Tokens never appear: a manager's tokens are not settings; a URL's user part (its
password, or a user part alone: ``https://TOKEN@host``) and a ``token`` in its query
are masked, and so are, in a Slurm pool's ``worker_init``, the values of variables and
command-line options named like a secret (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``,
``*KEY*``: ``API_TOKEN=x``, ``--password x``) and its URLs' user parts. Pure: no I/O
but reading the configuration file again.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from actors.memory import MemoryConfig
from actors.pools import (
    COMMON_KEYS,
    LOCAL_KEYS,
    POOL_MEMORY_OPTIONS,
    SCHEDULER_KEYS,
    SLURM_KEYS,
    PoolConfig,
    read_config,
)
from actors.providers import DISK_OFF
from actors.scheduler_records import SchedulerConfig
from actors.slurm import HOST_PLACEHOLDER
from actors.worker import Worker
from policies import DEFAULTS, KINDS
from runtime.errors import Refusals
from runtime.messages import ConfigSetting
from runtime.monitor import AlertingConfig

__all__ = ["file_sources", "manager_settings", "setting_fields", "value_text"]

#: the settings shown as sizes (bytes, written ``4GiB`` when that is exact)
_SIZES = {"memory_per_worker", "disk_per_worker", "memory_options.disk_limit",
          "unknown_output", "checkpoint_bytes", "checkpoint_inline_bytes"}  # fmt: skip
#: what masks a secret's value
MASK = "***"
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|KEY)", re.I)
_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|\S*)")
#: a command-line option and its value as the next word (``--token abc``); ``--token=abc``
#: is an assignment (above); a next word that starts with ``-`` is another option
_OPTION = re.compile(r"(?<!\S)(--?[A-Za-z][A-Za-z0-9_-]*)(\s+)(\"[^\"]*\"|'[^']*'|[^\s-]\S*)")
#: a URL's user part (``https://TOKEN@host``, ``https://user:password@host``)
_URL_USER = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/\s@'\"]+)@")


def _size(n: int) -> str:
    """Bytes as a TOML file may write them: ``4GiB`` when exact, else the number."""
    for unit, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n and n % unit == 0:
            return f"{n // unit}{name}"
    return str(n)


def value_text(value: object, key: str = "") -> str:
    """``value`` as text, as a TOML file writes it: ``true``, ``0.6``, ``inf``, a
    string as it is, a table as ``{a = "b"}``; ``none`` for None (not set); the sizes of
    :data:`_SIZES` as ``4GiB``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and key in _SIZES:
        return "off" if value == DISK_OFF else _size(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:g}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_quoted(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_quoted(v) for v in value) + "]"
    return str(value)


def _quoted(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else value_text(value)


def _masked_user(user: str) -> str:
    """A URL's user part masked: ``user:***`` for a user and password, else ``***``
    (a user part alone is often a token: ``https://TOKEN@host``)."""
    name, colon, _ = user.partition(":")
    return f"{name}:{MASK}" if colon else MASK


def masked_url(url: str) -> str:
    """``url`` with its user part (:func:`_masked_user`) and any ``token`` in its query
    masked."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    netloc = f"{_masked_user(user)}@{host}" if at else parts.netloc
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if _SECRET_NAME.search(k) else v) for k, v in pairs])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def masked_shell(text: str) -> str:
    """Shell lines with the values of variables and options named like a secret
    masked (``export API_TOKEN=abc`` -> ``export API_TOKEN=***``, ``--password abc``
    -> ``--password ***``) and so are URLs' user parts (``https://***@host``), as one
    line (``; ``)."""

    def secret(m: re.Match[str], *, option: bool = False) -> str:
        if not _SECRET_NAME.search(m.group(1)):
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{MASK}" if option else f"{m.group(1)}={MASK}"

    def masked(line: str) -> str:
        line = _URL_USER.sub(lambda m: f"{m.group(1)}{_masked_user(m.group(2))}@", line)
        line = _ASSIGNMENT.sub(secret, line)
        return _OPTION.sub(lambda m: secret(m, option=True), line)

    return "; ".join(masked(line.strip()) for line in text.splitlines() if line.strip())


def file_sources(path: str | os.PathLike[str] | None) -> dict[str, str]:
    """``{"section.key": "file"}`` for each setting the configuration file at ``path``
    gives (pools' keys as ``pools.NAME.KEY``, a memory option as
    ``pools.NAME.memory_options.NAME``, ``alerting.rules`` for ``[[alerts]]``, a policy
    as ``policies.KIND``); none without a file. The file was checked already: what is
    not a table here is skipped."""
    if path is None:
        return {}
    data = read_config(path, Refusals(keep=True))
    out: dict[str, str] = {}
    pools = data.get("pools")
    for name, table in pools.items() if isinstance(pools, Mapping) else ():
        if not isinstance(table, Mapping):
            continue
        for key, value in table.items():
            out[f"pools.{name}.{key}"] = "file"
            if key == "memory_options" and isinstance(value, Mapping):
                out.update({f"pools.{name}.memory_options.{k}": "file" for k in value})
    for section in ("scheduler", "alerting", "policies"):
        table = data.get(section)
        if isinstance(table, Mapping):
            out.update({f"{section}.{key}": "file" for key in table})
    if data.get("alerts"):
        out["alerting.rules"] = "file"
    return out


def _memory_default(name: str) -> object:
    field = next(f for f in dataclasses.fields(MemoryConfig) if f.name == name)
    return field.default


def _worker_default(key: str, provider: str) -> object:
    """What a pool's worker takes for ``key`` when the pool leaves it out."""
    if key == "worker_host":
        return "127.0.0.1" if provider == "local" else HOST_PLACEHOLDER
    if key == "execution":
        return _memory_default("execution")
    return inspect.signature(Worker).parameters["grace"].default


def _pool_rows(pool: PoolConfig) -> list[tuple[str, object]]:
    """Every key of ``pool`` after the defaults (those of its provider), its memory
    options each after the worker's defaults."""
    extra = LOCAL_KEYS if pool.provider == "local" else SLURM_KEYS
    rows: list[tuple[str, object]] = []
    for key in (*COMMON_KEYS, *extra):
        if key == "memory_options":
            for name in POOL_MEMORY_OPTIONS:
                value = pool.memory_options.get(name, _memory_default(name))
                rows.append((f"memory_options.{name}", value))
            continue
        value = getattr(pool, key)
        if value in ("", None) and key in ("worker_host", "execution", "grace"):
            value = _worker_default(key, pool.provider)  # what the worker takes
        elif value == "":
            value = None
        if key == "worker_port_range" and value is not None:
            value = "{}-{}".format(*value)
        elif key == "worker_init" and value is not None:  # (None: a pool without one)
            value = masked_shell(value)
        rows.append((key, value))
    return rows


def manager_settings(
    *,
    manager: Sequence[tuple[str, object]],
    pools: Mapping[str, PoolConfig],
    scheduler: SchedulerConfig,
    alerting: AlertingConfig | None,
    policies: Mapping[str, tuple[str, Mapping[str, Any]]],
    sources: Mapping[str, str],
) -> tuple[ConfigSetting, ...]:
    """The rows of a manager's configuration: ``manager`` (its own settings, ``(key,
    value)`` in order; a URL among them masked), the scheduler's settings (every key of
    ``[scheduler]``), each pool's keys after the defaults, the alerting (Alertmanager's
    URL masked) and the policies it starts with (each kind; those not given: the
    default). ``sources``: where the settings not at their default came from, by
    ``section.key`` (:func:`file_sources`, the flags and variables given)."""
    rows: list[ConfigSetting] = []

    def add(section: str, key: str, value: object) -> None:
        source = sources.get(f"{section}.{key}", "default")
        rows.append(ConfigSetting(section, key, value_text(value, key), source))

    for key, value in manager:
        url = isinstance(value, str) and "://" in value
        add("manager", key, masked_url(str(value)) if url else value)
    for key in SCHEDULER_KEYS:
        add("scheduler", key, getattr(scheduler, key))
    for name, pool in pools.items():
        for key, value in _pool_rows(pool):
            add(f"pools.{name}", key, value)
    if alerting is not None:
        am = alerting.alertmanager
        add("alerting", "alertmanager", masked_url(am) if am else None)
        add("alerting", "interval", alerting.interval)
        add("alerting", "default_rules", alerting.default_rules)
        add("alerting", "dashboard_url", masked_url(alerting.dashboard_url) or None)
        add("alerting", "resend", alerting.resend)
        add("alerting", "external_labels", dict(alerting.external_labels))
        names = [str(r.get("name", "?")) for r in alerting.rules]
        add("alerting", "rules", f"{len(names)}" + (f": {', '.join(names)}" if names else ""))
    for kind in KINDS:
        if kind == "scaling" and not pools:
            continue  # no autoscaler: no scaling policy
        name, params = policies.get(kind, (DEFAULTS[kind], {}))
        given = ", ".join(f"{k}={value_text(v)}" for k, v in params.items())
        add("policies", kind, f"{name} ({given})" if given else name)
    return tuple(rows)


def setting_fields(settings: Sequence[ConfigSetting]) -> dict[str, Any]:
    """The rows as the ``configuration`` log line's fields: per section, ``{key:
    value}`` (the pools' under ``pools``, by name), a value not at its default followed
    by where it came from (``30 (file)``)."""
    out: dict[str, Any] = {}
    for s in settings:
        shown = s.value if s.source == "default" else f"{s.value} ({s.source})"
        group, _, pool = s.section.partition(".")
        table = out.setdefault(group, {})
        (table.setdefault(pool, {}) if pool else table)[s.key] = shown
    return out
