"""`plan --format svg`'s drawing, on a plan written by hand (tests/edges/plan_sample.json,
in the shape plan/report.py documents: a web tier of four VMs handing one slot on in a Saturday
window, a db VM whose window never opened in time, a spot VM gone for good): well-formed, one
lane per VM, hostile names escaped, the same bytes every time."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from scheduledeventsd.plan import svg
from scheduledeventsd.plan.axis import BREAK_W, Scale, duration

SAMPLE = Path(__file__).with_name("plan_sample.json")
NS = {"s": "http://www.w3.org/2000/svg"}
ROOT = Path(__file__).parents[2]


def sample() -> dict:
    return json.loads(SAMPLE.read_text())


def parse(document: str) -> ET.Element:
    """The document, parsed strictly (UTF-8 bytes, as a browser reads the file)."""
    return ET.fromstring(document.encode("utf-8"))  # noqa: S314 - our own output, no DTD


def parsed(plan: dict) -> ET.Element:
    return parse(svg.render(plan))


def lanes(tree: ET.Element) -> list[ET.Element]:
    return tree.findall(".//s:g[@class='lane']", NS)


def test_the_drawing_is_well_formed_svg():
    tree = parsed(sample())
    assert tree.tag == "{http://www.w3.org/2000/svg}svg"
    assert float(tree.get("width", "0")) > 0
    assert float(tree.get("height", "0")) > 0


def test_one_lane_per_row_in_the_rows_order_named_by_its_vm():
    plan = sample()
    found = lanes(parsed(plan))
    assert [lane.get("data-vm") for lane in found] == [row["vm"] for row in plan["rows"]]
    assert [lane.find("s:text", NS).text for lane in found] == [r["vm"] for r in plan["rows"]]
    plan["rows"] = plan["rows"][:2]
    assert len(lanes(parsed(plan))) == 2


def test_each_span_is_drawn_in_its_phases_colour_and_the_legend_names_each_phase():
    """Every span of the plan is a rectangle; spans of one phase share a colour and the legend
    shows each phase drawn."""
    plan = sample()
    tree = parsed(plan)
    rects = tree.findall(".//s:rect[@class='span']", NS)
    assert len(rects) == sum(len(row["spans"]) for row in plan["rows"])
    by_phase: dict[str, set[str]] = {}
    for rect in rects:
        phase = rect.find("s:title", NS).text.split(": ", 1)[1].split(" ")[0]
        by_phase.setdefault(phase, set()).add(rect.get("fill"))
    assert all(len(fills) == 1 for fills in by_phase.values())
    assert len({next(iter(f)) for f in by_phase.values()}) == len(by_phase)
    legend = [t.text for t in tree.findall(".//s:g[@class='legend']//s:text", NS)]
    assert set(by_phase) <= set(legend)
    assert {"window open", "slot held", "slot handed on", "NotBefore"} <= set(legend)


def test_a_hostile_vm_name_is_text_not_markup():
    """A VM named `<script>&"` (and one with a NUL, an escape and a lone surrogate, which XML
    cannot carry at all) is drawn as text: the document parses, no element is injected, and the
    label reads the name back."""
    plan = sample()
    plan["rows"][0]["vm"] = '<script>&"'
    plan["rows"][1]["vm"] = "a\x00b\x1b[31mc\ud800"
    plan["rows"][2]["group"] = "</g><svg onload='x'>"
    out = svg.render(plan)
    assert "<script" not in out
    assert "onload='x'" not in out
    tree = parse(out)
    assert not [e for e in tree.iter() if e.tag.endswith("script") or e.get("onload")]
    found = lanes(tree)
    assert found[0].find("s:text", NS).text == '<script>&"'
    assert found[0].get("data-vm") == '<script>&"'
    assert found[1].find("s:text", NS).text == "a\ufffdb\ufffd[31mc\ufffd"
    assert found[2].get("data-group") == "</g><svg onload='x'>"


def test_the_same_plan_gives_the_same_bytes_even_across_hash_seeds(tmp_path):
    """Twice in this process, and in processes whose str hashes differ (set order), also for
    phases the palette does not know (their colours are given in the order of their names)."""
    assert svg.render(sample()) == svg.render(copy.deepcopy(sample()))
    unknown = sample()
    for k, row in enumerate(unknown["rows"]):
        for span in row["spans"]:
            span["phase"] = f"{span['phase']}-{k % 3}"
    for plan in (sample(), unknown):
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(plan))
        code = (
            "import json, sys; from scheduledeventsd.plan import svg;"
            f"sys.stdout.write(svg.render(json.load(open({str(path)!r}))))"
        )
        outs = set()
        for seed in ("1", "2", "3", "4"):
            env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
            )
            outs.add(done.stdout)
        assert outs == {svg.render(plan)}


def test_each_slot_hand_off_in_a_group_is_a_line_from_the_giver_to_the_taker():
    """web-1 gives the slot to web-2, web-2 to web-3, web-3 to web-4; db-1 held none."""
    plan = sample()
    assert svg.handoffs([svg._lane(r) for r in plan["rows"]]) == [(0, 1), (1, 2), (2, 3)]
    paths = parsed(plan).findall(".//s:path[@class='handoff']", NS)
    handed = [p.find("s:title", NS).text for p in paths]
    assert handed == ["slot of web: web-1 to web-2", "slot of web: web-2 to web-3",
                      "slot of web: web-3 to web-4"]  # fmt: skip


def test_two_slots_are_handed_on_to_the_latest_release_each():
    """With `max: 2` two VMs take the slots at the window's opening (no hand-off) and each later
    one takes the slot given up last before it."""
    t = "2026-11-28T{}:00Z".format
    rows = [
        {"vm": "a", "group": "g", "slot_from": t("02:00"), "slot_to": t("02:30")},
        {"vm": "b", "group": "g", "slot_from": t("02:00"), "slot_to": t("02:40")},
        {"vm": "c", "group": "g", "slot_from": t("02:40"), "slot_to": t("03:00")},
        {"vm": "d", "group": "g", "slot_from": t("02:45"), "slot_to": t("03:10")},
        {"vm": "e", "group": "h", "slot_from": t("02:45"), "slot_to": t("03:10")},
    ]
    assert svg.handoffs([svg._lane(r) for r in rows]) == [(1, 2), (0, 3)]


def test_slots_given_up_at_once_are_handed_on_in_lane_order():
    """Five VMs give their slots up at one instant and five take them: the first gives to the
    first, and so on, so the lines do not cross."""
    t = "2026-11-28T{}:00Z".format
    rows = [{"vm": f"a{k}", "group": "g", "slot_from": t("02:00"), "slot_to": t("02:15")}
            for k in range(5)]  # fmt: skip
    rows += [{"vm": f"b{k}", "group": "g", "slot_from": t("02:15"), "slot_to": t("02:30")}
             for k in range(5)]  # fmt: skip
    assert svg.handoffs([svg._lane(r) for r in rows]) == [(k, k + 5) for k in range(5)]


def test_a_groups_window_is_shaded_across_its_lanes_and_a_vms_across_its_own():
    """Its title says the window as configured, in UTC and in its own zone."""
    tree = parsed(sample())
    windows = tree.findall(".//s:rect[@class='window']", NS)
    heights = sorted(float(w.get("height", "0")) for w in windows)
    assert heights == [svg.LANE_H, 4 * svg.LANE_H]
    web = next(w for w in windows if float(w.get("height", "0")) == 4 * svg.LANE_H)
    assert float(web.get("y", "0")) == svg.TOP
    assert web.find("s:title", NS).text == (
        "web: sat 02:00-05:00 UTC, 2026-11-28T02:00:00Z to 2026-11-28T05:00:00Z"
        " (2026-11-28T02:00:00+00:00 to 2026-11-28T05:00:00+00:00 UTC)"
    )


def test_notbefore_is_marked_on_every_lane_that_has_one():
    plan = sample()
    plan["rows"][4]["not_before"] = None
    lanes_marked = parsed(plan).findall(".//s:g[@class='lane']", NS)
    marks = {
        lane.get("data-vm"): lane.find("s:path[@class='not-before']/s:title", NS)
        for lane in lanes_marked
    }
    expected = {r["vm"]: r["not_before"] for r in plan["rows"] if r["not_before"]}
    assert {vm: m.text for vm, m in marks.items() if m is not None} == {
        vm: f"{vm}: NotBefore {at}" for vm, at in expected.items()
    }


def test_flags_are_written_beside_the_lane():
    texts = parsed(sample()).findall(".//s:text[@class='flags']", NS)
    assert [t.text for t in texts] == ["no_window", "cut_off"]


def test_a_span_still_open_at_the_end_lasts_until_the_plans_end():
    """A Preempt's VM is gone for good: its `down` span has no end; it is drawn to `until`."""
    plan = sample()
    tree = parsed(plan)
    spot = next(lane for lane in lanes(tree) if lane.get("data-vm") == "spot-1")
    down = spot.findall("s:rect[@class='span']", NS)[-1]
    assert down.find("s:title", NS).text.endswith(f"to {plan['until']}")
    width = float(down.get("x", "0")) + float(down.get("width", "0"))
    assert width == pytest.approx(svg.LABEL_W + svg.CHART_W, abs=0.1)


