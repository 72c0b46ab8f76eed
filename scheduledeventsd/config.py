"""Load the YAML configuration into frozen objects, reporting every problem with its key path.

The daemon runs as root and executes what this file names, so everything is checked here,
once: a config that loads is one the core can trust without further checks.
"""

from __future__ import annotations

import datetime as dt
import enum
import ipaddress
import os
import re
import shutil
import stat
import types
import urllib.parse
import zoneinfo
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import yaml

from . import schema
from .model import EVENT_TYPES
from .providers.detect import DEFAULT_URLS, Provider, detect
from .schema import WEBHOOK_EVENTS
from .windows import DAYS, Window

DEFAULT_PATH = Path("/etc/scheduledeventsd/config.yaml")
_HOOK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV_PREFIX = "SCHEDULED_EVENT_"
_SURROGATE = re.compile("[\ud800-\udfff]")


class ApprovePolicy(str, enum.Enum):
    """Approving lets an event proceed for every VM it names: `sole` never rushes a neighbour."""

    SOLE = "sole"
    ALL = "all"  # a shared event once every VM it names is ready (through `coordination`)
    ALWAYS = "always"
    NEVER = "never"


class UserEvents(str, enum.Enum):
    """What to do with events a person asked for (EventSource User: a restart from the portal)."""

    HOOKS = "hooks"  # like any other event
    APPROVE = "approve"  # at once, no hooks: someone is waiting for it
    IGNORE = "ignore"  # left alone; it proceeds at NotBefore


class HealthFrom(str, enum.Enum):
    """From which moment of an event of ours /health answers 503 (until the event is over)."""

    DETECTED = "detected"
    HOOKS_STARTED = "hooks_started"
    HOOKS_DONE = "hooks_done"


class WebhookFormat(str, enum.Enum):
    JSON = "json"  # the event and what happened
    TEXT = "text"  # {"text": "one line"}: Slack, Mattermost, Teams workflows


class DrainMethod(str, enum.Enum):
    """How a Pacemaker node is marked as going away (coordination.pacemaker.method)."""

    HEALTH = "health"
    STANDBY = "standby"


class ProviderSetting(str, enum.Enum):
    AUTO = "auto"
    AZURE = "azure"
    AWS = "aws"
    GCP = "gcp"


E = TypeVar("E", ApprovePolicy, UserEvents, HealthFrom, WebhookFormat, DrainMethod, ProviderSetting)


class ConfigError(Exception):
    """All problems found in one file, each already prefixed with file and key path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Metadata:
    url: str = DEFAULT_URLS[Provider.AZURE]
    api_version: str = schema.text("metadata.api_version")
    poll_interval: float = schema.number("metadata.poll_interval")
    timeout: float = schema.number("metadata.timeout")
    first_call_timeout: float = schema.number("metadata.first_call_timeout")


@dataclass(frozen=True)
class HookCommand:
    argv: tuple[str, ...]
    timeout: float = schema.number("hooks.NAME[].timeout")


@dataclass(frozen=True)
class Hook:
    name: str
    commands: tuple[HookCommand, ...]


@dataclass(frozen=True)
class Etcd:
    """An etcd cluster the VMs of a fleet share; the password is read from its file when used,
    so it never sits in the config (or in anything that logs it)."""

    endpoints: tuple[str, ...]
    prefix: str = schema.text("coordination.etcd.prefix")
    timeout: float = schema.number("coordination.etcd.timeout")
    ca_file: Optional[Path] = None
    cert_file: Optional[Path] = None
    key_file: Optional[Path] = None
    username: Optional[str] = None
    password_file: Optional[Path] = None


@dataclass(frozen=True)
class Gate:
    """A command that says whether a shared event may be approved now (0), later (75), never."""

    command: HookCommand
    interval: float = schema.number("coordination.gate.interval")


@dataclass(frozen=True)
class Pacemaker:
    """This VM is a node of a Pacemaker cluster: the cluster moves its resources away before
    an event of `event_types` is approved, and takes them back once it is over."""

    method: DrainMethod = DrainMethod.HEALTH
    attribute: str = schema.text("coordination.pacemaker.attribute")
    event_types: tuple[str, ...] = tuple(schema.key("coordination.pacemaker.event_types").default)  # type: ignore[arg-type]
    nodes: Mapping[str, str] = field(default_factory=dict)  # casefolded VM name -> node name
    drain_timeout: float = schema.number("coordination.pacemaker.drain_timeout")
    min_healthy: int = int(schema.number("coordination.pacemaker.min_healthy"))

    def node_of(self, vm_name: str) -> str:
        """The cluster node a VM name of Resources stands for."""
        return self.nodes.get(vm_name.casefold(), vm_name)

    def drains(self, event_type: str) -> bool:
        return event_type in self.event_types


@dataclass(frozen=True)
class Coordination:
    """Exactly one of the three is set."""

    etcd: Optional[Etcd] = None
    gate: Optional[Gate] = None
    pacemaker: Optional[Pacemaker] = None

    @property
    def via(self) -> str:
        return "etcd" if self.etcd else "pacemaker" if self.pacemaker else "gate"


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return _loopback_host(self.host)


@dataclass(frozen=True)
class Webhook:
    url: str
    format: WebhookFormat = WebhookFormat.JSON
    on: tuple[str, ...] = WEBHOOK_EVENTS
    timeout: float = schema.number("webhooks[].timeout")
    retries: int = int(schema.number("webhooks[].retries"))
    headers: Mapping[str, str] = field(default_factory=dict)
    proxy: Optional[str] = None


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class EventRule:
    """What to do for one event type, in each stage of an event's life."""

    before: tuple[str, ...] = ()  # first seen Scheduled: prepare, then approve
    after: tuple[str, ...] = ()  # it is over (left after Started or our approval, or a reboot)
    cancelled: tuple[str, ...] = ()  # it left while Scheduled and not approved: undo `before`
    approve: Optional[ApprovePolicy] = None  # None: the top-level `approve`
    short_seconds: Optional[int] = None  # DurationInSeconds 0..this: no hooks, just approve
    start_before: Optional[float] = None  # start `before` only this many s before NotBefore
    window: Optional[bool] = None  # obey `windows`; None: as its type (WINDOWED)
    fast: Optional[tuple[str, ...]] = None  # instead of `before` when little time is left
    fast_below: float = schema.number("events.TYPE.fast_below")

    def hooks_for(self, stage: str) -> tuple[str, ...]:
        return {"before": self.before, "after": self.after, "cancelled": self.cancelled}[stage]

    def obeys_windows(self, event_type: str) -> bool:
        return self.window if self.window is not None else event_type in WINDOWED


