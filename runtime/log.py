"""Structured logging for Corral: structlog on top of the standard ``logging`` module.

What lives here: :func:`get_logger`, which every Corral module uses, and
:func:`configure`, which the command line calls. Corral never configures logging on
import: embedded in an application, its records go to the ``corral`` stdlib logger and
follow that application's logging settings (by default, warnings and above).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import orjson
import structlog

__all__ = [
    "JSON_LINES_ENV",
    "LEVELS",
    "configure",
    "get_logger",
    "json_lines",
    "level_name",
    "relayed",
]

#: set to "1" in a child process's environment by a parent that relays the child's
#: output into its own log (actors/processes.py): the child then writes each record as
#: one JSON object per line, which :func:`relayed` reads back, so the parent logs the
#: child's event and fields as its own, not the child's whole line quoted in an event
JSON_LINES_ENV = "CORRAL_LOG_JSON"


def json_lines() -> bool:
    """Whether :data:`JSON_LINES_ENV` asks for JSON lines: ``1`` yes; unset or empty
    no; any other value a :class:`ValueError` saying what it takes (checked by the
    command line and ``Cluster()``, as the other ``CORRAL_*`` values are: read as
    this module loads, a wrong one would otherwise be key=value lines unsaid)."""
    text = os.environ.get(JSON_LINES_ENV, "")
    if text not in ("", "1"):
        raise ValueError(
            f"{JSON_LINES_ENV}={text!r} is not 1: set it to 1 for log records as JSON lines, "
            "or unset it for key=value lines"
        )
    return text == "1"


def _render_json(_: Any, __: str, event_dict: dict[str, Any]) -> str:
    return orjson.dumps(event_dict, default=repr).decode()


_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.format_exc_info,
    _render_json
    if os.environ.get(JSON_LINES_ENV) == "1"
    else structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"]),
]


def relayed(line: str) -> tuple[int, str, dict[str, Any]] | None:
    """A line a child wrote with :data:`JSON_LINES_ENV` set, read back: its level (a
    ``logging`` number), its event and its other fields (its timestamp left out: the
    relaying logger stamps its own); None for any other line (a print, a traceback)."""
    if not line.startswith("{"):
        return None
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    event, level = record.pop("event", None), record.pop("level", None)
    number = logging.getLevelName(level.upper()) if isinstance(level, str) else None
    if not isinstance(event, str) or not isinstance(number, int):
        return None
    record.pop("timestamp", None)
    return number, event, record


def get_logger(name: str = "corral", **bound: Any) -> Any:
    """A structlog logger writing to the stdlib logger ``name``, with ``bound`` fields."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
    ).bind(**bound)


#: The levels ``--log-level`` takes (in any case).
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_name(text: str) -> str:
    """``text`` as one of :data:`LEVELS`; a ValueError listing them if it is none."""
    level = text.upper()
    if level not in LEVELS:
        raise ValueError(f"choose from {', '.join(LEVELS).lower()}")
    return level


def configure(level: str | int = "WARNING", stream: Any = None) -> None:
    """Send Corral's records at ``level`` and above to ``stream`` (default stderr)."""
    logger = logging.getLogger("corral")
    logger.setLevel(level if isinstance(level, int) else level.upper())
    if not any(getattr(h, "_corral", False) for h in logger.handlers):
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._corral = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
