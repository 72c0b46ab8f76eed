"""A plan drawn as one self-contained SVG: a lane per VM coloured by phase, windows shaded, the
slot held and handed on, NotBefore marked, a UTC time axis and a legend.

Built from the plan's JSON (what `plan --format json` prints), by string building alone: no
drawing library, so `plan --format svg` works wherever the daemon does. Every text is escaped
(VM names are untrusted) and every number formatted the same way: same plan, same bytes.
"""

from __future__ import annotations

import datetime as dt
import heapq
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from scheduledeventsd.plan.axis import MIN_TICK_GAP, Scale, duration

UTC = dt.timezone.utc
LABEL_W = 170.0  # the VM names' column
CHART_W = 900.0
FLAGS_W = 150.0  # the flags' column, right of the chart
LANE_H = 18.0
BAR_H = 12.0
TOP = 58.0  # title and axis above the first lane
MARGIN = 10.0
FONT = "font-family:sans-serif;font-size:11px"

# The colour of each phase the planner names, in the legend's order; a phase not listed here
# takes the next of SPARE, in the order of its name, so the picture stays the same.
PHASES: Mapping[str, str] = {
    "queued": "#c6dbef",  # waiting for a slot
    "draining": "#a1d99b",  # the cluster moving its resources away
    "hooks": "#41ab5d",  # before-hooks
    "ready": "#fdd0a2",  # prepared: waiting for approval or NotBefore
    "down": "#e6550d",
    "after": "#807dba",  # back up, until the after-hooks are done
    "retry": "#e7298a",  # after-hooks failed: the slot held until they run again
}
SPARE = ("#e7969c", "#8dd3c7", "#bc80bd", "#ccebc5", "#ffed6f", "#b3de69", "#fccde5")
WINDOW = "#fff3b0"
CUT = "#f0f0f0"
SLOT = "#252525"
HANDOFF = "#3182bd"
NOT_BEFORE = "#cb181d"
FLAGGED = "#cb181d"

# What XML 1.0 cannot hold at all (escaping does not help): other control characters and lone
# surrogates. Each becomes U+FFFD.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def text(value: object) -> str:
    """`value` as XML character data or an attribute value: escaped, and what XML cannot carry
    replaced."""
    s = _NOT_XML.sub("\ufffd", str(value))
    return (
        s.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&apos;")
    )


def instant(value: object) -> Optional[dt.datetime]:
    """An ISO-8601 time of the plan as an aware UTC datetime; None for a missing or unreadable
    one (a row without a slot has no slot_from)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


@dataclass(frozen=True)
class Span:
    phase: str
    start: dt.datetime
    end: dt.datetime


@dataclass(frozen=True)
class Lane:
    """One row of the plan, read: what the drawing needs of it."""

    vm: str
    group: str
    spans: tuple[Span, ...]
    slot_from: Optional[dt.datetime]
    slot_to: Optional[dt.datetime]
    not_before: Optional[dt.datetime]
    posted: Optional[dt.datetime]
    flags: tuple[str, ...]


def _lane(row: Mapping[str, Any], until: Optional[dt.datetime] = None) -> Lane:
    """A row; a span still open when the plan ended (`to` null) lasts until its end."""
    spans = []
    for span in row.get("spans") or ():
        start, end = instant(span.get("from")), instant(span.get("to")) or until
        if start is not None and end is not None and end >= start:
            spans.append(Span(str(span.get("phase", "")), start, end))
    return Lane(
        vm=str(row.get("vm", "")),
        group=str(row.get("group") or ""),
        spans=tuple(spans),
        slot_from=instant(row.get("slot_from")),
        slot_to=instant(row.get("slot_to")),
        not_before=instant(row.get("not_before")),
        posted=instant(row.get("posted")),
        flags=tuple(str(f) for f in row.get("flags") or ()),
    )


@dataclass(frozen=True)
class Window:
    owner: str  # "vm", "group" or "" (every lane)
    name: str
    start: dt.datetime
    end: dt.datetime
    said: str  # how the config says it, and its times in its own zone: the rectangle's title


def _windows(plan: Mapping[str, Any]) -> list[Window]:
    found = []
    for window in plan.get("windows") or ():
        start, end = instant(window.get("from")), instant(window.get("to"))
        if start is None or end is None or end < start:
            continue
        owner = "vm" if "vm" in window else "group" if "group" in window else ""
        name = str(window.get(owner, "")) if owner else ""
        said = f"{name}: {window.get('window', 'window')}, {_iso(start)} to {_iso(end)}"
        if window.get("local_from") and window.get("local_to"):
            said += f" ({window['local_from']} to {window['local_to']} {window.get('zone', '')})"
        found.append(Window(owner, name, start, end, said.strip()))
    return found


def _num(value: float) -> str:
    """One format for every coordinate: the same plan gives the same bytes."""
    return f"{value:.1f}"


def _colours(lanes: Sequence[Lane]) -> dict[str, str]:
    """Each phase drawn, in the legend's order: the known ones first, the rest by name."""
    present = {span.phase for lane in lanes for span in lane.spans}
    colours = {phase: colour for phase, colour in PHASES.items() if phase in present}
    for k, phase in enumerate(sorted(present - set(PHASES))):
        colours[phase] = SPARE[k % len(SPARE)]
    return colours