# The types whose maintenance can wait for a window by default: the others (Freeze, Preempt,
# Terminate) come with seconds of notice or are not the VM's to plan.
WINDOWED = ("Reboot", "Redeploy")


@dataclass(frozen=True)
class Concurrency:
    """At most `max` VMs of `group` between before-hooks start and after-hooks end."""

    group: str
    max: int = int(schema.number("concurrency.max"))
    ttl: int = int(schema.number("concurrency.ttl"))


STAGES = ("before", "after", "cancelled")
_APPROVE = ApprovePolicy(schema.text("approve"))
_USER_EVENTS = UserEvents(schema.text("user_events"))
_UNHEALTHY_FROM = HealthFrom(schema.text("health.unhealthy_from"))


@dataclass(frozen=True)
class Config:
    path: Optional[Path] = None
    metadata: Metadata = field(default_factory=Metadata)
    vm_name: Optional[str] = None  # None: learn it from IMDS
    state_dir: Path = Path(schema.text("state_dir"))
    approve: ApprovePolicy = _APPROVE
    user_events: UserEvents = _USER_EVENTS
    hooks: Mapping[str, Hook] = field(default_factory=lambda: DEFAULT_HOOKS)
    events: Mapping[str, EventRule] = field(default_factory=lambda: DEFAULT_EVENTS)
    environment: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    shutdown_grace: float = schema.number("shutdown_grace")
    coordination: Optional[Coordination] = None
    listen: Optional[Listen] = None  # http.listen: /metrics, /health, /status
    metrics_textfile: Optional[Path] = None
    unhealthy_from: HealthFrom = _UNHEALTHY_FROM
    webhooks: tuple[Webhook, ...] = ()
    windows: tuple[Window, ...] = ()
    concurrency: Optional[Concurrency] = None
    provider: Provider = Provider.AZURE
    provider_why: str = "the default"  # how `provider` was chosen (check-config says it)
    warnings: tuple[str, ...] = ()  # not errors: said by check-config and logged at start

    def policy(self, event_type: str) -> ApprovePolicy:
        """An event type's own `approve`, else the top-level one."""
        rule = self.events.get(event_type)
        return rule.approve if rule is not None and rule.approve is not None else self.approve


def key_paths() -> frozenset[str]:
    """Every key path a config may hold; user-chosen names (hook names) are `*`."""
    return schema.key_paths()


MAX_FILE = 1 << 20  # bytes of a config file
MAX_PROBLEM = 300  # characters of one problem's text


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a root daemon's config that hides mistakes.
    Aliases are refused: a few hundred bytes of nested `*a` expand to gigabytes (a 474-byte
    file made a 122 MB error message), and a config has no need of them."""

    def compose_node(self, parent: Optional[yaml.Node], index: int) -> Optional[yaml.Node]:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not allowed in the configuration: write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> str:
        """A `"\\ud800"` escape makes a lone surrogate: no argv, environment, journal field or
        file can carry it (a hook given one fails to start); refused where it is written."""
        value = super().construct_scalar(node)
        if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "a surrogate escape (\\ud800 to \\udfff) is no character and cannot be "
                "encoded: write the character itself (or \\U and its 8 hex digits)",
                node.start_mark,
            )
        return value


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:  # noqa: ANN401
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # `[a]: b` (found by atheris): a list or mapping as a key
            raise yaml.constructor.ConstructorError(
                None, None, f"a {type(key).__name__} cannot be a key", key_node.start_mark
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _construct_timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:  # noqa: ANN401
    """`api_version: 2020-13-01` looks like a date to YAML; PyYAML then raises a bare
    ValueError (a traceback from check-config, found by the fuzzer's seeds)."""
    try:
        return loader.construct_yaml_timestamp(node)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"{_bounded(str(node.value))!r} looks like a date or time but is not one; "
            "quote it to mean text",
            node.start_mark,
        ) from None


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)
# YAML 1.2 booleans only: under YAML 1.1 a webhook's `on:` key would be the boolean True, and
# `yes`, `no`, `off` would not be the strings they look like. No base-60 integers either: a
# window's `end: 23:00` would be the number 82800.
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# Integers as YAML 1.2 reads them: `010` is ten, as it reads (YAML 1.1 made it octal 8, so a
# `timeout: 010` was 8 s and `08` was a string); octal is written `0o10`.
_UniqueKeyLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|0o[0-7]+|[-+]?[0-9][0-9_]*|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """Leading zeros are decimal; 0x, 0o, 0b say their base (see the resolver above)."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    digits = text.lstrip("+-")
    sign = -1 if text.startswith("-") else 1
    return sign * int(digits, 0 if digits[:2] in ("0x", "0o", "0b") else 10)


_UniqueKeyLoader.add_constructor(_INT, _construct_int)


class _Checker:
    """Collects problems so the user sees all of them in one run."""

    def __init__(self, source: str, *, check_files: bool = True) -> None:
        self.source = source
        self.check_files = check_files
        self.problems: list[str] = []

    def fail(self, where: str, problem: str) -> None:
        """One problem; never unbounded (a value quoted in it may be megabytes)."""
        if len(problem) > MAX_PROBLEM:
            problem = f"{problem[:MAX_PROBLEM]}... ({len(problem)} characters)"
        self.problems.append(f"{self.source}: {_bounded(where) or 'top level'}: {problem}")

    def mapping(self, value: Any, where: str, section: str) -> dict[str, Any]:  # noqa: ANN401
        """The keys of `section` (a schema path) that `value` holds; any other is a problem."""
        allowed = schema.children(section)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(where, f"must be a mapping, got {_kind(value)}")
            return {}
        for key in value:
            if key not in allowed:
                self.fail(
                    _join(where, str(key)), f"unknown key (expected one of: {', '.join(allowed)})"
                )
        return {k: v for k, v in value.items() if k in allowed}

    def entries(self, value: Any, path: str, what: str) -> Iterator[tuple[str, dict[str, Any]]]:  # noqa: ANN401
        """Each mapping of a list section (`webhooks`, `windows`) with its key path; anything
        else in it, or a section that is no list, is a problem."""
        if value is None:
            return
        if not isinstance(value, list):
            self.fail(path, f"must be a list of {what}, got {_kind(value)}")
            return
        for i, entry in enumerate(value):
            where = f"{path}[{i}]"
            fields = self.mapping(entry, where, f"{path}[]")
            if isinstance(entry, dict):
                yield where, fields

    def number(
        self,
        value: Any,  # noqa: ANN401
        where: str,
        path: str,
        *,
        low: Optional[float] = None,
        default: Optional[float] = None,
    ) -> float:
        """Seconds within the range `path` declares (`low`, `default`: where they depend on
        another key, e.g. first_call_timeout on timeout)."""
        declared_low, high = schema.bounds(path)
        low = declared_low if low is None else low
        if default is None:
            default = schema.number(path) if schema.key(path).default is not None else low
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(where, f"must be a number of seconds, got {_kind(value)}")
            return default
        if not low <= value <= high:
            self.fail(where, f"must be between {low:g} and {high:g}, got {value:g}")
            return default
        return float(value)

    def whole(self, value: Any, where: str, path: str) -> Optional[int]:  # noqa: ANN401
        """A whole number within the range `path` declares; None when absent or wrong."""
        low, high = schema.bounds(path)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(where, f"must be a whole number {low:g}..{high:g}, got {value!r}")
            return None
        return value

    def choice(self, value: Any, where: str, default: E) -> E:  # noqa: ANN401
        """One of an enum's values, e.g. `approve: sole`; the default when absent or wrong."""
        kind = type(default)
        text = self.string(value, where, default.value)
        if text not in {member.value for member in kind}:
            allowed = ", ".join(member.value for member in kind)
            self.fail(where, f"must be one of {allowed}, got {text!r}")
            return default
        return kind(text)

    def string(self, value: Any, where: str, default: str) -> str:  # noqa: ANN401
        if value is None:
            return default
        if not isinstance(value, str) or not value.strip():
            self.fail(where, f"must be a non-empty string, got {_kind(value)}")
            return default
        return value.strip()


