"""The plan as data (rows and a summary), and its text and JSON renderings.

The JSON shape (stable: plan/svg.py and CI jobs read it). Every instant is an ISO 8601 UTC
string (`2026-11-28T02:00:00Z`, milliseconds only when not whole), or null when it did not
happen:

    {"from": instant, "until": instant (the last simulated),
     "rows": [{"vm", "group" ("" without concurrency), "groups" (every group its
               `concurrency` lists, `group` first; [] without), "event_type", "event_id",
               "posted", "not_before",
               "hooks_start", "waited_for" (null | "window" | "slot" | "lead"),
               "approved", "approved_early" (true: approved when its hooks succeeded; false:
               it proceeded at NotBefore, and `approved` is NotBefore, or when it was posted
               if NotBefore was past; null: it never started, withdrawn or its VM gone
               for good before),
               "down", "back" (null: a Preempt or Terminate, gone for good), "after_done"
               (back up, the engine has nothing left to do for it), "cancelled" (withdrawn
               by the cloud before it started: never down),
               "slot_from", "slot_to",
               "flags": [sorted of "late", "no_slot", "cut_off", "no_window", "hooks_failed"],
               "spans": [{"phase", "from", "to"}]}],   # phase: queued (waiting for a slot),
                   # gated (any other gate holds it), draining (the cluster),
                   # hooks (before-hooks), ready (prepared, waiting
                   # for approval or NotBefore), down, after (back up, until after-hooks done),
                   # retry (after-hooks failed: the slot held until they run again)
     "windows": [{"vm" or "group", "window" (as configured), "zone", "from", "to",
                  "local_from", "local_to" (in the window's zone, ISO 8601 with offset)}],
     "summary": {"vms", "events", "steps" (engine steps taken), "faults" (steps that raised,
                 as the daemon survives them: a defect), "exit" (0 or 1),
                 "problems": {flag: count},
                 "groups": [{"group" (each group any VM's `concurrency` lists; "": the VMs
                             without), "max" (null: no concurrency), "vms", "most_at_once",
                             "exceeds_max", "short_s" (seconds with one or more of its VMs
                             in maintenance), "approved_early", "last_back"}]}}

A VM is in maintenance, as `concurrency` counts it, from the first of its slot, its drain, its
before-hooks and its event's start (when it went down: approved, or NotBefore), whether or not
its hooks ran, until its after-hooks are done (back up, if it has none). `late`: its
preparation was not finished by NotBefore, or its VM went down before it began.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from ..config import EventRule
from ..engine.gates.window import window_lead
from ..windows import first_opening
from . import svg
from .fleet import Fleet
from .run import Plan
from .timeline import Seen

FLAGS = ("late", "no_slot", "cut_off", "no_window", "hooks_failed")
PROBLEMS = frozenset({"late"})  # flags that make the exit status 1 (as does a group over max)


def iso(start: dt.datetime, seconds: Optional[float]) -> Optional[str]:
    if seconds is None:
        return None
    when = start + dt.timedelta(seconds=round(seconds, 3))
    text = when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    ms = when.microsecond // 1000
    return f"{text}.{ms:03d}Z" if ms else f"{text}Z"


def build(plan: Plan) -> dict[str, Any]:
    """The plan's rows and summary, as the JSON shape above."""
    start = plan.start
    rows = []
    seen_rows = plan.rows()
    for seen in seen_rows:
        rows.append(_row(plan, seen))
    windows = _windows(plan.fleet, start, plan.until)
    groups = _groups(plan, seen_rows)
    problems = {flag: sum(flag in r["flags"] for r in rows) for flag in FLAGS}
    failing = any(problems[f] for f in PROBLEMS) or any(g["exceeds_max"] for g in groups)
    return {
        "from": iso(start, 0.0),
        "until": iso(start, plan.until),
        "rows": rows,
        "windows": windows,
        "summary": {
            "vms": len(plan.vms),
            "events": len(plan.cloud.events),
            "steps": plan.steps,
            "faults": plan.faults,
            "exit": 1 if failing else 0,
            "problems": problems,
            "groups": groups,
        },
    }