def _lane_y(k: int) -> float:
    return TOP + k * LANE_H


def _runs(lanes: Sequence[Lane], key: str) -> Iterator[tuple[str, int, int]]:
    """Consecutive lanes with the same VM or group: (name, first lane, lanes), so a group's
    window is one rectangle where its VMs sit together."""
    k = 0
    while k < len(lanes):
        name = getattr(lanes[k], key)
        end = k
        while end + 1 < len(lanes) and getattr(lanes[end + 1], key) == name:
            end += 1
        yield name, k, end - k + 1
        k = end + 1


def _window_rects(lanes: Sequence[Lane], windows: Sequence[Window], scale: Scale) -> list[str]:
    out = []
    for window in windows:
        x0, x1 = scale.x(window.start), scale.x(window.end)
        if window.owner:
            key = "vm" if window.owner == "vm" else "group"
            runs = [(k, n) for name, k, n in _runs(lanes, key) if name == window.name]
        else:
            runs = [(0, len(lanes))]
        for k, n in runs:
            out.append(
                f'<rect class="window" x="{_num(x0)}" y="{_num(_lane_y(k))}" '
                f'width="{_num(x1 - x0)}" height="{_num(n * LANE_H)}" fill="{WINDOW}">'
                f"<title>{text(window.said)}</title></rect>"
            )
    return out


def _axis(scale: Scale, bottom: float) -> list[str]:
    """Ticks at round UTC instants, and each cut idle stretch shaded with its length."""
    fmt = "%a %d %b" if scale.step() >= 86400 else "%a %d %H:%M"
    out = []
    labelled = -MIN_TICK_GAP
    for cut in scale.cuts():
        mid = (cut.x0 + cut.x1) / 2
        out.append(
            f'<rect class="cut" x="{_num(cut.x0)}" y="{_num(TOP - 6)}" '
            f'width="{_num(cut.x1 - cut.x0)}" height="{_num(bottom - TOP + 6)}" fill="{CUT}"/>'
        )
        if mid - labelled < 50:
            continue  # its length would overwrite the previous one's
        labelled = mid
        out.append(
            f'<text x="{_num(mid)}" y="{_num(TOP - 9)}" text-anchor="middle" '
            f'style="{FONT};fill:#636363">{text(duration(cut.end - cut.start))}</text>'
        )
    last = -MIN_TICK_GAP
    for tick in scale.ticks():
        x = scale.x(tick)
        if x - last < MIN_TICK_GAP * 0.75 or any(c.x0 - 20 < x < c.x1 + 20 for c in scale.cuts()):
            continue  # too close to the previous tick or a cut's label
        last = x
        out.append(
            f'<line class="tick" x1="{_num(x)}" y1="{_num(TOP - 6)}" x2="{_num(x)}" '
            f'y2="{_num(bottom)}" stroke="#bdbdbd" stroke-width="0.5"/>'
        )
        out.append(
            f'<text x="{_num(x)}" y="{_num(TOP - 9)}" text-anchor="middle" style="{FONT}">'
            f"{text(tick.strftime(fmt))}</text>"
        )
    start = scale.start.strftime("%Y-%m-%d %H:%M")
    out.append(
        f'<text x="{_num(LABEL_W)}" y="{_num(TOP - 26)}" style="{FONT}">'
        f"time (UTC) from {text(start)}; grey: idle stretches cut short</text>"
    )
    return out