def _kind(value: Any) -> str:  # noqa: ANN401
    if value is None:
        return "nothing"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_provider(c: _Checker, top: Mapping[str, Any]) -> tuple[Provider, str]:
    setting = c.choice(top.get("provider"), "provider", ProviderSetting.AUTO)
    if setting is not ProviderSetting.AUTO:
        return Provider(setting.value), "provider: " + setting.value
    dmi = c.string(top.get("dmi_dir"), "dmi_dir", schema.text("dmi_dir"))
    if not os.path.isabs(dmi) or "\x00" in dmi:
        c.fail("dmi_dir", f"must be an absolute path, got {dmi!r}")
        return Provider.AZURE, "provider: auto, dmi_dir unusable"
    found = detect(Path(dmi))
    return found.provider, f"provider: auto, {found.why}"


def _check_metadata(c: _Checker, raw: Any, provider: Provider) -> Metadata:  # noqa: ANN401
    fields = c.mapping(raw, "metadata", "metadata")
    d = Metadata()
    url = c.string(fields.get("url"), "metadata.url", DEFAULT_URLS[provider])
    parts = _url_parts(url)
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        c.fail("metadata.url", f"must be an http:// URL with a host, got {url!r}")
    elif parts.query or parts.fragment or parts.username or parts.password:
        c.fail(
            "metadata.url",
            "must not carry a query, fragment or credentials (api_version is separate)",
        )
    api_version = fields.get("api_version")
    if isinstance(api_version, dt.date):
        api_version = api_version.isoformat()  # an unquoted 2020-07-01 is a YAML date
    timeout = c.number(fields.get("timeout"), "metadata.timeout", "metadata.timeout")
    return Metadata(
        url=url.rstrip("/"),
        api_version=c.string(api_version, "metadata.api_version", d.api_version),
        poll_interval=c.number(
            fields.get("poll_interval"), "metadata.poll_interval", "metadata.poll_interval"
        ),
        timeout=timeout,
        first_call_timeout=c.number(
            fields.get("first_call_timeout"),
            "metadata.first_call_timeout",
            "metadata.first_call_timeout",
            low=timeout,
            default=max(d.first_call_timeout, timeout),
        ),
    )


def _check_executable(c: _Checker, where: str, path: str) -> str:
    """The path to run: the real file behind any symlink, checked, with every directory above
    it, so that no one but root can replace what was checked before it runs."""
    if not os.path.isabs(path):
        c.fail(where, f"must be an absolute path (no PATH lookup, no shell), got {path!r}")
        return path
    if not c.check_files:
        return path
    return _check_trusted(c, where, path, executable=True)


def _check_argument(c: _Checker, where: str, arg: str) -> str:
    """An argument naming an existing file (`[/usr/bin/python3, /opt/app/drain.py]`) is code
    root runs as much as argv[0]: checked the same way, and the checked real file is passed."""
    if not c.check_files or not os.path.isabs(arg) or not os.path.isfile(arg):
        return arg
    return _check_trusted(c, where, arg, executable=False)