def test_the_title_counts_the_vms_and_the_problems():
    plan = sample()
    title = parsed(plan).find("s:title", NS).text
    assert title == "Plan: 6 VM(s); problems: 1 no_window, 1 cut_off"
    plan["summary"]["problems"] = {"late": 0}
    assert parsed(plan).find("s:title", NS).text == "Plan: 6 VM(s); problems: none"


def test_the_title_names_a_group_over_its_max_even_with_no_flag():
    """A plan exits 1 when a group exceeds its max: its picture must not say "problems: none"."""
    plan = sample()
    plan["summary"]["problems"] = {"late": 0}
    plan["summary"]["groups"][0]["exceeds_max"] = True
    assert parsed(plan).find("s:title", NS).text == "Plan: 6 VM(s); problems: web over its max"


def test_an_empty_plan_still_draws_a_valid_document():
    tree = parse(svg.render({"rows": [], "windows": []}))
    assert lanes(tree) == []


def test_a_week_of_waiting_is_cut_short_and_the_work_keeps_the_chart():
    """Posted Friday, NotBefore a week later, work in a Saturday night: the idle days become
    shaded breaks BREAK_W wide labelled with their length; the Saturday hours are to scale."""
    at = dt.datetime(2026, 11, 27, tzinfo=dt.timezone.utc)
    hours = [at + dt.timedelta(hours=h) for h in (0, 26, 27, 28, 168)]
    scale = Scale(hours, 0.0, 1000.0)
    cuts = scale.cuts()
    assert [duration(c.end - c.start) for c in cuts] == ["1d 2h", "5d 20h"]
    assert all(c.x1 - c.x0 == BREAK_W for c in cuts)
    assert scale.x(hours[2]) - scale.x(hours[1]) == pytest.approx((1000.0 - 2 * BREAK_W) / 2)
    assert scale.x(hours[0]) == 0.0
    assert scale.x(hours[-1]) == pytest.approx(1000.0)
    ticks = scale.ticks()
    assert ticks
    assert all(t.timestamp() % scale.step() == 0 for t in ticks)
    xs = [scale.x(t) for t in ticks]
    assert xs == sorted(xs)