def _lane_parts(k: int, lane: Lane, scale: Scale, colours: Mapping[str, str]) -> list[str]:
    y = _lane_y(k)
    bar = y + (LANE_H - BAR_H) / 2
    out = [
        f'<g class="lane" data-vm="{text(lane.vm)}" data-group="{text(lane.group)}">',
        f'<text x="{_num(LABEL_W - 6)}" y="{_num(y + LANE_H - 5)}" text-anchor="end" '
        f'style="{FONT}">{text(lane.vm)}</text>',
    ]
    for span in lane.spans:
        x0, x1 = scale.x(span.start), scale.x(span.end)
        out.append(
            f'<rect class="span" x="{_num(x0)}" y="{_num(bar)}" width="{_num(x1 - x0)}" '
            f'height="{_num(BAR_H)}" fill="{colours[span.phase]}"><title>'
            f"{text(lane.vm)}: {text(span.phase)} {text(_iso(span.start))} to "
            f"{text(_iso(span.end))}</title></rect>"
        )
    if lane.slot_from is not None and lane.slot_to is not None:
        x0, x1 = scale.x(lane.slot_from), scale.x(lane.slot_to)
        out.append(
            f'<rect class="slot" x="{_num(x0)}" y="{_num(bar + BAR_H)}" width="{_num(x1 - x0)}" '
            f'height="2.0" fill="{SLOT}"/>'
        )
    if lane.not_before is not None:
        x = _num(scale.x(lane.not_before))
        out.append(
            f'<path class="not-before" d="M {x} {_num(y + 1)} V {_num(y + LANE_H - 1)}" '
            f'stroke="{NOT_BEFORE}" stroke-width="2"><title>{text(lane.vm)}: NotBefore '
            f"{text(_iso(lane.not_before))}</title></path>"
        )
    if lane.flags:
        out.append(
            f'<text class="flags" x="{_num(LABEL_W + CHART_W + 6)}" y="{_num(y + LANE_H - 5)}" '
            f'fill="{FLAGGED}" style="{FONT}">{text(" ".join(lane.flags))}</text>'
        )
    out.append("</g>")
    return out


