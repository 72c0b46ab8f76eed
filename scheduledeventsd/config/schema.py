"""Every configuration key, declared once: its place, kind, default, range or choices and one
line of documentation.

The walker (walker.py) checks every value by its kind, range, choices and `required` from here;
docs/config.py writes the README's reference, the man page's CONFIGURATION section and the
shipped etc/scheduledeventsd/config.yaml from here (a test fails when one is stale).
"""

from __future__ import annotations

from collections.abc import Mapping

from .kinds import Key, Kind, Value

__all__ = [
    "APPROVE_CHOICES",
    "BY_PATH",
    "HOOK_DIR",
    "KEYS",
    "WEBHOOK_EVENTS",
    "Key",
    "Kind",
    "Value",
    "bounds",
    "children",
    "key",
    "key_paths",
    "number",
    "strings",
    "text",
]

HOOK_DIR = "/etc/scheduledeventsd/hooks"
WEBHOOK_EVENTS = (
    "detected",
    "waiting",
    "hooks_failed",
    "approved",
    "missed",
    "cancelled",
    "completed",
    "after_hooks_failed",
    "cluster_drained",
    "cluster_hold",
    "cluster_restored",
)
APPROVE_CHOICES = (
    ("sole", "approve only events naming this VM alone (shared ones proceed at NotBefore)"),
    ("all", "like sole, and a shared event once every VM it names is ready (coordination)"),
    ("always", "approve as soon as this VM's hooks succeeded"),
    ("never", "run hooks only"),
)

_HOLD_MAX = (
    "A slot held through a maintenance (from its event's approval) is on a lease this long, "
    "renewed while the daemon lives: a daemon that stops or is killed then leaves it held this "
    "long, until it is back and its after-hooks succeeded; a Terminate or Preempt frees it as "
    "the VM goes."
)
_AFTER_RETRY = "After-hooks that fail holding a slot keep it held, and run again this long after."

