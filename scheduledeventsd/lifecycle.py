"""Moved to scheduledeventsd.engine.lifecycle; this name keeps working for older imports."""

from __future__ import annotations

from .engine.lifecycle import (
    DURABLE,
    MARKDOWN_BEGIN,
    MARKDOWN_END,
    PREPARED,
    ROWS,
    TABLE,
    Drain,
    IllegalTransitionError,
    On,
    Phase,
    Rule,
    Slot,
    Stage,
    Transition,
    check,
    dot,
    markdown,
    troff,
)

__all__ = [
    "DURABLE",
    "MARKDOWN_BEGIN",
    "MARKDOWN_END",
    "PREPARED",
    "ROWS",
    "TABLE",
    "Drain",
    "IllegalTransitionError",
    "On",
    "Phase",
    "Rule",
    "Slot",
    "Stage",
    "Transition",
    "check",
    "dot",
    "markdown",
    "troff",
]