def _iso(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def handoffs(lanes: Sequence[Lane]) -> list[tuple[int, int]]:
    """The slot hand-offs, as (lane that gave it up, lane that took it): in each group, a slot
    taken after one was given up follows the latest release not yet handed on (of releases at
    the same instant, the first lane's first: the lines do not cross)."""
    taking: dict[str, list[tuple[dt.datetime, int]]] = {}
    giving: dict[str, list[tuple[dt.datetime, int]]] = {}
    for k, lane in enumerate(lanes):
        if lane.group and lane.slot_from is not None:
            taking.setdefault(lane.group, []).append((lane.slot_from, k))
        if lane.group and lane.slot_to is not None:
            giving.setdefault(lane.group, []).append((lane.slot_to, k))
    pairs = []
    for group, taken in taking.items():
        taken.sort()
        released = sorted(giving.get(group, ()))
        free: list[tuple[float, int]] = []  # released, not yet handed on: the latest first
        at = 0
        for when, taker in taken:
            while at < len(released) and released[at][0] <= when:
                heapq.heappush(free, (-released[at][0].timestamp(), released[at][1]))
                at += 1
            if free:
                pairs.append((heapq.heappop(free)[1], taker))
    return sorted(pairs, key=lambda p: (p[1], p[0]))


def _handoff_lines(lanes: Sequence[Lane], scale: Scale) -> list[str]:
    out = []
    for giver, taker in handoffs(lanes):
        released = lanes[giver].slot_to or scale.start
        taken = lanes[taker].slot_from or scale.start
        y0 = _lane_y(giver) + (LANE_H + BAR_H) / 2 + 1
        y1 = _lane_y(taker) + (LANE_H + BAR_H) / 2 + 1
        out.append(
            f'<path class="handoff" d="M {_num(scale.x(released))} {_num(y0)} '
            f'L {_num(scale.x(taken))} {_num(y1)}" stroke="{HANDOFF}" stroke-width="1.2" '
            f'fill="none"><title>slot of {text(lanes[giver].group)}: '
            f"{text(lanes[giver].vm)} to {text(lanes[taker].vm)}</title></path>"
        )
    return out


def _legend(y: float, colours: Mapping[str, str]) -> list[str]:
    items = [f'<rect x="0" y="0" width="14" height="10" fill="{c}"/>' for c in colours.values()]
    labels = list(colours)
    items.append(f'<rect x="0" y="0" width="14" height="10" fill="{WINDOW}"/>')
    labels.append("window open")
    items.append(f'<rect x="0" y="8" width="14" height="2" fill="{SLOT}"/>')
    labels.append("slot held")
    items.append(f'<path d="M 0 10 L 14 0" stroke="{HANDOFF}" stroke-width="1.2"/>')
    labels.append("slot handed on")
    items.append(f'<path d="M 7 0 V 10" stroke="{NOT_BEFORE}" stroke-width="2"/>')
    labels.append("NotBefore")
    out = ['<g class="legend">']
    per_row = 6
    for k, (item, label) in enumerate(zip(items, labels)):
        x = LABEL_W + (k % per_row) * (CHART_W / per_row)
        row_y = y + (k // per_row) * 16
        out.append(f'<g transform="translate({_num(x)},{_num(row_y)})">{item}')
        out.append(f'<text x="18" y="9" style="{FONT}">{text(label)}</text></g>')
    out.append("</g>")
    return out


def _title(plan: Mapping[str, Any], vms: int) -> str:
    """How many VMs, and the problems the summary counts (none: said so)."""
    summary = plan.get("summary")
    problems = summary.get("problems") if isinstance(summary, Mapping) else None
    if not isinstance(problems, Mapping):
        return f"Plan: {vms} VM(s)"
    found = [f"{count} {flag}" for flag, count in problems.items() if count]
    groups = summary.get("groups") if isinstance(summary, Mapping) else None
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, Mapping) and group.get("exceeds_max"):
            found.append(f"{group.get('group')} over its max")
    return f"Plan: {vms} VM(s); problems: {', '.join(found) or 'none'}"


def render(plan: Mapping[str, Any]) -> str:
    """The plan (the JSON `plan --format json` prints, parsed) as an SVG document."""
    until = instant(plan.get("until"))
    lanes = [_lane(row, until) for row in plan.get("rows") or ()]
    windows = _windows(plan)
    instants = [s.start for lane in lanes for s in lane.spans]
    instants += [s.end for lane in lanes for s in lane.spans]
    instants += [
        t
        for lane in lanes
        for t in (lane.posted, lane.slot_from, lane.slot_to, lane.not_before)
        if t is not None
    ]
    edges = [t for w in windows for t in (w.start, w.end)]
    if instants:  # a window's edges are drawn where they fall in the rows' time, not beyond
        edges = [t for t in edges if min(instants) <= t <= max(instants)]
    instants += edges
    scale = Scale(instants, LABEL_W, CHART_W)
    colours = _colours(lanes)
    bottom = _lane_y(len(lanes))
    legend_rows = -(-(len(colours) + 4) // 6)
    width = LABEL_W + CHART_W + FLAGS_W + MARGIN
    height = bottom + 20 + legend_rows * 16 + MARGIN
    title = _title(plan, len(lanes))
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(width)}" '
        f'height="{_num(height)}" viewBox="0 0 {_num(width)} {_num(height)}">',
        f"<title>{text(title)}</title>",
        f'<rect x="0" y="0" width="{_num(width)}" height="{_num(height)}" fill="#ffffff"/>',
        f'<text x="{_num(MARGIN)}" y="18" style="font-family:sans-serif;font-size:14px">'
        f"{text(title)}</text>",
        *_window_rects(lanes, windows, scale),
        *_axis(scale, bottom),
    ]
    for k, lane in enumerate(lanes):
        parts.extend(_lane_parts(k, lane, scale, colours))
    parts.extend(_handoff_lines(lanes, scale))
    parts.extend(_legend(bottom + 14, colours))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
