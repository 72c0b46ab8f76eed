"""The status document as `scheduledeventsd status` reads it back (status.json, or /status): its
shape declared once, as TypedDicts of what observer.document writes, and checked where it comes
in, so a file of another shape is "not a status document" and never a traceback in the printer
(`{"events": [1]}` raised AttributeError there). Keys it does not declare are let through (a
newer daemon's); a declared key of another type is refused."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Optional, TypedDict, Union, cast, get_args, get_origin, get_type_hints

from ..host.store import read_status


class Poll(TypedDict, total=False):
    last: str
    last_ok_at: Optional[str]
    last_ok_unix: Optional[float]
    incarnation: Optional[int]


class Health(TypedDict, total=False):
    ok: bool
    unhealthy_from: Optional[str]
    event_id: Optional[str]
    event_type: Optional[str]


class Group(TypedDict, total=False):
    group: str
    max: int


class Concurrency(TypedDict, total=False):
    group: str
    max: int
    groups: list[Group]
    held_for: list[str]
    last_seen_holders: list[str]


class Mark(TypedDict, total=False):
    method: str
    attribute: Optional[str]


class Pacemaker(TypedDict, total=False):
    method: str
    attribute: Optional[str]
    draining_for: list[str]
    drained_for: list[str]
    held_for: list[str]
    ready: Optional[bool]
    problems: list[str]
    marked: Optional[Mark]
    restore_error: Optional[str]


class Windows(TypedDict, total=False):
    configured: list[str]
    next_opens_at: Optional[str]
    next_closes_at: Optional[str]


class Hook(TypedDict, total=False):
    hook: str
    stage: str
    result: str
    duration_s: Optional[float]


class EventStatus(TypedDict, total=False):
    event_id: str
    event_type: str
    status: str
    phase: str
    resources: list[str]
    not_before: Optional[str]
    seconds_to_not_before: Optional[float]
    hooks_start_at: Optional[str]
    waiting_for: Optional[str]
    lead_s: Optional[float]
    lead_default: Optional[bool]
    slot: Optional[str]
    cluster: Optional[str]
    detected_at: Optional[str]
    hooks_started_at: Optional[str]
    hooks_done_at: Optional[str]
    approved_at: Optional[str]
    after_hooks_at: Optional[str]
    hooks: list[Hook]


class _Written(TypedDict):
    written_at_unix: float  # what tells a status document (a /status of something else lacks it)


class StatusDocument(_Written, total=False):
    version: str
    vm_name: Optional[str]
    provider: Optional[str]
    written_at: Optional[str]
    started_at: Optional[str]
    started_at_unix: Optional[float]
    poll: Poll
    state_file: str
    coordination: str
    health: Health
    concurrency: Optional[Concurrency]
    pacemaker: Optional[Pacemaker]
    windows: Windows
    events: list[EventStatus]


def read(directory: Path) -> StatusDocument:
    """`directory`/status.json, checked; OSError or ValueError if there is none of this shape."""
    return checked(read_status(directory))


def checked(raw: object) -> StatusDocument:
    """`raw` (parsed JSON) as a status document; ValueError naming the first key of another
    shape."""
    problem = _problem(raw, StatusDocument, "")
    if problem is not None:
        raise ValueError(f"not a status document ({problem})")
    return cast(StatusDocument, raw)


def _problem(value: object, shape: Any, where: str) -> Optional[str]:  # noqa: ANN401 - a type
    """Why `value` is not of `shape` (a TypedDict, list[X], Optional[X], str, int, float,
    bool), or None."""
    if get_origin(shape) is Union:
        if value is None and type(None) in get_args(shape):
            return None
        (inner,) = [a for a in get_args(shape) if a is not type(None)]
        return _problem(value, inner, where)
    if get_origin(shape) is list:
        if not isinstance(value, list):
            return f"{where or 'the document'}: a list expected, got {_kind(value)}"
        (item,) = get_args(shape)
        found = (_problem(v, item, f"{where}[{i}]") for i, v in enumerate(value))
        return next((p for p in found if p is not None), None)
    if hasattr(shape, "__required_keys__"):  # a TypedDict
        return _mapping(value, shape, where)
    if shape in (int, float) and _number(value) and (shape is float or isinstance(value, int)):
        return None
    if shape in (str, bool) and isinstance(value, shape):
        return None
    return f"{where}: {shape.__name__} expected, got {_kind(value)}"


def _mapping(value: object, shape: Any, where: str) -> Optional[str]:  # noqa: ANN401 - a type
    if not isinstance(value, dict):
        return f"{where or 'the document'}: a mapping expected, got {_kind(value)}"
    missing = sorted(shape.__required_keys__ - value.keys())
    if missing:
        return f"{where}.{missing[0]}".lstrip(".") + ": missing"
    hints = get_type_hints(shape, vars(sys.modules[__name__]))
    for key, hint in hints.items():
        if key in value:
            problem = _problem(value[key], hint, f"{where}.{key}".lstrip("."))
            if problem is not None:
                return problem
    return None


def _number(value: object) -> bool:
    """A JSON number the printer can do arithmetic with: not a bool, NaN, or too large."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _kind(value: object) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), f"{type(value).__name__} {value!r}"[:60])
