"""The one generic check: a value is checked by what its key declares in the schema (its kind,
range, choices, `required`, the keys its section allows), and every problem is named by file
and key path.

What a kind cannot say (a hook file owned by root, a time zone this machine knows, a key that
depends on another) is checked by the section builders (sections.py, fleet.py) and the
cross-key rules (logic.py), on the values this walk returns.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import schema
from .kinds import Key, Kind

MAX_PROBLEM = 300  # characters of one problem's text


class Invalid:
    """What a check returns for a value it refused (the problem is already told)."""


INVALID = Invalid()


@dataclass(frozen=True)
class Entry:
    """One mapping of a list section (`webhooks`, `windows`): its key path and checked keys."""

    where: str
    fields: dict[str, Any]


class Checker:
    """Collects problems so the user sees all of them in one run."""

    def __init__(self, source: str, *, check_files: bool = True) -> None:
        self.source = source
        self.check_files = check_files
        self.problems: list[str] = []

    def fail(self, where: str, problem: str) -> None:
        """One problem; never unbounded (a value quoted in it may be megabytes)."""
        if len(problem) > MAX_PROBLEM:
            problem = f"{problem[:MAX_PROBLEM]}... ({len(problem)} characters)"
        self.problems.append(f"{self.source}: {bounded(where) or 'top level'}: {problem}")

    def section(self, value: Any, where: str, path: str) -> dict[str, Any]:  # noqa: ANN401
        """The checked values of the keys section `path` declares (`where` names it as written,
        `path` as declared: they differ under chosen names and list items). A key not declared,
        a required one missing, a value its key refuses: each a problem, and left out."""
        allowed = schema.children(path)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            self.fail(where, f"must be a mapping, got {kind_of(value)}")
            return {}
        for name in value:
            if name not in allowed:
                self.fail(
                    join(where, str(name)), f"unknown key (expected one of: {', '.join(allowed)})"
                )
        fields: dict[str, Any] = {}
        for name in allowed:
            key = schema.key(join(path, name))
            if value.get(name) is None:
                if key.required:
                    self.fail(join(where, name), f"required ({_holds(key)}): {key.doc}")
                continue
            checked = self.value(key, value[name], join(where, name))
            if checked is not INVALID:
                fields[name] = checked
        return fields

    def entries(self, value: Any, where: str, path: str) -> Iterator[Entry]:  # noqa: ANN401
        """Each mapping of a list of sections, checked as `path[]` declares."""
        for i, item in enumerate(value):
            fields = self.section(item, f"{where}[{i}]", f"{path}[]")
            if isinstance(item, dict):
                yield Entry(f"{where}[{i}]", fields)

    def sections(self, value: Any, where: str, path: str) -> Any:  # noqa: ANN401
        """A mapping of the keys `path` declares (its checked values), or a non-empty list of
        such mappings (an Entry for each, named `where[i]`)."""
        if not isinstance(value, list):
            return self.section(value, where, path)
        if not value:
            self.fail(where, "must be a mapping or a non-empty list of mappings, got an empty list")
            return INVALID
        found = []
        for i, item in enumerate(value):
            fields = self.section(item, f"{where}[{i}]", path)
            if isinstance(item, dict):
                found.append(Entry(f"{where}[{i}]", fields))
        return found

    def value(self, key: Key, value: Any, where: str) -> Any:  # noqa: ANN401
        """`value` checked as `key` declares, or INVALID (and a problem told)."""
        if key.kind is Kind.SECTION:
            return self.section(value, where, key.path)
        if key.kind is Kind.SECTIONS:
            return self.sections(value, where, key.path)
        check = _CHECKS[key.kind]
        result = check(key, value)
        if isinstance(result, Refused):
            self.fail(where, result.problem)
            return INVALID
        if key.kind is Kind.LIST and schema.children(f"{key.path}[]"):
            return list(self.entries(result, where, key.path))
        return result


@dataclass(frozen=True)
class Refused:
    problem: str


def bounded(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM else f"{text[:MAX_PROBLEM]}..."


def kind_of(value: Any) -> str:  # noqa: ANN401
    if value is None:
        return "nothing"
    if isinstance(value, str) and not value:  # "got a string" for "" said nothing
        return "an empty string"
    if isinstance(value, list) and not value:
        return "an empty list"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _holds(key: Key) -> str:
    return f"one of {', '.join(key.values)}" if key.choices else key.kind.value


def _got(value: Any) -> str:  # noqa: ANN401
    return repr(value) if isinstance(value, str) else kind_of(value)


def _number(value: Any) -> bool:  # noqa: ANN401
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(key: Key, value: Any) -> object:  # noqa: ANN401
    low, high = schema.bounds(key.path)
    if not _number(value):
        return Refused(f"must be a number of seconds, got {kind_of(value)}")
    if not low <= value <= high:
        return Refused(f"must be between {low:g} and {high:g}, got {value:g}")
    return float(value)


def _whole(key: Key, value: Any) -> object:  # noqa: ANN401
    low, high = schema.bounds(key.path)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        return Refused(f"must be a whole number {low:g}..{high:g}, got {value!r}")
    return value


def _text(key: Key, value: Any) -> object:  # noqa: ANN401
    if isinstance(value, dt.date):
        value = value.isoformat()  # an unquoted 2020-07-01 is a YAML date, meant as text
    if not isinstance(value, str) or not value.strip():
        return Refused(f"must be a non-empty string, got {kind_of(value)}")
    return value.strip()


def _choice(key: Key, value: Any) -> object:  # noqa: ANN401
    if not isinstance(value, str) or value not in key.values:
        return Refused(f"must be one of {', '.join(key.values)}, got {_got(value)}")
    return value


def _path(key: Key, value: Any) -> object:  # noqa: ANN401
    text = _text(key, value)
    if isinstance(text, Refused):
        return text
    assert isinstance(text, str)  # noqa: S101 - _text returns text or Refused
    if not text.startswith("/") or "\x00" in text:
        return Refused(f"must be an absolute path, got {text!r}")
    return text


def url_parts(text: str) -> Optional[urllib.parse.SplitResult]:
    """None for what urlsplit refuses (`https://[`) or a port that is not one (`:99999`):
    both raise ValueError, the second only later, where the URL is used (found by the fuzzer)."""
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port
    except ValueError:
        return None
    return parts


def _url(key: Key, value: Any) -> object:  # noqa: ANN401
    text = value if isinstance(value, str) else ""
    parts = url_parts(text)
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(ch.isspace() for ch in text)
    ):
        return Refused(f"must be an http(s):// URL with a host, got {value!r}")
    return text


def _argv(key: Key, value: Any) -> object:  # noqa: ANN401
    if isinstance(value, str):
        return Refused("must be a list (argv; no shell runs it), e.g. [/path/to/hook, --flag]")
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        return Refused(f"must be a non-empty list of strings, got {kind_of(value)}")
    if any("\x00" in a for a in value):
        return Refused("contains a NUL character")
    return list(value)


def _strings(what: str) -> Callable[[Key, Any], object]:
    def check(key: Key, value: Any) -> object:  # noqa: ANN401
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return Refused(f"must be a list of {what}, got {kind_of(value)}")
        return list(value)

    return check


def _list(key: Key, value: Any) -> object:  # noqa: ANN401
    """A list of sections (`webhooks`), each walked by the caller, or of strings."""
    if schema.children(f"{key.path}[]"):
        if not isinstance(value, list):
            return Refused(f"must be a list of mappings, got {kind_of(value)}")
        return value
    return _strings("strings")(key, value)


def _named(key: Key, value: Any) -> object:  # noqa: ANN401
    if not isinstance(value, dict):
        return Refused(f"must be a mapping of names you choose, got {kind_of(value)}")
    return value


def _address(key: Key, value: Any) -> object:  # noqa: ANN401
    text = value if isinstance(value, str) else ""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        number = 0
    if not sep or not 1 <= number <= 65535:
        return Refused(
            f"must be ADDRESS:PORT with a numeric address (127.0.0.1:9650, [::1]:9650, "
            f"0.0.0.0:9650), got {value!r}"
        )
    return host, number


def _bool(key: Key, value: Any) -> object:  # noqa: ANN401
    if not isinstance(value, bool):
        return Refused(f"must be true or false, got {kind_of(value)}")
    return value


_CLOCK = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")


def _clock(key: Key, value: Any) -> object:  # noqa: ANN401
    match = _CLOCK.match(value) if isinstance(value, str) else None
    if match is None:
        return Refused(f'must be a time of day "HH:MM" (00:00 to 23:59), got {value!r}')
    return dt.time(int(match[1]), int(match[2]))


# Each kind's check (SECTION and SECTIONS are walked key by key): a new kind without one fails
# at import.
_CHECKS: dict[Kind, Callable[[Key, Any], object]] = {
    Kind.NAMED: _named,
    Kind.LIST: _list,
    Kind.SECONDS: _seconds,
    Kind.WHOLE: _whole,
    Kind.TEXT: _text,
    Kind.CHOICE: _choice,
    Kind.PATH: _path,
    Kind.URL: _url,
    Kind.ARGV: _argv,
    Kind.HOOK_NAMES: _strings("hook names"),
    Kind.ADDRESS: _address,
    Kind.BOOL: _bool,
    Kind.CLOCK: _clock,
}
assert set(_CHECKS) == set(Kind) - {Kind.SECTION, Kind.SECTIONS}  # noqa: S101 - a declaration error