def _check_trusted(c: _Checker, where: str, path: str, *, executable: bool) -> str:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        c.fail(where, f"{path}: {e.strerror.lower() if e.strerror else e}")
        return path
    shown = path if real == path else f"{path} (-> {real})"
    if not stat.S_ISREG(st.st_mode):
        c.fail(where, f"{shown}: not a regular file")
    elif executable and not os.access(real, os.X_OK):
        c.fail(where, f"{shown}: not executable")
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        c.fail(where, f"{shown}: writable by group or others; the daemon runs it as root")
    elif st.st_uid not in (0, os.geteuid()):
        c.fail(where, f"{shown}: owned by uid {st.st_uid}, not root; the daemon runs it as root")
    else:
        _check_directories(c, where, real)
    return real


def _check_directories(c: _Checker, where: str, real: str) -> None:
    """Whoever can write a directory on the path can swap the hook for their own program. A
    root-owned sticky directory (/tmp) is fine: others cannot replace root's entry in it."""
    for directory in reversed(Path(real).parents):
        try:
            st = os.stat(directory)
        except OSError as e:
            c.fail(where, f"{directory}: {e.strerror.lower() if e.strerror else e}")
            return
        if st.st_uid not in (0, os.geteuid()):
            c.fail(
                where,
                f"{real}: its directory {directory} is owned by uid {st.st_uid}, who could "
                "replace the hook; the daemon runs it as root",
            )
            return
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not st.st_mode & stat.S_ISVTX:
            c.fail(
                where,
                f"{real}: its directory {directory} is writable by group or others, who could "
                "replace the hook; the daemon runs it as root",
            )
            return


def _check_hooks(c: _Checker, raw: Any, label: str = "hooks") -> Mapping[str, Hook]:  # noqa: ANN401
    if raw is None:
        # The defaults are checked like written ones: a missing default hook is found now,
        # not when the first event arrives.
        return _check_hooks(c, schema.key("hooks").default, "hooks (default)")
    if not isinstance(raw, dict):
        c.fail(label, f"must be a mapping of hook name to commands, got {_kind(raw)}")
        return {}
    hooks: dict[str, Hook] = {}
    for name, commands in raw.items():
        where = f"{label}.{name}"
        if not isinstance(name, str) or not _HOOK_NAME.match(name):
            c.fail(where, "hook names are letters, digits, '_', '.', '-' (at most 64)")
            continue
        if not isinstance(commands, list) or not commands:
            c.fail(where, f"must be a non-empty list of commands, got {_kind(commands)}")
            continue
        parsed: list[HookCommand] = []
        for i, entry in enumerate(commands):
            cmd = _check_command(c, f"{where}[{i}]", entry)
            if cmd is not None:
                parsed.append(cmd)
        hooks[name] = Hook(name, tuple(parsed))
    return hooks


def _check_command(
    c: _Checker,
    where: str,
    entry: Any,  # noqa: ANN401 - YAML
    section: str = "hooks.NAME[]",
) -> Optional[HookCommand]:
    """One command of a hook, or the gate (`section` says which declaration applies)."""
    fields = c.mapping(entry, where, section)
    if not isinstance(entry, dict):
        return None
    argv = fields.get("command")
    if isinstance(argv, str):
        c.fail(
            f"{where}.command",
            "must be a list (argv; no shell runs it), e.g. [/path/to/hook, --flag]",
        )
        return None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        c.fail(f"{where}.command", f"must be a non-empty list of strings, got {_kind(argv)}")
        return None
    if any("\x00" in a for a in argv):
        c.fail(f"{where}.command", "contains a NUL character")
        return None
    program = _check_executable(c, f"{where}.command[0]", argv[0])
    args = [_check_argument(c, f"{where}.command[{i}]", a) for i, a in enumerate(argv[1:], 1)]
    timeout = c.number(fields.get("timeout"), f"{where}.timeout", f"{section}.timeout")
    return HookCommand((program, *args), timeout)


def _check_events(
    c: _Checker,
    raw: Any,  # noqa: ANN401 - YAML
    hooks: Mapping[str, Hook],
) -> Mapping[str, EventRule]:
    if raw is None:
        # The defaults are checked like a written section: they name hooks that a config with
        # its own `hooks` may not define (the first event of this VM would then find none).
        named = sorted(
            {h for rule in DEFAULT_EVENTS.values() for s in STAGES for h in rule.hooks_for(s)}
        )
        missing = [name for name in named if name not in hooks]
        if missing:
            c.fail(
                "events",
                f"not given, so the default events apply, and they name hook(s) "
                f"{', '.join(missing)} not defined under hooks (defined: "
                f"{', '.join(sorted(hooks)) or 'none'}); give events, or define "
                f"{', '.join(named)}",
            )
        return DEFAULT_EVENTS
    if not isinstance(raw, dict):
        c.fail("events", f"must be a mapping of event type to hook names, got {_kind(raw)}")
        return {}
    events: dict[str, EventRule] = {}
    for event_type, entry in raw.items():
        where = f"events.{event_type}"
        if event_type not in EVENT_TYPES:
            c.fail(where, f"unknown event type (expected one of: {', '.join(EVENT_TYPES)})")
            continue
        if entry is None or isinstance(entry, list):  # the plain list means `before`
            events[event_type] = EventRule(_hook_names(c, where, entry, hooks))
            continue
        if not isinstance(entry, dict):
            keys = ", ".join(schema.children("events.TYPE"))
            c.fail(where, f"must be a list of hook names or a mapping of {keys}")
            continue
        events[event_type] = _check_rule(c, where, entry, hooks)
    return events


