"""The one logging setup: structlog, to journald with structured fields or to the console.

Under systemd every record becomes a journal entry whose fields (EVENT_ID=, EVENT_TYPE=,
HOOK=, ...) can be matched with `journalctl -u scheduledeventsd EVENT_TYPE=Reboot`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Callable, Optional

import structlog

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from ..host.hooks import CommandResult

IDENTIFIER = "scheduledeventsd"
LEVELS = ("debug", "info", "warning", "error")
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}
_FIELD_SAFE = re.compile(r"[^A-Z0-9_]")
# A lone surrogate (an OS name decoded with surrogateescape, a "\ud800" escape) cannot be sent:
# systemd.journal.send raises, and the record is lost.
_SURROGATE = re.compile("[\ud800-\udfff]")
# Shown first in the human-readable MESSAGE, in this order, when present.
_MESSAGE_KEYS = (
    "event_id",
    "event_type",
    "event_status",
    "hook",
    "exit_status",
    "duration_s",
    "line",
    "reason",
    "error",
)

EventDict = MutableMapping[str, Any]
Sender = Callable[..., None]


def journal_field(key: str) -> str:
    """journald field names: upper case, [A-Z0-9_], not starting with '_' (reserved)."""
    return _FIELD_SAFE.sub("_", key.upper()).lstrip("_") or "FIELD"


def message(name: str, fields: EventDict) -> str:
    shown = [k for k in _MESSAGE_KEYS if k in fields]
    shown += sorted(k for k in fields if k not in _MESSAGE_KEYS)
    rest = " ".join(f"{k}={fields[k]}" for k in shown)
    return f"{name}: {rest}" if rest else name


class JournalRenderer:
    """Last processor: sends the record to journald and drops it from structlog's output."""

    def __init__(self, send: Sender) -> None:
        self._send = send

    def __call__(self, _logger: object, _method: str, event_dict: EventDict) -> EventDict:
        fields = dict(event_dict)
        name = str(fields.pop("event", ""))
        level = str(fields.pop("level", "info"))
        exception = fields.pop("exception", None)
        journal = {journal_field(k): _sendable(str(v)) for k, v in fields.items() if v is not None}
        text = message(name, fields)
        if exception:
            text = f"{text}\n{exception}"
        self._send(
            _sendable(text),
            PRIORITY=str(_PRIORITY.get(level, 6)),
            SYSLOG_IDENTIFIER=IDENTIFIER,
            LOG_EVENT=name,
            **journal,
        )
        raise structlog.DropEvent


def _sendable(text: str) -> str:
    """`text` as journald can take it: each lone surrogate replaced by U+FFFD."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _journal_sender() -> Optional[Sender]:
    try:
        import systemd.journal  # noqa: PLC0415 - optional at run time, e.g. in a dev venv
    except ImportError:
        return None
    send: Sender = systemd.journal.send
    return send


def wants_journal(target: str) -> bool:
    """`auto` means journald when systemd connected our output to it (JOURNAL_STREAM)."""
    return target == "journal" or (target == "auto" and bool(os.environ.get("JOURNAL_STREAM")))


def configure(target: str = "auto", fmt: str = "console", level: str = "info") -> Optional[str]:
    """Set up structlog once; returns a warning to log if the journal was wanted but absent."""
    warning = None
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.format_exc_info,
    ]
    sender = _journal_sender() if wants_journal(target) else None
    if wants_journal(target) and sender is None:
        warning = "systemd-python is not installed; logging to the console instead of journald"
    if sender is not None:
        processors.append(JournalRenderer(sender))
    elif fmt == "json":
        processors += [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(sort_keys=False),
        ]
    else:
        processors += [
            structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    return warning


def get() -> FilteringBoundLogger:
    logger: FilteringBoundLogger = structlog.get_logger(IDENTIFIER)
    return logger


def emit(logger: FilteringBoundLogger, level: str, name: str, fields: Mapping[str, Any]) -> None:
    """One record at a level chosen by data (the engine's Log effects)."""
    method = {
        "debug": logger.debug,
        "info": logger.info,
        "warning": logger.warning,
        "error": logger.error,
    }.get(level, logger.error)
    method(name, **fields)


def hook_result(
    bound: FilteringBoundLogger, hook: str, stage: str, run: int, result: CommandResult
) -> None:
    """How a hook's (or the gate's) end is logged: its outcome by name and level, and what of
    its output the run's logging budget dropped."""
    fields = {
        "hook": hook,
        "exit_status": result.exit_status,
        "duration_s": round(result.duration_s, 3),
        "run": run,
    }
    if result.dropped_lines:
        bound.warning(
            "hook_output_truncated",
            hook=hook,
            run=run,
            lines_dropped=result.dropped_lines,
            bytes_dropped=result.dropped_bytes,
            reason="past the run's logging budget; drained, not logged",
        )
    if result.succeeded:
        bound.info("hook_finished", **fields)
    elif result.timed_out:
        bound.error("hook_timed_out", **fields, error="killed with its process group")
    elif result.cancelled:
        bound.warning("hook_cancelled", **fields, error=result.error or None)
    elif stage == "gate":
        bound.info("gate_answered", **fields, error=result.error or None)
    else:
        bound.error("hook_failed", **fields, error=result.error or None)
