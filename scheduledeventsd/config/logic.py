"""The rules between keys, each on values the walker already checked by their own kind (as
borgmatic's apply_logical_validation): what one key allows depends on another, or on a section
elsewhere. A rule that one key's declaration can say belongs in the schema, not here."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Optional

from . import schema
from .settings import ApprovePolicy, Coordination, EventRule, Hook, loopback_host
from .walker import Checker, Entry

# The old spelling of the cluster section, still read (with a warning naming the new one).
OLD_CLUSTER = "coordination.pacemaker"


def first_call_after_timeout(c: Checker, fields: dict[str, Any]) -> None:
    """metadata.first_call_timeout is at least metadata.timeout; its default grows with it."""
    timeout = fields.get("timeout", schema.number("metadata.timeout"))
    first = fields.get("first_call_timeout")
    _, high = schema.bounds("metadata.first_call_timeout")
    if first is None:
        fields["first_call_timeout"] = max(schema.number("metadata.first_call_timeout"), timeout)
    elif first < timeout:
        c.fail(
            "metadata.first_call_timeout",
            f"must be between {timeout:g} (metadata.timeout) and {high:g}, got {first:g}",
        )
        fields["first_call_timeout"] = max(schema.number("metadata.first_call_timeout"), timeout)


def hooks_defined(
    c: Checker,
    where: str,
    fields: Mapping[str, Any],
    hooks: Mapping[str, Hook],
    *,
    plain: bool = False,
) -> None:
    """Every hook an event rule names is defined under hooks (`plain`: the rule was written as
    the list of its before-hooks, and is named so)."""
    for stage in ("before", "after", "cancelled", "fast"):
        for i, name in enumerate(fields.get(stage, ())):
            if name not in hooks:
                defined = ", ".join(sorted(hooks)) or "none"
                c.fail(
                    f"{where}[{i}]" if plain else f"{where}.{stage}[{i}]",
                    f"hook {name!r} is not defined under hooks (defined: {defined})",
                )


def fast_below_with_fast(c: Checker, where: str, fields: Mapping[str, Any]) -> None:
    if "fast_below" in fields and "fast" not in fields:
        c.fail(f"{where}.fast_below", "given without fast (the hooks to run instead of before)")


def default_events_defined(c: Checker, named: list[str], hooks: Mapping[str, Hook]) -> None:
    """`events` not given: the default events apply, and they name hooks a config with its own
    `hooks` may not define (the first event of this VM would then find none)."""
    missing = [name for name in named if name not in hooks]
    if missing:
        c.fail(
            "events",
            f"not given, so the default events apply, and they name hook(s) "
            f"{', '.join(missing)} not defined under hooks (defined: "
            f"{', '.join(sorted(hooks)) or 'none'}); give events, or define "
            f"{', '.join(named)}",
        )


def window_has_length(c: Checker, entry: Entry) -> bool:
    if entry.fields["start"] == entry.fields["end"]:
        c.fail(f"{entry.where}.end", "must differ from start (a window of no time, or all day?)")
        return False
    return True


def one_coordination(c: Checker, fields: Mapping[str, Any]) -> Optional[str]:
    """`coordination` is etcd or the gate: which one (None, and a problem, for both or none)."""
    chosen = [k for k in schema.children("coordination") if k in fields]
    if len(chosen) != 1:
        got = " and ".join(chosen) if chosen else "neither"
        c.fail(
            "coordination",
            f"must set exactly one of etcd or gate (a Pacemaker cluster goes under "
            f"cluster.pacemaker), got {got}",
        )
        return None
    return chosen[0]


def old_cluster_spelling(
    c: Checker, top: Mapping[str, Any]
) -> tuple[dict[str, Any], Any, list[str]]:
    """`coordination.pacemaker` (the spelling before coordination and cluster were split) taken
    out of the top level, to be read as `cluster.pacemaker`; a warning naming the new spelling.
    Given both ways, it is a problem: which one is meant?"""
    coordination = top.get("coordination")
    if not isinstance(coordination, dict) or coordination.get("pacemaker") is None:
        return dict(top), None, []
    rest = {k: v for k, v in coordination.items() if k != "pacemaker"}
    top = {**top, "coordination": rest or None}
    cluster = top.get("cluster")
    if isinstance(cluster, dict) and cluster.get("pacemaker") is not None:
        c.fail(OLD_CLUSTER, "given as well as cluster.pacemaker: keep only cluster.pacemaker")
        return top, None, []
    warning = (
        f"{OLD_CLUSTER}: now spelled cluster.pacemaker (the cluster drains whichever "
        "coordination, if any, is set); read as cluster.pacemaker"
    )
    return top, coordination["pacemaker"], [warning]


def cert_with_key(c: Checker, where: str, fields: Mapping[str, Any]) -> None:
    if ("cert_file" in fields) != ("key_file" in fields):
        c.fail(f"{where}.cert_file", "cert_file and key_file go together (mutual TLS)")
    if ("username" in fields) != ("password_file" in fields):
        c.fail(f"{where}.username", "username and password_file go together")


def no_password_in_clear(c: Checker, where: str, username: Optional[str], urls: list[str]) -> None:
    in_clear = [u for u in urls if u.startswith("http://") and not _loopback(u)]
    if username and in_clear:
        c.fail(
            f"{where}.endpoints",
            f"{in_clear[0]}: with a username the password would cross the network in clear; "
            "use https://",
        )


def _loopback(url: str) -> bool:
    return loopback_host(urllib.parse.urlsplit(url).hostname or "")


def slots_need_etcd(c: Checker, given: bool, coordination: Optional[Coordination]) -> None:
    if given and (coordination is None or coordination.etcd is None):
        c.fail(
            "concurrency",
            "needs coordination.etcd: the slots are keys under leases in the fleet's etcd",
        )


def all_needs_peers(
    c: Checker,
    approve: ApprovePolicy,
    events: Mapping[str, EventRule],
    ready_from: bool,
) -> None:
    """approve: all waits until every VM an event names is ready: something must say so (etcd,
    the gate, or the Pacemaker cluster the VMs are nodes of)."""
    wants_all = [
        where
        for where, policy in [
            ("approve", approve),
            *((f"events.{t}.approve", r.approve) for t, r in events.items()),
        ]
        if policy is ApprovePolicy.ALL
    ]
    if wants_all and not ready_from:
        c.fail(
            wants_all[0],
            "approve: all needs coordination (etcd or gate) or cluster.pacemaker to learn when "
            "the other VMs an event names are ready",
        )