def _check_rule(
    c: _Checker,
    where: str,
    entry: dict[str, Any],
    hooks: Mapping[str, Hook],
) -> EventRule:
    fields = c.mapping(entry, where, "events.TYPE")
    before = _hook_names(c, f"{where}.before", fields.get("before"), hooks)
    after = _hook_names(c, f"{where}.after", fields.get("after"), hooks)
    cancelled = (
        _hook_names(c, f"{where}.cancelled", fields["cancelled"], hooks)
        if "cancelled" in fields
        else after
    )
    approve = None
    if fields.get("approve") is not None:
        approve = c.choice(fields["approve"], f"{where}.approve", ApprovePolicy.SOLE)
    short = c.whole(
        fields.get("short_seconds"), f"{where}.short_seconds", "events.TYPE.short_seconds"
    )
    start_before = None
    if fields.get("start_before") is not None:
        start_before = c.number(
            fields["start_before"], f"{where}.start_before", "events.TYPE.start_before"
        )
    window = fields.get("window")
    if window is not None and not isinstance(window, bool):
        c.fail(f"{where}.window", f"must be true or false, got {_kind(window)}")
        window = None
    fast = None
    if fields.get("fast") is not None:
        fast = _hook_names(c, f"{where}.fast", fields["fast"], hooks)
    fast_below = c.number(fields.get("fast_below"), f"{where}.fast_below", "events.TYPE.fast_below")
    if "fast_below" in fields and fast is None:
        c.fail(f"{where}.fast_below", "given without fast (the hooks to run instead of before)")
    return EventRule(
        before, after, cancelled, approve, short, start_before, window, fast, fast_below
    )


def _hook_names(
    c: _Checker,
    where: str,
    listed: Any,  # noqa: ANN401 - YAML
    hooks: Mapping[str, Hook],
) -> tuple[str, ...]:
    names = [] if listed is None else listed
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        c.fail(where, f"must be a list of hook names, got {_kind(names)}")
        return ()
    for i, name in enumerate(names):
        if name not in hooks:
            defined = ", ".join(sorted(hooks)) or "none"
            c.fail(
                f"{where}[{i}]", f"hook {name!r} is not defined under hooks (defined: {defined})"
            )
    return tuple(names)


def _check_environment(c: _Checker, raw: Any) -> Mapping[str, str]:  # noqa: ANN401
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        c.fail("environment", f"must be a mapping of variable to string, got {_kind(raw)}")
        return {}
    env: dict[str, str] = {}
    for key, value in raw.items():
        where = f"environment.{key}"
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            c.fail(where, "not a valid environment variable name")
        elif key.startswith(_RESERVED_ENV_PREFIX):
            c.fail(where, f"{_RESERVED_ENV_PREFIX}* variables are set by the daemon for each event")
        elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
            c.fail(where, f"must be a string, got {_kind(value)}")
        elif "\x00" in str(value):
            c.fail(where, "contains a NUL character")
        else:
            env[key] = str(value)
    return env


def _check_coordination(c: _Checker, raw: Any) -> Optional[Coordination]:  # noqa: ANN401
    if raw is None:
        return None
    fields = c.mapping(raw, "coordination", "coordination")
    chosen = [k for k in schema.children("coordination") if fields.get(k) is not None]
    if len(chosen) != 1:
        got = " and ".join(chosen) if chosen else "neither"
        c.fail("coordination", f"must set exactly one of etcd, gate or pacemaker, got {got}")
        return None
    if chosen == ["pacemaker"]:
        return Coordination(pacemaker=_check_pacemaker(c, fields["pacemaker"]))
    if chosen == ["gate"]:
        where = "coordination.gate"
        command = _check_command(c, where, fields["gate"], where)
        if command is None:
            return None
        gate_fields = fields["gate"]
        interval = c.number(gate_fields.get("interval"), f"{where}.interval", f"{where}.interval")
        return Coordination(gate=Gate(command, interval))
    return Coordination(etcd=_check_etcd(c, fields["etcd"]))


# Pacemaker's own CLI, looked for where the distributions install it (never the caller's PATH).
CLUSTER_TOOLS = ("crm_attribute", "crm_mon", "crm_node", "crm_simulate")
TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")


def _check_pacemaker(c: _Checker, raw: Any) -> Optional[Pacemaker]:  # noqa: ANN401
    where = "coordination.pacemaker"
    fields = c.mapping(raw, where, where)
    d = Pacemaker()
    method = c.choice(fields.get("method"), f"{where}.method", d.method)
    attribute = c.string(fields.get("attribute"), f"{where}.attribute", d.attribute)
    if not re.fullmatch(r"#health-[A-Za-z0-9_.-]{1,64}", attribute):
        c.fail(
            f"{where}.attribute",
            f"must be #health- and letters, digits, '_', '.', '-' (Pacemaker reads only "
            f"#health-* attributes as node health), got {attribute!r}",
        )
    types = fields.get("event_types")
    event_types = d.event_types
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            c.fail(f"{where}.event_types", f"must be a list of event types, got {_kind(types)}")
        else:
            unknown = [t for t in types if t not in EVENT_TYPES]
            if unknown:
                c.fail(
                    f"{where}.event_types",
                    f"unknown event type {unknown[0]!r} (expected: {', '.join(EVENT_TYPES)})",
                )
            event_types = tuple(t for t in EVENT_TYPES if t in types)
    nodes = _check_nodes(c, fields.get("nodes"), f"{where}.nodes")
    drain_timeout = c.number(
        fields.get("drain_timeout"), f"{where}.drain_timeout", f"{where}.drain_timeout"
    )
    least = c.whole(fields.get("min_healthy"), f"{where}.min_healthy", f"{where}.min_healthy")
    if c.check_files:
        lacking = [t for t in CLUSTER_TOOLS if shutil.which(t, path=TOOL_PATH) is None]
        if lacking:
            c.fail(
                where,
                f"the cluster tools are missing ({', '.join(lacking)} in {TOOL_PATH}): install "
                "pacemaker-cli-utils (Debian) or pacemaker-cli (Fedora/EL)",
            )
    return Pacemaker(
        method=method,
        attribute=attribute,
        event_types=event_types,
        nodes=nodes,
        drain_timeout=drain_timeout,
        min_healthy=d.min_healthy if least is None else least,
    )


