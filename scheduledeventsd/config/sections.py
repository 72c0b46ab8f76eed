"""The settings of each section, built from the values the walker checked; here only what a kind
cannot say (a hook name's spelling, an event type, a time zone this machine knows)."""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from ..model import EVENT_TYPES
from ..windows import DAYS, Window
from . import files, logic, schema
from .provider import DEFAULT_URLS, Provider, detect
from .schema import WEBHOOK_EVENTS
from .settings import (
    STAGES,
    ApprovePolicy,
    ConfigError,
    EventRule,
    HealthFrom,
    Hook,
    HookCommand,
    Listen,
    Metadata,
    Webhook,
    WebhookFormat,
    frozen,
)
from .walker import INVALID, Checker, Entry, kind_of, url_parts

_HOOK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV_PREFIX = "SCHEDULED_EVENT_"


def provider(top: Mapping[str, Any]) -> tuple[Provider, str]:
    setting = top.get("provider", schema.text("provider"))
    if setting != "auto":
        return Provider(setting), "provider: " + setting
    found = detect(Path(top.get("dmi_dir", schema.text("dmi_dir"))))
    return found.provider, f"provider: auto, {found.why}"


def metadata(c: Checker, fields: dict[str, Any], cloud: Provider) -> Metadata:
    url = fields.pop("url", DEFAULT_URLS[cloud])
    parts = url_parts(url)
    if parts is not None and (parts.query or parts.fragment or parts.username or parts.password):
        c.fail(
            "metadata.url",
            "must not carry a query, fragment or credentials (api_version is separate)",
        )
    logic.first_call_after_timeout(c, fields)
    return Metadata(url=url.rstrip("/"), **fields)


def hooks(c: Checker, raw: Any, label: str = "hooks") -> Mapping[str, Hook]:  # noqa: ANN401
    """Hook name -> its commands (`raw` checked as a mapping by the walker)."""
    found: dict[str, Hook] = {}
    for name, commands in raw.items():
        where = f"{label}.{name}"
        if not isinstance(name, str) or not _HOOK_NAME.match(name):
            c.fail(where, "hook names are letters, digits, '_', '.', '-' (at most 64)")
            continue
        if not isinstance(commands, list) or not commands:
            c.fail(where, f"must be a non-empty list of commands, got {kind_of(commands)}")
            found[name] = Hook(name, ())  # defined, wrongly: said here, not again by the rules
            continue
        parsed = [command(c, entry) for entry in c.entries(commands, where, "hooks.NAME")]
        found[name] = Hook(name, tuple(cmd for cmd in parsed if cmd is not None))
    return found


def command(c: Checker, entry: Entry) -> Optional[HookCommand]:
    """A hook's command or the gate: the program and every file argument checked on disk."""
    if "command" not in entry.fields:
        return None
    argv = entry.fields["command"]
    where = f"{entry.where}.command"
    program = files.check_executable(c, f"{where}[0]", argv[0])
    args = [files.check_argument(c, f"{where}[{i}]", a) for i, a in enumerate(argv[1:], 1)]
    if "timeout" in entry.fields:
        return HookCommand((program, *args), entry.fields["timeout"])
    return HookCommand((program, *args))


def events(c: Checker, raw: Any, defined: Mapping[str, Hook]) -> Mapping[str, EventRule]:  # noqa: ANN401
    """Event type -> its rule; a plain list of hook names means `before`."""
    rules: dict[str, EventRule] = {}
    for event_type, entry in raw.items():
        where = f"events.{event_type}"
        if event_type not in EVENT_TYPES:
            c.fail(where, f"unknown event type (expected one of: {', '.join(EVENT_TYPES)})")
            continue
        if entry is None or isinstance(entry, list):  # the plain spelling: `before`
            before = c.value(schema.key("events.TYPE.before"), entry or [], where)
            fields = {} if before is INVALID else {"before": before}
            logic.hooks_defined(c, where, fields, defined, plain=True)
        elif isinstance(entry, dict):
            fields = c.section(entry, where, "events.TYPE")
            logic.hooks_defined(c, where, fields, defined)
        else:
            keys = ", ".join(schema.children("events.TYPE"))
            c.fail(where, f"must be a list of hook names or a mapping of {keys}")
            continue
        logic.fast_below_with_fast(c, where, fields)
        rule: dict[str, Any] = {
            name: tuple(v) if isinstance(v, list) else v for name, v in fields.items()
        }
        if isinstance(entry, dict) and "cancelled" in entry and entry["cancelled"] is None:
            rule["cancelled"] = ()  # written empty: none (not given at all: as after)
        rule.setdefault("cancelled", rule.get("after", ()))
        if "approve" in rule:
            rule["approve"] = ApprovePolicy(rule["approve"])
        rules[event_type] = EventRule(**rule)
    return rules