def _row(plan: Plan, seen: Seen) -> dict[str, Any]:
    start = plan.start
    early = seen.approved is not None
    # Not approved: it started at NotBefore (when posted, if that was past), unless it was
    # withdrawn or its VM was gone for good before (a Preempt, a Terminate): it never started.
    approved = seen.approved if early else max(seen.not_before, seen.posted)
    if not early and (_never_due(seen) or seen.cancelled is not None):
        approved = None
    return {
        "vm": seen.vm,
        "group": seen.group,
        "groups": list(seen.groups),
        "event_type": seen.event_type,
        "event_id": seen.event_id,
        "posted": iso(start, seen.posted),
        "not_before": iso(start, seen.not_before),
        "hooks_start": iso(start, seen.hooks_start),
        "waited_for": waited_for(seen),
        "approved": iso(start, approved),
        "approved_early": early,
        "down": iso(start, seen.down),
        "back": iso(start, seen.back),
        "after_done": iso(start, seen.after_done),
        "cancelled": iso(start, seen.cancelled),
        "slot_from": iso(start, seen.slot_from),
        "slot_to": iso(start, seen.slot_to),
        "flags": flags(plan, seen),
        "spans": [
            {"phase": phase, "from": iso(start, a), "to": iso(start, b)}
            for phase, a, b in spans(seen)
        ],
    }


def waited_for(seen: Seen) -> Optional[str]:
    """What held its before-hooks back: the last of window, slot, lead that did."""
    if seen.no_slot:
        return "lead"
    if seen.asked_slot is not None and seen.slot_busy:
        return "slot"
    if "window" in seen.waits:
        return "window"
    if "start_before" in seen.waits:
        return "lead"
    return None


def flags(plan: Plan, seen: Seen) -> list[str]:
    found = set()
    if seen.cancelled is not None:  # never due: nothing was late or cut
        return ["no_window"] if _no_window(plan, seen) else []
    if _late(plan, seen):
        found.add("late")
    if seen.no_slot:
        found.add("no_slot")
    if seen.cut_off:
        found.add("cut_off")
    if seen.hooks_failed and not seen.cut_off:
        found.add("hooks_failed")
    if _no_window(plan, seen):
        found.add("no_window")
    return sorted(found)


def _late(plan: Plan, seen: Seen) -> bool:
    """Its preparation was not finished by NotBefore: its before-hooks ran past it or were cut
    off, or its VM went down before they began (no notice, a gate or the drain still holding
    it) while its config prepares for the event."""
    if _never_due(seen):
        return False
    if seen.hooks_start is not None:
        prepared = seen.hooks_end is not None and seen.hooks_end <= seen.not_before
        return seen.cut_off or not prepared
    if seen.down is None:
        return False
    held = (seen.asked_slot, seen.drain_from, seen.gated_from)
    return any(t is not None for t in held) or (seen.missed and _prepares(plan, seen))


def _prepares(plan: Plan, seen: Seen) -> bool:
    """Its VM's config prepares for its type (before-hooks, a slot or a cluster drain), as the
    engine would have had it been seen in time: a type it leaves alone is never late."""
    config = plan.by_name[seen.vm].config
    rule = config.events.get(seen.event_type)
    if rule is None:
        return False
    slot = config.concurrency is not None and rule.obeys_windows(seen.event_type)
    drain = config.cluster is not None and config.cluster.drains(seen.event_type)
    return bool(rule.before or rule.fast) or slot or drain


def _never_due(seen: Seen) -> bool:
    """Its VM was gone for good (a Preempt, a Terminate) before it started: it never did."""
    return seen.never_back and seen.down is None


def _no_window(plan: Plan, seen: Seen) -> bool:
    """Windows hold its type, and none opens from its posting (or its start_before) to its
    lead (the engine's own `window_lead`) before NotBefore: as the window gate's `hold`
    chooses, a window opening exactly at the lead included."""
    config = plan.by_name[seen.vm].config
    rule = config.events.get(seen.event_type, EventRule())
    if not config.windows or not rule.obeys_windows(seen.event_type):
        return False
    if seen.not_before <= seen.posted:  # no notice: no window could
        return False
    not_before = plan.wall0 + seen.not_before
    earliest = plan.wall0 + seen.posted
    if rule.start_before is not None and rule.before:
        earliest = max(earliest, not_before - rule.start_before)
    found = first_opening(config.windows, earliest, not_before)
    return found is None or found[0] > not_before - window_lead(rule)