def _check_nodes(c: _Checker, raw: Any, where: str) -> Mapping[str, str]:  # noqa: ANN401
    """VM name (as Resources spells it) -> cluster node name, keyed casefolded."""
    nodes: dict[str, str] = {}
    if raw is not None and not isinstance(raw, dict):
        c.fail(where, f"must be a mapping of VM name to node name, got {_kind(raw)}")
        return _frozen(nodes)
    for vm, node in (raw or {}).items():
        if not isinstance(vm, str) or not vm.strip():
            c.fail(where, f"a VM name must be a string, got {_kind(vm)}")
        elif not isinstance(node, str) or not _NODE_NAME.fullmatch(node):
            c.fail(
                f"{where}.{vm}",
                f"must be a cluster node name (letters, digits, '_', '.', '-'), got {node!r}",
            )
        else:
            nodes[vm.strip().casefold()] = node
    return _frozen(nodes)


def _check_etcd(c: _Checker, raw: Any) -> Optional[Etcd]:  # noqa: ANN401
    where = "coordination.etcd"
    fields = c.mapping(raw, where, where)
    endpoints = fields.get("endpoints")
    if not isinstance(endpoints, list) or not endpoints:
        c.fail(f"{where}.endpoints", f"must be a non-empty list of URLs, got {_kind(endpoints)}")
        endpoints = []
    urls: list[str] = []
    for i, url in enumerate(endpoints):
        text = url if isinstance(url, str) else ""
        parts = _url_parts(text)
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            c.fail(f"{where}.endpoints[{i}]", f"must be an http(s):// URL with a host, got {url!r}")
        elif parts.path.strip("/") or parts.query or parts.fragment or parts.username:
            c.fail(
                f"{where}.endpoints[{i}]",
                f"must be scheme://host:port only (no path, query or credentials), got {url!r}",
            )
        else:
            urls.append(text.rstrip("/"))
    prefix = c.string(fields.get("prefix"), f"{where}.prefix", schema.text(f"{where}.prefix"))
    if not prefix.startswith("/") or any(ch.isspace() for ch in prefix) or len(prefix) > 200:
        c.fail(f"{where}.prefix", f"must start with / and hold no white space, got {prefix!r}")
    timeout = c.number(fields.get("timeout"), f"{where}.timeout", f"{where}.timeout")
    files: dict[str, Optional[Path]] = {}
    for key in ("ca_file", "cert_file", "key_file", "password_file"):
        secret = key in ("key_file", "password_file")
        files[key] = _check_readable(c, f"{where}.{key}", fields.get(key), secret=secret)
    if (files["cert_file"] is None) != (files["key_file"] is None):
        c.fail(f"{where}.cert_file", "cert_file and key_file go together (mutual TLS)")
    username = fields.get("username")
    if username is not None:
        username = c.string(username, f"{where}.username", "")
    if bool(username) != (files["password_file"] is not None):
        c.fail(f"{where}.username", "username and password_file go together")
    in_clear = [u for u in urls if u.startswith("http://") and not _loopback(u)]
    if username and in_clear:
        c.fail(
            f"{where}.endpoints",
            f"{in_clear[0]}: with a username the password would cross the network in clear; "
            "use https://",
        )
    return Etcd(
        endpoints=tuple(urls),
        prefix=prefix.rstrip("/") or "/",
        timeout=timeout,
        ca_file=files["ca_file"],
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        username=username or None,
        password_file=files["password_file"],
    )


def _url_parts(text: str) -> Optional[urllib.parse.SplitResult]:
    """None for what urlsplit refuses (`https://[`) or a port that is not one (`:99999`):
    both raise ValueError, the second only later, where the URL is used (found by the fuzzer)."""
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port
    except ValueError:
        return None
    return parts


_CLOCK = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")


def _check_windows(c: _Checker, raw: Any) -> tuple[Window, ...]:  # noqa: ANN401
    windows = []
    for where, fields in c.entries(raw, "windows", "windows"):
        days = fields.get("days", schema.key("windows[].days").default)
        if not isinstance(days, list) or not days or not all(d in DAYS for d in days):
            c.fail(f"{where}.days", f"must be a non-empty list of {', '.join(DAYS)}, got {days!r}")
            days = list(DAYS)
        start = _clock(c, f"{where}.start", fields.get("start"))
        end = _clock(c, f"{where}.end", fields.get("end"))
        name = c.string(
            fields.get("timezone"), f"{where}.timezone", schema.text("windows[].timezone")
        )
        zone = _zone(name)
        if zone is None:
            c.fail(f"{where}.timezone", f"not a time zone this machine knows (IANA), got {name!r}")
            continue
        if start is None or end is None:
            continue
        if start == end:
            c.fail(f"{where}.end", "must differ from start (a window of no time, or all day?)")
            continue
        windows.append(Window(frozenset(DAYS.index(d) for d in days), start, end, zone))
    return tuple(windows)


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


def _clock(c: _Checker, where: str, value: Any) -> Optional[dt.time]:  # noqa: ANN401
    match = _CLOCK.match(value) if isinstance(value, str) else None
    if match is None:
        c.fail(where, f'must be a time of day "HH:MM" (00:00 to 23:59), got {value!r}')
        return None
    return dt.time(int(match[1]), int(match[2]))


def _check_concurrency(c: _Checker, raw: Any, etcd: bool) -> Optional[Concurrency]:  # noqa: ANN401
    if raw is None:
        return None
    fields = c.mapping(raw, "concurrency", "concurrency")
    if not isinstance(raw, dict):
        return None
    group = c.string(fields.get("group"), "concurrency.group", "")
    if not group:
        c.fail("concurrency.group", "required: VMs naming the same group share its slots")
    elif not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", group):
        c.fail("concurrency.group", f"letters, digits, '_', '.', '-' (at most 64), got {group!r}")
    most = c.whole(fields.get("max"), "concurrency.max", "concurrency.max")
    ttl = c.whole(fields.get("ttl"), "concurrency.ttl", "concurrency.ttl")
    if not etcd:
        c.fail(
            "concurrency",
            "needs coordination.etcd: the slots are keys under leases in the fleet's etcd",
        )
    return Concurrency(
        group,
        Concurrency.max if most is None else most,
        Concurrency.ttl if ttl is None else ttl,
    )