def environment(c: Checker, raw: Mapping[Any, Any]) -> Mapping[str, str]:
    env: dict[str, str] = {}
    for key, value in raw.items():
        where = f"environment.{key}"
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            c.fail(where, "not a valid environment variable name")
        elif key.startswith(_RESERVED_ENV_PREFIX):
            c.fail(where, f"{_RESERVED_ENV_PREFIX}* variables are set by the daemon for each event")
        elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
            c.fail(where, f"must be a string, got {kind_of(value)}")
        elif "\x00" in str(value):
            c.fail(where, "contains a NUL character")
        else:
            env[key] = str(value)
    return frozen(env)


def windows(c: Checker, entries: list[Entry]) -> tuple[Window, ...]:
    found = []
    for entry in entries:
        fields = entry.fields
        days = fields.get("days", schema.strings("windows[].days"))
        if not days or not all(d in DAYS for d in days):
            c.fail(
                f"{entry.where}.days",
                f"must be a non-empty list of {', '.join(DAYS)}, got {days!r}",
            )
            days = list(DAYS)
        name = fields.get("timezone", schema.text("windows[].timezone"))
        zone = _zone(name)
        if zone is None:
            c.fail(
                f"{entry.where}.timezone",
                f"not a time zone this machine knows (IANA), got {name!r}",
            )
            continue
        if "start" not in fields or "end" not in fields:
            continue
        if logic.window_has_length(c, entry):
            days_open = frozenset(DAYS.index(d) for d in days)
            found.append(Window(days_open, fields["start"], fields["end"], zone))
    return tuple(found)


_ZONE_NAME = re.compile(r"^[A-Za-z0-9_+-]{1,30}(/[A-Za-z0-9_+-]{1,30}){0,2}$")


def _zone(name: str) -> Optional[zoneinfo.ZoneInfo]:
    """The IANA zone, or None. The name is looked up as a file: a name of 5000 characters made
    zoneinfo raise OSError (found by a property test), hence the shape check first."""
    if not _ZONE_NAME.match(name):
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None


def listen(fields: Mapping[str, Any]) -> Optional[Listen]:
    address = fields.get("listen")
    return None if address is None else Listen(*address)


def health(fields: Mapping[str, Any]) -> HealthFrom:
    return HealthFrom(fields.get("unhealthy_from", schema.text("health.unhealthy_from")))


def webhooks(c: Checker, entries: list[Entry]) -> tuple[Webhook, ...]:
    found: list[Webhook] = []
    for entry in entries:
        fields = dict(entry.fields)
        if "format" in fields:
            fields["format"] = WebhookFormat(fields["format"])
        if "on" in fields:
            fields["on"] = _on(c, f"{entry.where}.on", fields["on"])
        fields["headers"] = _headers(c, f"{entry.where}.headers", fields.get("headers", {}))
        if "url" in fields:
            found.append(Webhook(**fields))
    return tuple(found)


def _on(c: Checker, where: str, on: list[str]) -> tuple[str, ...]:
    for k, name in enumerate(on):
        if name not in WEBHOOK_EVENTS:
            c.fail(f"{where}[{k}]", f"must be one of {', '.join(WEBHOOK_EVENTS)}, got {name!r}")
    return tuple(on)


def _headers(c: Checker, where: str, headers: Mapping[Any, Any]) -> Mapping[str, str]:
    clean: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9-]{1,100}", name):
            c.fail(f"{where}.{name}", "not a valid header name")
        elif not isinstance(value, str) or any(ch in value for ch in "\r\n\x00"):
            c.fail(f"{where}.{name}", "must be a string on one line")
        else:
            clean[name] = value
    return frozen(clean)


def _declared_defaults() -> tuple[Mapping[str, Hook], Mapping[str, EventRule]]:
    """The default hooks and events are the schema's, read by the same checks as a file."""
    c = Checker("the schema's defaults", check_files=False)
    default_hooks = hooks(c, schema.key("hooks").default)
    default_events = events(c, schema.key("events").default, default_hooks)
    if c.problems:
        raise ConfigError(c.problems)
    return frozen(default_hooks), frozen(default_events)


DEFAULT_HOOKS: Mapping[str, Hook]
DEFAULT_EVENTS: Mapping[str, EventRule]
DEFAULT_HOOKS, DEFAULT_EVENTS = _declared_defaults()
# The hooks the default events name: a config with its own hooks must define them.
DEFAULT_NAMED = sorted({h for r in DEFAULT_EVENTS.values() for s in STAGES for h in r.hooks_for(s)})
