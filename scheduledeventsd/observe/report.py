"""Human-readable views: a document for `events`, the daemon's status for `status`, and the
sections of a configuration for `check-config`."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any, Optional

from ..config import Config
from ..engine.gates.window import Held, hold
from ..model import Document, Event, iso_utc
from .status_doc import StatusDocument


def hooks_start(event: Event, config: Config, now: dt.datetime) -> Optional[Held]:
    """When a lead time or a window holds the before-hooks back: the instant and why, as the
    daemon decides it (when.hold)."""
    rule = config.events.get(event.event_type)
    if rule is None:
        return None
    return hold(event, rule, config.windows, now.timestamp())


def countdown(not_before: Optional[dt.datetime], now: dt.datetime) -> str:
    if not_before is None:
        return "-"
    seconds = int((not_before - now).total_seconds())
    return ("" if seconds >= 0 else "-") + countdown_seconds(abs(seconds))


def _utc(wall: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(wall, dt.timezone.utc)


def _local(when: Optional[dt.datetime]) -> str:
    return "-" if when is None else when.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def table(doc: Document, vm_name: str, now: dt.datetime, config: Config) -> str:
    header = ("OURS", "EVENT ID", "TYPE", "STATUS", "NOT BEFORE", "IN", "HOOKS IN", "RESOURCES")
    rows = [header]
    for event in doc.events:
        held = hooks_start(event, config, now) if event.names(vm_name) else None
        rows.append(
            (
                "yes" if event.names(vm_name) else "no",
                event.event_id,
                event.event_type,
                event.status,
                _local(event.not_before),
                countdown(event.not_before, now),
                "-" if held is None else f"{countdown(_utc(held.at), now)} ({held.reason})",
                ", ".join(event.resources),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"DocumentIncarnation {doc.incarnation}; this VM is {vm_name}"]
    if len(rows) == 1:
        lines.append("no scheduled events")
    else:
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"skipped: {s}" for s in doc.skipped]
    lines += [
        f"duplicate: Events[{c.index}] {c.event.event_id}, unlike Events[{c.first}] (the daemon "
        "judges the copy naming this VM)"
        for c in doc.copies
    ]
    return "\n".join(lines)


def as_json(doc: Document, vm_name: str, config: Config, now: dt.datetime) -> str:
    def one(event: Event) -> dict[str, object]:
        held = hooks_start(event, config, now) if event.names(vm_name) else None
        return dict(
            event.to_json(),
            ForThisVM=event.names(vm_name),
            HooksStartAt=None if held is None else iso_utc(_utc(held.at)),
            HooksWaitFor=None if held is None else held.reason,
        )

    return json.dumps(
        {
            "DocumentIncarnation": doc.incarnation,
            "VmName": vm_name,
            "Events": [one(e) for e in doc.events],
            "Skipped": list(doc.skipped),
        },
        indent=2,
    )


def status(doc: StatusDocument, now: float, problems: list[str]) -> str:
    """`scheduledeventsd status`: the daemon's view, the events of this VM, what is wrong."""
    poll = doc.get("poll") or {}
    health = doc.get("health") or {}
    last_ok = poll.get("last_ok_unix")
    ago = f"{now - last_ok:.1f} s ago" if isinstance(last_ok, (int, float)) else "never"
    lines = [
        f"scheduledeventsd {doc.get('version')} on {doc.get('vm_name') or '?'} "
        f"({doc.get('provider') or 'azure'}), started {doc.get('started_at')}",
        f"last poll: {poll.get('last')}; last success {ago}; incarnation "
        f"{'not yet' if poll.get('incarnation') is None else poll.get('incarnation')}",
        "health: ok"
        if health.get("ok")
        else f"health: 503 for {health.get('event_type')} {health.get('event_id')} "
        f"(from {health.get('unhealthy_from')})",
        f"coordination: {doc.get('coordination')}; state file: {doc.get('state_file')}",
    ]
    windows = doc.get("windows") or {}
    if windows.get("configured"):
        lines.append(
            f"windows: {'; '.join(windows['configured'])}; next opens "
            f"{windows.get('next_opens_at')}, closes {windows.get('next_closes_at')}"
        )
    slots = doc.get("concurrency")
    if isinstance(slots, dict):
        groups = slots.get("groups") or [slots]
        limits = "; ".join(f"group {g.get('group')}, max {g.get('max')}" for g in groups)
        lines.append(
            f"concurrency: {limits}; held for "
            f"{', '.join(slots.get('held_for') or []) or 'none'}; last seen holders "
            f"{', '.join(slots.get('last_seen_holders') or []) or '-'}"
        )
    cluster = doc.get("pacemaker")
    if isinstance(cluster, dict):
        mark = cluster.get("marked")
        marked = "no" if not isinstance(mark, dict) else f"{mark.get('method')}"
        if "method" not in cluster:  # reloaded away, a mark of ours still to take off
            lines.append(f"pacemaker: not configured; marked by this daemon: {marked}")
        else:
            ready = cluster.get("ready")
            readiness = "not read yet" if ready is None else "ready" if ready else "cluster_unready"
            lines.append(
                f"pacemaker: {readiness}; method {cluster.get('method')}; draining for "
                f"{', '.join(cluster.get('draining_for') or []) or 'none'}; drained for "
                f"{', '.join(cluster.get('drained_for') or []) or 'none'}; held for "
                f"{', '.join(cluster.get('held_for') or []) or 'none'}; marked by this daemon: "
                f"{marked}"
            )
    events = doc.get("events") or []
    lines.append("events of this VM:" if events else "no events of this VM")
    for e in events:
        seconds = e.get("seconds_to_not_before")
        when = "-"
        if e.get("not_before"):
            left = seconds - (now - doc.get("written_at_unix", now)) if seconds is not None else 0
            when = f"{e['not_before']} ({_span(left)})"
        lines.append(
            f"  {e.get('event_type')} {e.get('event_id')}: {_phase(e)}, "
            f"{e.get('status')}, NotBefore {when}"
        )
        if e.get("waiting_for"):
            lines.append(f"    hooks start {_waiting(e)}")
        moments = [
            f"{label} {_clock(at)}"
            for label, at in (
                ("detected", e.get("detected_at")),
                ("hooks done", e.get("hooks_done_at")),
                ("approved", e.get("approved_at")),
                ("after-hooks", e.get("after_hooks_at")),
            )
            if at
        ]
        if moments:
            lines.append("    " + ", ".join(moments))
        for h in e.get("hooks") or []:
            took = h.get("duration_s") or 0.0
            lines.append(f"    {h.get('stage')} {h.get('hook')}: {h.get('result')} in {took:.1f}s")
    lines += [f"PROBLEM: {p}" for p in problems]
    return "\n".join(lines)


