"""Structured logging for Corral: structlog on top of the standard ``logging`` module.

What lives here: :func:`get_logger`, which every Corral module uses, and
:func:`configure`, which the command line calls. Corral never configures logging on
import: embedded in an application, its records go to the ``corral`` stdlib logger and
follow that application's logging settings (by default, warnings and above).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

__all__ = ["configure", "get_logger"]

_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.format_exc_info,
    structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"]),
]


def get_logger(name: str = "corral", **bound: Any) -> Any:
    """A structlog logger writing to the stdlib logger ``name``, with ``bound`` fields."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=_PROCESSORS,
        wrapper_class=structlog.stdlib.BoundLogger,
    ).bind(**bound)


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