def spans(seen: Seen) -> list[tuple[str, float, Optional[float]]]:
    found: list[tuple[str, float, Optional[float]]] = []
    if seen.asked_slot is not None:
        to = seen.slot_from if seen.slot_from is not None else seen.hooks_start
        found.append(("queued", seen.asked_slot, to if to is not None else seen.down))
    if seen.gated_from is not None:  # until the next gate, its before-hooks, or down
        ends = (seen.drain_from, seen.hooks_start, seen.down)
        found.append(("gated", seen.gated_from, next((e for e in ends if e is not None), None)))
    if seen.drain_from is not None:
        found.append(("draining", seen.drain_from, seen.drain_to or seen.hooks_start))
    if seen.hooks_start is not None:
        end = seen.hooks_end
        if end is None or (seen.down is not None and seen.down < end):
            end = seen.down
        found.append(("hooks", seen.hooks_start, end))
        if end is not None and seen.down is not None and end < seen.down:
            found.append(("ready", end, seen.down))
    if seen.down is not None:
        found.append(("down", seen.down, seen.back))
    if seen.back is not None and seen.after_done is not None and seen.after_done > seen.back:
        found += _after(seen, seen.back, seen.after_done)
    return found


def _after(seen: Seen, back: float, done: float) -> list[tuple[str, float, Optional[float]]]:
    """Back up until the after-hooks are done: `after`, cut by a `retry` from each failed run
    until the next one starts (after_retry later, the slot held meanwhile)."""
    found: list[tuple[str, float, Optional[float]]] = []
    at = back
    for failed in seen.after_failed:
        again = next((s for s in seen.after_runs if s > failed), None)
        if again is None or not back <= failed < again <= done:
            continue
        if failed > at:
            found.append(("after", at, failed))
        found.append(("retry", failed, again))
        at = again
    if done > at:
        found.append(("after", at, done))
    return found


def _windows(fleet: Fleet, start: dt.datetime, until: float) -> list[dict[str, Any]]:
    """Each set's windows between the plan's start and its end, once per group."""
    found: list[dict[str, Any]] = []
    done: set[str] = set()
    wall0, wall_end = start.timestamp(), start.timestamp() + until
    for s in fleet.sets:
        concurrency = s.config.concurrency
        owners = [("group", concurrency.group)] if concurrency else [("vm", n) for n in s.names]
        for key, owner in owners:
            if f"{key}:{owner}" in done:
                continue
            done.add(f"{key}:{owner}")
            for window in s.config.windows:
                for opens, closes in window.spans(wall0):
                    if opens >= wall_end:
                        break
                    local = [
                        dt.datetime.fromtimestamp(t, window.zone).isoformat()
                        for t in (opens, closes)
                    ]
                    found.append({
                        key: owner,
                        "window": window.describe(),
                        "zone": window.zone.key,
                        "from": iso(start, max(opens, wall0) - wall0),
                        "to": iso(start, closes - wall0),
                        "local_from": local[0],
                        "local_to": local[1],
                    })  # fmt: skip
    return found