KEYS: tuple[Key, ...] = (
    Key(
        "provider",
        Kind.CHOICE,
        "Whose metadata service and notices; auto reads the machine's DMI data, never the network.",
        "auto",
        choices=(
            ("auto", "read from /sys/class/dmi/id (Azure when it names no cloud)"),
            ("azure", "Azure Scheduled Events (approval posted)"),
            ("aws", "EC2 instance metadata, IMDSv2: spot and scheduled events (no approval)"),
            ("gcp", "Compute Engine metadata server, long-polled (no approval)"),
        ),
    ),
    Key(
        "dmi_dir",
        Kind.PATH,
        "Where provider: auto reads the DMI data (for tests).",
        "/sys/class/dmi/id",
    ),
    Key("metadata", Kind.SECTION, "Where and how often to ask IMDS; never through a proxy."),
    Key(
        "metadata.url",
        Kind.URL,
        "The endpoint: http(s), no query (api_version is separate).",
        None,
        default_text="the provider's: Azure http://169.254.169.254/metadata/scheduledevents, "
        "AWS http://169.254.169.254, Google Cloud "
        "http://metadata.google.internal/computeMetadata/v1",
    ),
    Key("metadata.api_version", Kind.TEXT, "The api-version asked for (Azure).", "2020-07-01"),
    Key(
        "metadata.poll_interval",
        Kind.SECONDS,
        "Between poll starts (IMDS allows 5 requests/s per VM, approvals included).",
        1,
        0.25,
        60,
    ),
    Key(
        "metadata.timeout",
        Kind.SECONDS,
        "Whole deadline of one request, name lookup included.",
        5,
        0.1,
        60,
    ),
    Key(
        "metadata.first_call_timeout",
        Kind.SECONDS,
        "Deadline of the first request, which IMDS may take 2 minutes to answer; at least timeout.",
        150,
        0.1,
        900,
    ),
    Key(
        "vm_name",
        Kind.TEXT,
        "This VM's name as Resources spells it; auto asks IMDS (scale sets: scaleset_instance).",
        "auto",
    ),
    Key(
        "state_dir",
        Kind.PATH,
        "Where the daemon keeps what it must not forget, and its lock (a directory).",
        "/var/lib/scheduledeventsd",
    ),
    Key(
        "approve",
        Kind.CHOICE,
        "Approving lets an event proceed at once for every VM it names.",
        "sole",
        choices=APPROVE_CHOICES,
    ),
    Key(
        "user_events",
        Kind.CHOICE,
        "Events a person asked for (EventSource User, e.g. a restart from the portal).",
        "hooks",
        choices=(
            ("hooks", "like any other event"),
            ("approve", "approved at once, no hooks: someone is waiting for it"),
            ("ignore", "left alone; it proceeds at NotBefore"),
        ),
    ),
    Key(
        "hooks",
        Kind.NAMED,
        "Hook name -> commands run in order (no shell; the event on stdin, in SCHEDULED_EVENT_*).",
        {
            name: [{"command": [f"{HOOK_DIR}/{name}"], "timeout": 300}]
            for name in ("drain", "checkpoint", "undrain", "shutdown")
        },
    ),
    Key(
        "hooks.NAME[].command",
        Kind.ARGV,
        "Absolute path to a root-owned executable not writable by others, then its arguments.",
        required=True,
        example="[/usr/bin/python3, /opt/app/drain.py, --fast]",
    ),
    Key(
        "hooks.NAME[].timeout",
        Kind.SECONDS,
        "Then its process group is stopped and it counts as failed.",
        300,
        0.1,
        86400,
    ),
    Key(
        "events",
        Kind.NAMED,
        "Event type -> hooks per stage; a plain list means before; a type left out is left alone.",
        {
            "Freeze": {"before": ["checkpoint"]},
            "Reboot": {"before": ["drain", "checkpoint"], "after": ["undrain"]},
            "Redeploy": {"before": ["drain", "checkpoint"], "after": ["undrain"]},
            "Preempt": ["shutdown"],
            "Terminate": ["drain", "shutdown"],
        },
    ),
    Key(
        "events.TYPE.before",
        Kind.HOOK_NAMES,
        "Run when first seen Scheduled; when all succeed it is approved per approve ([]: at once).",
        [],
    ),
    Key(
        "events.TYPE.after",
        Kind.HOOK_NAMES,
        "Run once when it is over (gone after Started or approval, or Started or gone after "
        "this VM rebooted).",
        [],
    ),
    Key(
        "events.TYPE.cancelled",
        Kind.HOOK_NAMES,
        "Run once when it left while Scheduled and not approved (running before-hooks stopped).",
        default_text="as after",
    ),
    Key(
        "events.TYPE.approve",
        Kind.CHOICE,
        "This type's own approve policy.",
        choices=APPROVE_CHOICES,
        example="always",
        default_text="the top-level approve",
    ),
    Key(
        "events.TYPE.short_seconds",
        Kind.WHOLE,
        "DurationInSeconds known and 0..this: no hooks, approved per approve.",
        low=0,
        high=3600,
        example="9",
        default_text="none",
    ),
    Key(
        "events.TYPE.start_before",
        Kind.SECONDS,
        "Start before-hooks only when NotBefore is this near (a Reboot may come 7 days ahead);"
        " windows pick the first instant inside one within it.",
        low=0,
        high=7 * 86400,
        example="900",
        default_text="at once",
    ),
    Key(
        "events.TYPE.window",
        Kind.BOOL,
        "Obey windows: wait for one to open before starting before-hooks.",
        default_text="true for Reboot and Redeploy, false otherwise",
        example="false",
    ),
    Key(
        "events.TYPE.fast",
        Kind.HOOK_NAMES,
        "Run instead of before when less than fast_below seconds are left as they would start.",
        default_text="before, whatever is left",
        example="[checkpoint]",
    ),
    Key(
        "events.TYPE.fast_below",
        Kind.SECONDS,
        "With fast: the seconds to NotBefore under which fast runs instead of before.",
        120,
        0,
        86400,
    ),
    Key(
        "windows",
        Kind.LIST,
        "When early maintenance may start; []: any time. Types with window: true wait for one.",
        [],
    ),
    Key(
        "windows[].days",
        Kind.LIST,
        "Days it opens on: mon, tue, wed, thu, fri, sat, sun.",
        ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        example="[sat, sun]",
    ),
    Key(
        "windows[].start",
        Kind.CLOCK,
        "When it opens, local to timezone; a day whose window the spring change skips wholly"
        " has none.",
        required=True,
        example='"02:00"',
    ),
    Key(
        "windows[].end",
        Kind.CLOCK,
        "When it closes; not after start: the next day (23:00-01:00).",
        required=True,
        example='"05:00"',
    ),
    Key(
        "windows[].timezone",
        Kind.TEXT,
        "An IANA time zone; daylight saving is the zone's.",
        "UTC",
        example="Europe/Berlin",
    ),
    Key(
        "concurrency",
        Kind.SECTIONS,
        "At most max VMs of a group in early maintenance at once (slots in coordination.etcd). "
        "Several limits at once: a list of these mappings, one per group (a tier and a zone); "
        "an event's hooks start only once the VM holds a slot in every group, all taken in one "
        "etcd transaction; ttl, if given on several, the same on each.",
        example="[{group: web, max: 1}, {group: zone-1, max: 2}]",
    ),
    Key(
        "concurrency.group",
        Kind.TEXT,
        "VMs naming the same group share its slots.",
        required=True,
        example="web",
    ),
    Key(
        "concurrency.max",
        Kind.WHOLE,
        "Slots of the group: VMs between before-hooks start and after-hooks end.",
        1,
        1,
        1000,
    ),
    Key(
        "concurrency.ttl",
        Kind.WHOLE,
        "Lease of a held slot, renewed every third of it: a daemon killed before its event's "
        "approval loses it within this (after it, hold_max applies); "
        "unconfirmed by etcd for this long (a partition), it counts as lost: no early approval.",
        30,
        5,
        300,
    ),
    Key("concurrency.hold_max", Kind.WHOLE, _HOLD_MAX, 3600, 5, 7 * 24 * 3600),
    Key("concurrency.after_retry", Kind.SECONDS, _AFTER_RETRY, 60, 1, 3600),
    Key(
        "environment",
        Kind.NAMED,
        "Extra variables for every hook (the daemon's own environment is not passed on).",
        {},
        example="{KUBECONFIG: /etc/kubernetes/admin.conf}",
    ),
    Key(
        "shutdown_grace",
        Kind.SECONDS,
        "On stop, how long running hooks may go on before they are killed (rerun on start).",
        120,
        0,
        3600,
    ),
    Key(
        "coordination",
        Kind.SECTION,
        "How VMs sharing an event learn the others are ready (approve: all): etcd (which "
        "also keeps concurrency's slots) or a gate.",
    ),
    Key(
        "coordination.etcd",
        Kind.SECTION,
        "Each VM writes prefix/events/ID/vm = ready under a lease and watches prefix/settled/ID.",
    ),
    Key(
        "coordination.etcd.endpoints",
        Kind.LIST,
        "Client URLs of the members (scheme://host:port), tried in turn.",
        required=True,
        example="[https://10.0.0.4:2379, https://10.0.0.5:2379, https://10.0.0.6:2379]",
    ),
    Key("coordination.etcd.prefix", Kind.TEXT, "Where the keys go.", "/scheduledeventsd"),
    Key(
        "coordination.etcd.timeout",
        Kind.SECONDS,
        "Per request and endpoint, for all of it: connecting, the headers, the answer (read up "
        "to 4 MiB, as is each message of a watch).",
        5,
        0.1,
        60,
    ),
    Key(
        "coordination.etcd.ca_file",
        Kind.PATH,
        "The CA of the members' certificates (default: the system's).",
        example="/etc/scheduledeventsd/etcd-ca.pem",
    ),
    Key(
        "coordination.etcd.cert_file",
        Kind.PATH,
        "Client certificate for mutual TLS, with key_file.",
        example="/etc/scheduledeventsd/etcd-client.pem",
    ),
    Key(
        "coordination.etcd.key_file",
        Kind.PATH,
        "Its key; not readable by group or others (chmod 600).",
        example="/etc/scheduledeventsd/etcd-client.key",
    ),
    Key("coordination.etcd.username", Kind.TEXT, "etcd user, with password_file.", example="sed"),
    Key(
        "coordination.etcd.password_file",
        Kind.PATH,
        "A file holding the password (never the password itself); chmod 600.",
        example="/etc/scheduledeventsd/etcd-password",
    ),
    Key(
        "coordination.gate",
        Kind.SECTION,
        "Instead of etcd, a command asked after this VM's hooks: exit 0 approve, 75 not yet.",
    ),
    Key(
        "coordination.gate.command",
        Kind.ARGV,
        "Its argv, checked like a hook command.",
        required=True,
        example="[/usr/local/sbin/maintenance-gate]",
    ),
    Key(
        "coordination.gate.timeout",
        Kind.SECONDS,
        "Then it is killed, and asked again with backoff.",
        60,
        0.1,
        86400,
    ),
    Key(
        "coordination.gate.interval",
        Kind.SECONDS,
        "Between asks while it answers 75.",
        10,
        1,
        3600,
    ),
    Key(
        "cluster",
        Kind.SECTION,
        "The cluster this VM is a node of, drained before its maintenance; independent of "
        "coordination and concurrency (a slot is taken first, then the node drained).",
    ),
    Key(
        "cluster.pacemaker",
        Kind.SECTION,
        "This VM is a Pacemaker node: the cluster moves its resources away before an event "
        "(formerly coordination.pacemaker, still read there with a warning).",
    ),
    Key(
        "cluster.pacemaker.method",
        Kind.CHOICE,
        "How this node is marked as going away.",
        "health",
        choices=(
            ("health", "a node-health attribute (needs node-health-strategy set)"),
            ("standby", "node standby"),
        ),
    ),
    Key(
        "cluster.pacemaker.attribute",
        Kind.TEXT,
        "method health: the node attribute set to -1000000, then 0 (a #health-* name).",
        "#health-scheduledevents",
    ),
    Key(
        "cluster.pacemaker.event_types",
        Kind.LIST,
        "Types that drain this node first (a Freeze's pause is shorter than a move).",
        ["Reboot", "Redeploy", "Preempt", "Terminate"],
    ),
    Key(
        "cluster.pacemaker.nodes",
        Kind.NAMED,
        "VM name (as in Resources) -> cluster node name; default: the same, case-insensitive.",
        {},
        example="{sap-vm-1: hana1, sap-vm-2: hana2}",
    ),
    Key(
        "cluster.pacemaker.drain_timeout",
        Kind.SECONDS,
        "For the resources to leave this node (at most until NotBefore); then hold.",
        600,
        1,
        86400,
    ),
    Key(
        "cluster.pacemaker.min_healthy",
        Kind.WHOLE,
        "Never drain when fewer other nodes would stay online and healthy; hold instead.",
        1,
        0,
        64,
    ),
    Key("http", Kind.SECTION, "The daemon's own HTTP endpoint."),
    Key(
        "http.listen",
        Kind.ADDRESS,
        "Serve /health, /metrics, /status here; other hosts get /health only; null: no socket.",
        example="127.0.0.1:9650",
    ),
    Key(
        "metrics_textfile",
        Kind.PATH,
        "A node_exporter textfile (.prom), written atomically when the metrics change.",
        example="/var/lib/prometheus/node-exporter/scheduledeventsd.prom",
    ),
    Key("health", Kind.SECTION, "What /health answers."),
    Key(
        "health.unhealthy_from",
        Kind.CHOICE,
        "From when an event of this VM makes /health answer 503, until it is over.",
        "detected",
        choices=(
            ("detected", "as soon as it is seen"),
            ("hooks_started", "once its before-hooks (or its Pacemaker drain) start"),
            ("hooks_done", "once its before-hooks ended"),
        ),
    ),
    Key(
        "webhooks",
        Kind.LIST,
        "Where to say what happened; delivery never holds up polling, hooks or approvals.",
        [],
    ),
    Key(
        "webhooks[].url",
        Kind.URL,
        "http(s) URL to POST to (a Slack or Teams URL is a secret: chmod 600 the file).",
        required=True,
        example="https://hooks.example.com/T000/B000/XXXX",
    ),
    Key(
        "webhooks[].format",
        Kind.CHOICE,
        "What is posted.",
        "json",
        choices=(
            ("json", "the event and what happened"),
            ("text", '{"text": "one line"}: Slack, Mattermost, Teams workflows'),
        ),
    ),
    Key(
        "webhooks[].on",
        Kind.LIST,
        f"What to tell: any of {', '.join(WEBHOOK_EVENTS)}.",
        list(WEBHOOK_EVENTS),
    ),
    Key(
        "webhooks[].timeout",
        Kind.SECONDS,
        "Per attempt, for all of it: connecting, sending and the reply (its status, headers and "
        "at most 4 KiB of its body; a reply still coming is cut).",
        5,
        0.1,
        60,
    ),
    Key(
        "webhooks[].retries",
        Kind.WHOLE,
        "Attempts after the first, after a failed connection, a timeout or a 408, 425, 429 or "
        "5xx, with backoff (0.5 s, 1 s, 2 s, ... or the reply's Retry-After, at most 60 s).",
        5,
        0,
        20,
    ),
    Key(
        "webhooks[].headers",
        Kind.NAMED,
        "Extra headers.",
        {},
        example='{Authorization: "Bearer ..."}',
    ),
    Key(
        "webhooks[].proxy",
        Kind.URL,
        "An http(s) proxy for this webhook only; IMDS never uses one.",
        example="http://proxy.example.com:3128",
    ),
)

BY_PATH: Mapping[str, Key] = {key.path: key for key in KEYS}


def key(path: str) -> Key:
    return BY_PATH[path]


def children(section: str) -> tuple[str, ...]:
    """The names a section allows, in declared order; "" is the top level."""
    return tuple(k.name for k in KEYS if k.parent == section)


def bounds(path: str) -> tuple[float, float]:
    declared = BY_PATH[path]
    if declared.low is None or declared.high is None:
        raise KeyError(f"{path} declares no range")
    return declared.low, declared.high


def number(path: str) -> float:
    default = BY_PATH[path].default
    assert isinstance(default, (int, float)), path  # noqa: S101 - a declaration error
    return float(default)


def text(path: str) -> str:
    default = BY_PATH[path].default
    assert isinstance(default, str), path  # noqa: S101 - a declaration error
    return default


def strings(path: str) -> list[str]:
    default = BY_PATH[path].default
    assert isinstance(default, list), path  # noqa: S101 - a declaration error
    return [str(item) for item in default]


def key_paths() -> frozenset[str]:
    """Every key path a config may hold, chosen names and list items as `*`."""
    return frozenset(k.pattern for k in KEYS)
