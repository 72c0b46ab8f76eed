"""The settings a VM shares with others: `coordination` (etcd or the gate), `concurrency` (slots
in that etcd) and `cluster` (the Pacemaker cluster it is a node of), built from checked values.
Coordination and the cluster are independent: a node can take a slot, then be drained."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from typing import Any, Optional, Union

from ..model import EVENT_TYPES
from . import files, logic, schema
from .sections import command
from .settings import (
    Concurrency,
    Config,
    Coordination,
    DrainMethod,
    Etcd,
    Gate,
    Limit,
    Pacemaker,
    frozen,
)
from .walker import Checker, Entry, kind_of, url_parts

# Pacemaker's own CLI, looked for where the distributions install it (never the caller's PATH).
CLUSTER_TOOLS = ("crm_attribute", "crm_mon", "crm_node", "crm_simulate")
TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
_ATTRIBUTE = re.compile(r"#health-[A-Za-z0-9_.-]{1,64}")
_GROUP = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def coordination(c: Checker, fields: Optional[Mapping[str, Any]]) -> Optional[Coordination]:
    if fields is None:
        return None
    chosen = logic.one_coordination(c, fields)
    if chosen == "etcd":
        return Coordination(etcd=etcd(c, fields["etcd"]))
    if chosen == "gate":
        return gate(c, fields["gate"])
    return None


def gate(c: Checker, fields: dict[str, Any]) -> Optional[Coordination]:
    where = "coordination.gate"
    fields.setdefault("timeout", schema.number(f"{where}.timeout"))  # not a hook's
    checked = command(c, Entry(where, fields))
    if checked is None:
        return None
    if "interval" in fields:
        return Coordination(gate=Gate(checked, fields["interval"]))
    return Coordination(gate=Gate(checked))


def etcd(c: Checker, fields: dict[str, Any]) -> Etcd:
    where = "coordination.etcd"
    urls: list[str] = []
    endpoints = fields.pop("endpoints", None)
    if endpoints == []:
        c.fail(f"{where}.endpoints", "must be a non-empty list of URLs, got an empty list")
    for i, url in enumerate(endpoints or []):
        parts = url_parts(url)
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            c.fail(f"{where}.endpoints[{i}]", f"must be an http(s):// URL with a host, got {url!r}")
        elif parts.path.strip("/") or parts.query or parts.fragment or parts.username:
            c.fail(
                f"{where}.endpoints[{i}]",
                f"must be scheme://host:port only (no path, query or credentials), got {url!r}",
            )
        else:
            urls.append(url.rstrip("/"))
    prefix = fields.get("prefix", Etcd.prefix)
    if not prefix.startswith("/") or any(ch.isspace() for ch in prefix) or len(prefix) > 200:
        c.fail(f"{where}.prefix", f"must start with / and hold no white space, got {prefix!r}")
    fields["prefix"] = prefix.rstrip("/") or "/"
    for key in ("ca_file", "cert_file", "key_file", "password_file"):
        secret = key in ("key_file", "password_file")
        fields[key] = files.check_readable(c, f"{where}.{key}", fields.get(key), secret=secret)
    logic.cert_with_key(c, where, {k: v for k, v in fields.items() if v is not None})
    logic.no_password_in_clear(c, where, fields.get("username"), urls)
    return Etcd(endpoints=tuple(urls), **fields)


def pacemaker(c: Checker, fields: dict[str, Any], where: str) -> Pacemaker:
    """`where`: cluster.pacemaker, or coordination.pacemaker as an older file spells it."""
    if "method" in fields:
        fields["method"] = DrainMethod(fields["method"])
    attribute = fields.get("attribute", Pacemaker.attribute)
    if not _ATTRIBUTE.fullmatch(attribute):
        c.fail(
            f"{where}.attribute",
            f"must be #health- and letters, digits, '_', '.', '-' (Pacemaker reads only "
            f"#health-* attributes as node health), got {attribute!r}",
        )
    if "event_types" in fields:
        types = fields["event_types"]
        unknown = [t for t in types if t not in EVENT_TYPES]
        if unknown:
            c.fail(
                f"{where}.event_types",
                f"unknown event type {unknown[0]!r} (expected: {', '.join(EVENT_TYPES)})",
            )
        fields["event_types"] = tuple(t for t in EVENT_TYPES if t in types)
    fields["nodes"] = _nodes(c, fields.get("nodes", {}), f"{where}.nodes")
    if c.check_files:
        lacking = [t for t in CLUSTER_TOOLS if shutil.which(t, path=TOOL_PATH) is None]
        if lacking:
            c.fail(
                where,
                f"the cluster tools are missing ({', '.join(lacking)} in {TOOL_PATH}): install "
                "pacemaker-cli-utils (Debian) or pacemaker-cli (Fedora/EL)",
            )
    return Pacemaker(**fields)


def _nodes(c: Checker, raw: Mapping[Any, Any], where: str) -> Mapping[str, str]:
    """VM name (as Resources spells it) -> cluster node name, keyed casefolded."""
    nodes: dict[str, str] = {}
    for vm, node in raw.items():
        if not isinstance(vm, str) or not vm.strip():
            c.fail(where, f"a VM name must be a string, got {kind_of(vm)}")
        elif not isinstance(node, str) or not _NODE_NAME.fullmatch(node):
            c.fail(
                f"{where}.{vm}",
                f"must be a cluster node name (letters, digits, '_', '.', '-'), got {node!r}",
            )
        else:
            nodes[vm.strip().casefold()] = node
    return frozen(nodes)


# The keys of `concurrency` that hold for a VM's slots together, not per group (one lease
# holds them all): in the list form, the values given must agree.
SHARED = ("ttl", "hold_max", "after_retry")


def concurrency(
    c: Checker, given: Union[dict[str, Any], list[Entry], None]
) -> Optional[Concurrency]:
    """The mapping form (one group), or the list form (one mapping per group: several limits
    at once, all held together, so `ttl`, `hold_max` and `after_retry` are one value each)."""
    if given is None:
        return None
    entries = given if isinstance(given, list) else [Entry("concurrency", given)]
    limits: list[Limit] = []
    shared: dict[str, dict[Any, str]] = {name: {} for name in SHARED}  # value -> where given
    for entry in entries:
        group = entry.fields.get("group")
        if group is None:
            continue  # required: said by the walk
        if not _GROUP.fullmatch(group):
            c.fail(
                f"{entry.where}.group",
                f"letters, digits, '_', '.', '-' (at most 64), got {group!r}",
            )
        elif group in (limit.group for limit in limits):
            c.fail(f"{entry.where}.group", f"{group!r} is given twice: one limit per group")
        limits.append(Limit(group, entry.fields.get("max", Concurrency.max)))
        for name in SHARED:
            if name in entry.fields:
                shared[name].setdefault(entry.fields[name], entry.where)
    for name, found in shared.items():
        if len(found) > 1:
            (one, where), (two, other) = list(found.items())[:2]
            c.fail(
                f"{other}.{name}",
                f"{two} differs from {where}.{name}'s {one}: the slots of every group are held "
                f"together (give {name} once, or the same on each)",
            )
    if not limits:
        return None
    values = {name: next(iter(found)) for name, found in shared.items() if found}
    first, *more = limits
    return Concurrency(first.group, first.max, more=tuple(more), **values)


# How long each event type usually keeps a VM away, as documented (docs/imds-reference, the
# README's fleet section): a live-migration Freeze pauses 5-30 s; a Reboot is Started until it
# leaves the document in 5-10 min; a Redeploy boots on another host and rebuilds the ephemeral
# disk (20 min, the longest seen). Terminate and Preempt do not come back: no hold.
USUAL_IMPACT: Mapping[str, int] = {"Freeze": 30, "Reboot": 600, "Redeploy": 1200}


def hold_warnings(config: Config) -> tuple[str, ...]:
    """`concurrency.hold_max` shorter than the longest hook timeout plus the usual impact of an
    event type that takes slots: a VM still down (or still undraining) may lose its slot."""
    concurrency = config.concurrency
    if concurrency is None:
        return ()
    longest = max((c.timeout for hook in config.hooks.values() for c in hook.commands), default=0)
    impacts = [
        (USUAL_IMPACT[t], t)
        for t, rule in config.events.items()
        if t in USUAL_IMPACT and rule.obeys_windows(t)
    ]
    if not impacts:
        return ()
    impact, event_type = max(impacts)
    if concurrency.hold_max >= longest + impact:
        return ()
    return (
        f"concurrency.hold_max: {concurrency.hold_max} s is shorter than the longest hook "
        f"timeout ({longest:g} s) plus a {event_type}'s usual impact ({impact} s): a VM still "
        "in its maintenance may lose its slot and let the next one go",
    )