def _groups(plan: Plan, rows: Sequence[Seen]) -> list[dict[str, Any]]:
    """Per group of any VM's `concurrency` (each of a list's), its members' rows: a VM in a
    tier and a zone counts in both. `max`: the largest its members' configs give it."""
    found = []
    of: dict[str, list[Seen]] = {}
    for r in rows:
        for group in r.groups or (r.group,):
            of.setdefault(group, []).append(r)
    for group in sorted(of):
        members = of[group]
        most = None
        for r in members:
            concurrency = plan.by_name[r.vm].config.concurrency
            for limit in concurrency.limits if concurrency is not None else ():
                if limit.group == group:
                    most = limit.max if most is None else max(most, limit.max)
        by_vm: dict[str, list[tuple[float, float]]] = {}
        for r in members:
            if r.maintenance_from is not None and r.maintenance_to is not None:
                by_vm.setdefault(r.vm, []).append((r.maintenance_from, r.maintenance_to))
        at_once, short = _sweep([span for spans in by_vm.values() for span in _merged(spans)])
        backs = [r.back for r in members if r.back is not None]
        found.append({
            "group": group,
            "max": most,
            "vms": len({r.vm for r in members}),
            "most_at_once": at_once,
            "exceeds_max": most is not None and at_once > most,
            "short_s": round(short, 3),
            "approved_early": sum(r.approved is not None for r in members),
            "last_back": iso(plan.start, max(backs) if backs else None),
        })  # fmt: skip
    return found


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """One VM's spans in maintenance, overlapping ones as one: a VM with two events at once
    is one VM in maintenance (its events share its slot)."""
    found: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if found and a < found[-1][1]:
            found[-1] = (found[-1][0], max(found[-1][1], b))
        else:
            found.append((a, b))
    return found


def _sweep(spans_of: Iterable[tuple[float, float]]) -> tuple[int, float]:
    """The most spans open at once (an end and a start at one instant do not overlap) and
    how long one or more were open."""
    edges = sorted([(a, 1) for a, _ in spans_of] + [(b, -1) for _, b in spans_of])
    most = count = 0
    short = 0.0
    since = 0.0
    for t, step in edges:
        if count > 0:
            short += t - since
        since = t
        count += step
        most = max(most, count)
    return most, short


# ---- renderings ------------------------------------------------------------------------------


def render(data: dict[str, Any], form: str) -> str:
    """`text`, `json`, or `svg` (plan/svg.py draws the same data)."""
    if form == "svg":
        return svg.render(data)
    return as_json(data) if form == "json" else as_text(data)


def as_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def _short(text: Optional[str]) -> str:
    """An ISO instant as the table shows it: `Sat 11-28 02:00:00` (UTC)."""
    if text is None:
        return "-"
    when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return when.strftime("%a %m-%d %H:%M:%S")


def as_text(data: dict[str, Any]) -> str:
    summary = data["summary"]
    lines = [
        f"plan from {data['from']} to {data['until']} (times in UTC): {summary['vms']} VMs, "
        f"{summary['events']} events, {summary['steps']} engine steps",
        "",
    ]
    head = ("vm", "event", "posted", "hooks start", "waited", "approved", "down", "back",
            "after done", "slot from", "slot to", "flags", "groups")  # fmt: skip
    table = [head]
    for r in data["rows"]:
        approved = _short(r["approved"])
        if r["approved"] is not None:
            approved += " early" if r["approved_early"] else " NotBefore"
        table.append((
            r["vm"], r["event_type"], _short(r["posted"]), _short(r["hooks_start"]),
            r["waited_for"] or "-", approved, _short(r["down"]), _short(r["back"]),
            _short(r["after_done"]), _short(r["slot_from"]), _short(r["slot_to"]),
            ",".join(r["flags"]) or "-", ",".join(r["groups"]) or "-",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    if data["windows"]:
        lines.append("")
        lines.append("windows:")
        for w in data["windows"]:
            owner = w.get("group") or w.get("vm")
            lines.append(
                f"  {owner}: {w['window']}: {_short(w['from'])} to {_short(w['to'])} UTC "
                f"({w['local_from'][:16]} to {w['local_to'][:16]} {w['zone']})"
            )
    lines.append("")
    lines.append("groups:")
    for g in summary["groups"]:
        most = "no max" if g["max"] is None else f"max {g['max']}"
        over = "  EXCEEDS max" if g["exceeds_max"] else ""
        lines.append(
            f"  {g['group'] or '(no concurrency)'}: {g['vms']} VMs, at most {g['most_at_once']} "
            f"in maintenance at once ({most}){over}; short for {_duration(g['short_s'])}; "
            f"{g['approved_early']} approved early; last back {_short(g['last_back'])}"
        )
    found = [f"{n} {flag}" for flag, n in summary["problems"].items() if n]
    found += [f"{g['group']} over its max" for g in summary["groups"] if g["exceeds_max"]]
    lines.append("")
    lines.append("problems: " + (", ".join(found) if found else "none"))
    return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s"