def _phase(event: Mapping[str, Any]) -> str:
    """An event's phase; a gated one's with the gate that holds it: `gated (cordon)`."""
    phase = event.get("phase")
    return f"{phase} ({event['waiting_for']})" if phase == "gated" else str(phase)


def _waiting(event: Mapping[str, Any]) -> str:
    """When a waiting event's hooks start and what it waits for, in words: the lead by the
    setting it comes from (start_before unset is the default lead, not "start_before"), a
    slot, or the cluster's drain (named only where one is under way)."""
    why = event["waiting_for"]
    at = event.get("hooks_start_at")
    if why == "start_before":
        lead_s = event.get("lead_s")
        lead = f"{lead_s:g} s" if isinstance(lead_s, (int, float)) else "its lead"
        source = (
            "the default lead; start_before is unset"
            if event.get("lead_default")
            else ("start_before")
        )
        return f"{at} (waiting for the lead: {lead} before NotBefore, {source})"
    if why == "slot":
        return "when a concurrency slot is free (waiting for: slot)"
    if why == "cluster":
        return "when the cluster has drained this node (waiting for: cluster)"
    if why == "etcd":  # its cancelled-hooks (the undo), after a put-back
        return "when etcd confirms this VM's ready deleted (waiting for: etcd)"
    if event.get("phase") == "gated":
        return f"when the {why} gate lets it on (waiting for: {why})"
    return f"{at or 'later'} (waiting for: {why})"


def _span(seconds: float) -> str:
    sign = "in " if seconds >= 0 else ""
    suffix = "" if seconds >= 0 else " ago"
    return f"{sign}{countdown_seconds(abs(int(seconds)))}{suffix}"


def countdown_seconds(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _clock(iso: Optional[str]) -> str:
    return "-" if not iso else iso[11:19]


def sections(cfg: Config) -> list[str]:
    """`check-config`'s lines for every section beside the events and hooks, also when unset,
    so an operator sees that each was read: windows, concurrency, coordination, the Pacemaker
    cluster, the HTTP endpoint, metrics, health and webhooks (a webhook by its host only: the
    path of a Slack or Teams URL is its secret)."""
    from .webhooks import where  # noqa: PLC0415 - requests only for check-config

    windows = "; ".join(w.describe() for w in cfg.windows) or "none: early maintenance at any time"
    lines = [f"windows:   {windows}"]
    slots = cfg.concurrency
    lines.append(
        "concurrency: none"
        if slots is None
        else f"concurrency: {'; '.join(f'group {g.group}, {g.max} slot(s)' for g in slots.limits)}"
        f", ttl {slots.ttl}s, by etcd"
    )
    if slots is not None:
        lines.append(
            f"  held up to {slots.hold_max}s while its VM is away (hold_max); after-hooks that "
            f"fail holding it run again every {slots.after_retry:g}s (after_retry)"
        )
    co = cfg.coordination
    if co is None or (co.etcd is None and co.gate is None):
        lines.append("coordination: none")
    if co is not None and co.etcd is not None:
        lines.append(
            f"coordination: etcd {', '.join(co.etcd.endpoints)} (prefix {co.etcd.prefix}, "
            f"timeout {co.etcd.timeout:g}s{', TLS client certificate' if co.etcd.cert_file else ''}"
            f"{', user ' + co.etcd.username if co.etcd.username else ''})"
        )
    if co is not None and co.gate is not None:
        lines.append(
            f"coordination: gate {' '.join(co.gate.command.argv)} (timeout "
            f"{co.gate.command.timeout:g}s, asked every {co.gate.interval:g}s while not yet)"
        )
    pm = cfg.cluster
    if pm is None:
        lines.append("cluster:   none")
    else:
        how = f"health ({pm.attribute})" if pm.method.value == "health" else pm.method.value
        lines.append(
            f"cluster:   pacemaker, method {how}; drains for {', '.join(pm.event_types)}; "
            f"drain_timeout {pm.drain_timeout:g}s, min_healthy {pm.min_healthy}"
        )
    listen = cfg.listen
    lines.append(
        "http:      none (no socket)"
        if listen is None
        else f"http:      {listen.host}:{listen.port} (/health; /metrics, /status to loopback)"
    )
    lines.append(f"metrics textfile: {cfg.metrics_textfile or 'none'}")
    lines.append(f"health:    503 from {cfg.unhealthy_from.value} until the event is over")
    if not cfg.webhooks:
        lines.append("webhooks:  none")
    for hook in cfg.webhooks:
        lines.append(f"webhook:   {where(hook.url)} ({hook.format.value}; on {', '.join(hook.on)})")
    return lines