def _loopback(url: str) -> bool:
    return _loopback_host(urllib.parse.urlsplit(url).hostname or "")


def _loopback_host(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_listen(c: _Checker, raw: Any) -> Optional[Listen]:  # noqa: ANN401
    fields = c.mapping(raw, "http", "http")
    value = fields.get("listen")
    if value is None:
        return None
    where = "http.listen"
    text = value if isinstance(value, str) else ""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        number = 0
    if not sep or not 1 <= number <= 65535:
        c.fail(
            where,
            f"must be ADDRESS:PORT with a numeric address (127.0.0.1:9650, [::1]:9650, "
            f"0.0.0.0:9650), got {value!r}",
        )
        return None
    return Listen(host, number)


def _check_textfile(c: _Checker, raw: Any) -> Optional[Path]:  # noqa: ANN401
    if raw is None:
        return None
    where = "metrics_textfile"
    text = c.string(raw, where, "")
    if not text:
        return None
    path = Path(text)
    if not path.is_absolute() or path.suffix != ".prom":
        c.fail(
            where,
            f"must be an absolute path ending in .prom (node_exporter reads no other), "
            f"got {text!r}",
        )
        return None
    if c.check_files and not path.parent.is_dir():
        c.fail(where, f"{path.parent}: no such directory")
    elif c.check_files and path.is_symlink():
        c.fail(
            where,
            f"{path} is a symbolic link: the daemon writes as root and replaces the file, so "
            "it must be a plain file (or absent)",
        )
    return path


def _check_webhooks(c: _Checker, raw: Any) -> tuple[Webhook, ...]:  # noqa: ANN401
    hooks: list[Webhook] = []
    for where, fields in c.entries(raw, "webhooks", "webhooks"):
        url = _check_url(c, f"{where}.url", fields.get("url"), required=True)
        retries = c.whole(fields.get("retries"), f"{where}.retries", "webhooks[].retries")
        hooks.append(
            Webhook(
                url=url or "",
                format=c.choice(fields.get("format"), f"{where}.format", WebhookFormat.JSON),
                on=_check_on(c, f"{where}.on", fields.get("on")),
                timeout=c.number(fields.get("timeout"), f"{where}.timeout", "webhooks[].timeout"),
                retries=Webhook.retries if retries is None else retries,
                headers=_check_headers(c, f"{where}.headers", fields.get("headers")),
                proxy=_check_url(c, f"{where}.proxy", fields.get("proxy"), required=False),
            )
        )
    return tuple(hooks)


def _check_on(c: _Checker, where: str, on: Any) -> tuple[str, ...]:  # noqa: ANN401
    if on is None:
        return WEBHOOK_EVENTS
    if not isinstance(on, list) or not all(isinstance(e, str) for e in on):
        c.fail(where, f"must be a list of: {', '.join(WEBHOOK_EVENTS)}")
        return WEBHOOK_EVENTS
    for k, name in enumerate(on):
        if name not in WEBHOOK_EVENTS:
            c.fail(f"{where}[{k}]", f"must be one of {', '.join(WEBHOOK_EVENTS)}, got {name!r}")
    return tuple(on)


def _check_headers(c: _Checker, where: str, headers: Any) -> Mapping[str, str]:  # noqa: ANN401
    if headers is None:
        return _frozen({})
    if not isinstance(headers, dict):
        c.fail(where, f"must be a mapping of header to value, got {_kind(headers)}")
        return _frozen({})
    clean: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9-]{1,100}", name):
            c.fail(f"{where}.{name}", "not a valid header name")
        elif not isinstance(value, str) or any(ch in value for ch in "\r\n\x00"):
            c.fail(f"{where}.{name}", "must be a string on one line")
        else:
            clean[name] = value
    return _frozen(clean)


def _check_url(c: _Checker, where: str, value: Any, *, required: bool) -> Optional[str]:  # noqa: ANN401
    if value is None and not required:
        return None
    text = value if isinstance(value, str) else ""
    parts = _url_parts(text)
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(ch.isspace() for ch in text)
    ):
        c.fail(where, f"must be an http(s):// URL with a host, got {value!r}")
        return None
    return text


def _check_readable(
    c: _Checker,
    where: str,
    value: Any,  # noqa: ANN401 - YAML
    *,
    secret: bool,
) -> Optional[Path]:
    """An absolute path to a file the daemon can read; a secret must be private to root."""
    if value is None:
        return None
    text = c.string(value, where, "")
    if not text:
        return None
    if not os.path.isabs(text):
        c.fail(where, f"must be an absolute path, got {text!r}")
        return None
    if c.check_files:
        try:
            st = os.stat(text)
            with open(text, "rb"):
                pass
        except OSError as e:
            c.fail(where, f"{text}: {e.strerror.lower() if e.strerror else e}")
            return None
        if not stat.S_ISREG(st.st_mode):
            c.fail(where, f"{text}: not a regular file")
        elif secret and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            c.fail(where, f"{text}: readable by group or others; it holds a secret (chmod 600)")
    return Path(text)


