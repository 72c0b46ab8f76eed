"""The configuration as the daemon uses it: frozen settings, one class per section.

Field names are the schema's key names (a test holds each class and its section in step), so the
walker's checked values build them directly; the enums hold exactly the schema's `choices`.
"""

from __future__ import annotations

import enum
import ipaddress
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..windows import Window
from . import schema
from .provider import DEFAULT_URLS, Provider
from .schema import WEBHOOK_EVENTS


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
    """How a Pacemaker node is marked as going away (cluster.pacemaker.method)."""

    HEALTH = "health"
    STANDBY = "standby"


class ProviderSetting(str, enum.Enum):
    AUTO = "auto"
    AZURE = "azure"
    AWS = "aws"
    GCP = "gcp"


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
    attribute: str = schema.text("cluster.pacemaker.attribute")
    event_types: tuple[str, ...] = tuple(schema.strings("cluster.pacemaker.event_types"))
    nodes: Mapping[str, str] = field(default_factory=dict)  # casefolded VM name -> node name
    drain_timeout: float = schema.number("cluster.pacemaker.drain_timeout")
    min_healthy: int = int(schema.number("cluster.pacemaker.min_healthy"))

    def node_of(self, vm_name: str) -> str:
        """The cluster node a VM name of Resources stands for."""
        return self.nodes.get(vm_name.casefold(), vm_name)

    def drains(self, event_type: str) -> bool:
        return event_type in self.event_types


@dataclass(frozen=True)
class Coordination:
    """How VMs sharing an event learn the others are ready: exactly one of the two is set. A
    Pacemaker cluster is no part of it (`Config.cluster`): a node drains whichever is set."""

    etcd: Optional[Etcd] = None
    gate: Optional[Gate] = None

    @property
    def via(self) -> str:
        return "etcd" if self.etcd else "gate"


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return loopback_host(self.host)


@dataclass(frozen=True)
class Webhook:
    url: str
    format: WebhookFormat = WebhookFormat.JSON
    on: tuple[str, ...] = WEBHOOK_EVENTS
    timeout: float = schema.number("webhooks[].timeout")
    retries: int = int(schema.number("webhooks[].retries"))
    headers: Mapping[str, str] = field(default_factory=dict)
    proxy: Optional[str] = None


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
# The types whose VM does not come back (Terminate, Preempt): nothing is held for them.
NOT_BACK = ("Terminate", "Preempt")


@dataclass(frozen=True)
class Limit:
    """At most `max` VMs of `group` at once: one of the limits a VM's slots obey."""

    group: str
    max: int


@dataclass(frozen=True)
class Concurrency:
    """At most `max` VMs of `group` between before-hooks start and after-hooks end; with
    `more` (the list form), at the same time at most that many of each further group: a VM
    holds a slot in every group or in none."""

    group: str
    max: int = int(schema.number("concurrency.max"))
    ttl: int = int(schema.number("concurrency.ttl"))
    hold_max: int = int(schema.number("concurrency.hold_max"))
    after_retry: float = schema.number("concurrency.after_retry")
    more: tuple[Limit, ...] = ()  # the further groups, in the order written

    @property
    def limits(self) -> tuple[Limit, ...]:
        """Every group's limit, the first one's first."""
        return (Limit(self.group, self.max), *self.more)

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(limit.group for limit in self.limits)


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
    # Empty here: the schema's default hooks and events are checked like a file's (their hook
    # files on this machine) by the loader, which fills them in when a file leaves them out.
    hooks: Mapping[str, Hook] = field(default_factory=lambda: frozen({}))
    events: Mapping[str, EventRule] = field(default_factory=lambda: frozen({}))
    environment: Mapping[str, str] = field(default_factory=lambda: frozen({}))
    shutdown_grace: float = schema.number("shutdown_grace")
    coordination: Optional[Coordination] = None
    cluster: Optional[Pacemaker] = None  # cluster.pacemaker (or, formerly, coordination.pacemaker)
    listen: Optional[Listen] = None  # http.listen: /metrics, /health, /status
    metrics_textfile: Optional[Path] = None
    unhealthy_from: HealthFrom = _UNHEALTHY_FROM
    webhooks: tuple[Webhook, ...] = ()
    windows: tuple[Window, ...] = ()
    concurrency: Optional[Concurrency] = None
    provider: Provider = Provider.AZURE
    provider_why: str = "the default"  # how `provider` was chosen (check-config says it)
    warnings: tuple[str, ...] = ()  # not errors: said by check-config and logged at start

    @property
    def ready_via(self) -> Optional[str]:
        """How a shared event learns the other VMs it names are ready (approve: all): etcd or
        the gate when `coordination` is set, else the drains of the Pacemaker cluster's nodes."""
        if self.coordination is not None:
            return self.coordination.via
        return "pacemaker" if self.cluster is not None else None

    def policy(self, event_type: str) -> ApprovePolicy:
        """An event type's own `approve`, else the top-level one."""
        rule = self.events.get(event_type)
        return rule.approve if rule is not None and rule.approve is not None else self.approve


def frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return types.MappingProxyType(dict(mapping))


def loopback_host(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