def parse(
    raw: Any,  # noqa: ANN401 - YAML
    source: str,
    path: Optional[Path] = None,
    *,
    check_files: bool = True,
) -> Config:
    """Validate an already-loaded YAML value; raise ConfigError listing every problem.

    `check_files=False` skips looking at the hook files on this machine (to compare the
    documented defaults on a machine without /etc/scheduledeventsd); the daemon never does.
    """
    c = _Checker(source, check_files=check_files)
    top = c.mapping(raw, "", "") if raw is not None else {}
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(c.problems)
    defaults = Config()
    provider, why = _check_provider(c, top)
    vm_name = c.string(top.get("vm_name"), "vm_name", schema.text("vm_name"))
    if any(ch.isspace() for ch in vm_name):
        c.fail("vm_name", f"must not contain white space, got {vm_name!r}")
    state_dir = c.string(top.get("state_dir"), "state_dir", str(defaults.state_dir))
    if not os.path.isabs(state_dir):
        c.fail("state_dir", f"must be an absolute path, got {state_dir!r}")
    approve = c.choice(top.get("approve"), "approve", defaults.approve)
    user_events = c.choice(top.get("user_events"), "user_events", defaults.user_events)
    metadata = _check_metadata(c, top.get("metadata"), provider)
    hooks = _check_hooks(c, top.get("hooks"))
    events = _check_events(c, top.get("events"), hooks)
    environment = _check_environment(c, top.get("environment"))
    grace = c.number(top.get("shutdown_grace"), "shutdown_grace", "shutdown_grace")
    coordination = _check_coordination(c, top.get("coordination"))
    listen = _check_listen(c, top.get("http"))
    textfile = _check_textfile(c, top.get("metrics_textfile"))
    health = c.mapping(top.get("health"), "health", "health")
    unhealthy_from = c.choice(
        health.get("unhealthy_from"), "health.unhealthy_from", defaults.unhealthy_from
    )
    webhooks = _check_webhooks(c, top.get("webhooks"))
    windows = _check_windows(c, top.get("windows"))
    etcd = coordination is not None and coordination.etcd is not None
    concurrency = _check_concurrency(c, top.get("concurrency"), etcd)
    wants_all = [
        where
        for where, policy in [
            ("approve", approve),
            *((f"events.{t}.approve", r.approve) for t, r in events.items()),
        ]
        if policy is ApprovePolicy.ALL
    ]
    if wants_all and top.get("coordination") is None:
        c.fail(
            wants_all[0],
            "approve: all needs a coordination section (etcd, gate or pacemaker) to learn when "
            "the other VMs an event names are ready",
        )
    if c.problems:
        raise ConfigError(c.problems)
    return Config(
        path=path,
        metadata=metadata,
        vm_name=None if vm_name == "auto" else vm_name,
        state_dir=Path(state_dir),
        approve=approve,
        user_events=user_events,
        hooks=_frozen(hooks),
        events=_frozen(events),
        environment=_frozen(environment),
        shutdown_grace=grace,
        coordination=coordination,
        listen=listen,
        metrics_textfile=textfile,
        unhealthy_from=unhealthy_from,
        webhooks=webhooks,
        windows=windows,
        concurrency=concurrency,
        provider=provider,
        provider_why=why,
        warnings=_provider_warnings(provider, top, events),
    )


def _provider_warnings(
    provider: Provider, top: Mapping[str, Any], events: Mapping[str, EventRule]
) -> tuple[str, ...]:
    """Keys that mean nothing for this provider: said, not refused, so one config serves every
    cloud."""
    if provider.can_approve:
        return ()
    found = []
    asking = [
        where
        for where, value in [
            ("approve", top.get("approve")),
            *((f"events.{t}.approve", r.approve and r.approve.value) for t, r in events.items()),
        ]
        if value not in (None, "never")
    ]
    if asking:
        found.append(
            f"{asking[0]}: {provider.value} takes no approval through its metadata service: "
            "nothing is posted, events proceed at their own time (hooks, after-hooks and "
            "everything else work)"
        )
    if isinstance(top.get("metadata"), dict) and "api_version" in top["metadata"]:
        found.append(f"metadata.api_version: Azure's alone; {provider.value} ignores it")
    return tuple(found)


def parse_yaml(text: str) -> Any:  # noqa: ANN401 - YAML
    """YAML as the config is read: safe, no duplicate keys, no aliases, YAML 1.2 booleans."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # `[[[[...` thousands deep (found by atheris)
        raise yaml.YAMLError("nested too deeply to be a configuration") from None
    except (ValueError, OverflowError) as e:  # a constructor's own error, never a traceback
        raise yaml.YAMLError(f"not a value YAML can hold: {_bounded(str(e))}") from None


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM else f"{text[:MAX_PROBLEM]}..."


def _read_bounded(path: Path) -> str:
    """At most MAX_FILE bytes: a config is a few kilobytes, and SIGHUP reads it on the loop."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise ConfigError([f"{path}: larger than {MAX_FILE // 1024} KiB; not a configuration"])
    return data.decode("utf-8")


def load(path: Path, *, reader: Callable[[Path], str] = _read_bounded) -> Config:
    """Read and validate a config file; a missing file is an error, never silent defaults."""
    source = str(path)
    try:
        text = reader(path)
    except OSError as e:
        raise ConfigError([f"{source}: cannot read: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError([f"{source}: not UTF-8 text: {e.reason}"]) from None
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "YAML"
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{source}: {where}: {_bounded(problem)}"]) from None
    config = parse(raw, source, path)
    return replace(config, warnings=config.warnings + _secret_warnings(config, path))


def _secret_warnings(config: Config, path: Path) -> tuple[str, ...]:
    """Webhook URLs (a Slack or Teams URL is its own secret) and headers in a file others can
    read: worth a warning, not a refusal (the shipped file is 0644 and holds none)."""
    secrets = [
        f"webhooks[{i}].{'headers' if hook.headers else 'url'}"
        for i, hook in enumerate(config.webhooks)
    ]
    try:
        mode = path.stat().st_mode
    except OSError:
        return ()
    if not secrets or not mode & (stat.S_IRGRP | stat.S_IROTH):
        return ()
    return (
        f"{path}: {secrets[0]}: a secret in a file readable by group or others "
        f"(mode {stat.S_IMODE(mode):o}); chmod 600 {path}",
    )


def _declared_defaults() -> tuple[Mapping[str, Hook], Mapping[str, EventRule]]:
    """The default hooks and events are the schema's, read by the same checks as a file."""
    c = _Checker("the schema's defaults", check_files=False)
    hooks = _check_hooks(c, schema.key("hooks").default)
    events = _check_events(c, schema.key("events").default, hooks)
    if c.problems:
        raise ConfigError(c.problems)
    return _frozen(hooks), _frozen(events)


DEFAULT_HOOKS: Mapping[str, Hook]
DEFAULT_EVENTS: Mapping[str, EventRule]
DEFAULT_HOOKS, DEFAULT_EVENTS = _declared_defaults()
