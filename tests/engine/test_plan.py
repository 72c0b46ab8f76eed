"""`scheduledeventsd plan` (issue 30): the daemon's own engine over a simulated fleet and clock.
The hand-computed cases give the exact instants; bad FLEET input is refused the way check-config
refuses a config; the planner carries out every effect the engine has, and skipping quiet polls
changes nothing but the number of steps. Pure: no process, no socket, no sleep."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any, get_args

import pytest

from scheduledeventsd import cli, engine
from scheduledeventsd.config import ConfigError, Limit
from scheduledeventsd.engine.gates import pipeline
from scheduledeventsd.plan import executors, fleet, report, run, scenarios, world

START = dt.datetime(2026, 11, 23, tzinfo=dt.timezone.utc)  # a Monday
START_ISO = "2026-11-23T00:00:00Z"

WEB = """\
vm_name: auto
state_dir: /var/lib/scheduledeventsd
hooks:
  drain: [{command: [/usr/local/bin/drain], timeout: 3600}]
  undrain: [{command: [/usr/local/bin/undrain]}]
  shutdown: [{command: [/usr/local/bin/shutdown]}]
events:
  Reboot: {before: [drain], after: [undrain]}
  Preempt: [drain]
windows:
  - {days: [sat], start: "02:00", end: "05:00", timezone: UTC}
concurrency: {group: web, max: 1}
coordination: {etcd: {endpoints: ["http://127.0.0.1:2379"]}}
"""


def wave(vms: int, not_before: str = "2026-11-28T05:30:00Z") -> str:
    """`vms` VMs, max 1, Saturday 02:00-05:00 UTC, 30-minute drains, 5-minute impact."""
    return f"""\
vms:
  - names: web-[1-{vms}]
    config: web.yaml
    hooks: {{drain: 30m, undrain: 0s}}
maintenance:
  - type: Reboot
    vms: web-[1-{vms}]
    not_before: {not_before}
    impact: 5m
"""


def files(tmp_path: Path, fleet_text: str, config_text: str = WEB) -> Path:
    (tmp_path / "web.yaml").write_text(config_text)
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_text)
    return path


def planned(path: Path, **options: Any) -> dict[str, Any]:
    loaded = fleet.load(path, path.parent / "absent.yaml")
    return report.build(run.Plan(loaded, START, **options).run())


def at(day: int, clock: str) -> str:
    return f"2026-11-{day}T{clock}Z"


def test_four_vms_one_at_a_time_in_a_saturday_window_at_the_hand_computed_instants(tmp_path):
    """web-1 starts its drain as the window opens (02:00), is approved when it ends (02:30) and
    is back 5 minutes later, when its slot goes to web-2; each VM 35 minutes after the last,
    all four back by 04:20, well before NotBefore (05:30), one at a time."""
    data = planned(files(tmp_path, wave(4)))
    rows = {r["vm"]: r for r in data["rows"]}
    for k, (start, done) in enumerate([
        ("02:00:00", "02:30:00"), ("02:35:00", "03:05:00"),
        ("03:10:00", "03:40:00"), ("03:45:00", "04:15:00"),
    ]):  # fmt: skip
        r = rows[f"web-{k + 1}"]
        back = (dt.datetime.fromisoformat(at(28, done)[:-1]) + dt.timedelta(minutes=5)).time()
        assert r["hooks_start"] == at(28, start)
        assert r["waited_for"] == ("window" if k == 0 else "slot")
        assert (r["approved"], r["approved_early"]) == (at(28, done), True)
        assert r["down"] == at(28, done)
        assert r["back"] == r["after_done"] == at(28, f"{back:%H:%M:%S}")
        assert (r["slot_from"], r["slot_to"]) == (at(28, start), r["back"])
        assert r["flags"] == []
        assert r["not_before"] == at(28, "05:30:00")
    (group,) = data["summary"]["groups"]
    assert group["most_at_once"] == 1
    assert group["max"] == 1
    assert not group["exceeds_max"]
    assert group["approved_early"] == 4
    assert group["short_s"] == 4 * 35 * 60
    assert group["last_back"] == at(28, "04:20:00")
    assert data["summary"]["exit"] == 0
    assert data["windows"] == [
        {
            "group": "web",
            "window": "sat 02:00-05:00 UTC",
            "zone": "UTC",
            "from": at(28, "02:00:00"),
            "to": at(28, "05:00:00"),
            "local_from": "2026-11-28T02:00:00+00:00",
            "local_to": "2026-11-28T05:00:00+00:00",
        }
    ]


def test_eight_vms_the_last_ones_prepare_at_the_lead_without_a_slot(tmp_path):
    """Six fit one after another (web-6 is back at 05:30); web-7 and web-8 still wait for the
    slot at the lead (10 minutes before NotBefore, 05:20): their drains start then without
    one, are never approved early and are cut off by the reboot at NotBefore: late, and the
    tier has three VMs out at once against max 1 (exit 1)."""
    data = planned(files(tmp_path, wave(8)))
    rows = {r["vm"]: r for r in data["rows"]}
    assert rows["web-6"]["hooks_start"] == at(28, "04:55:00")
    assert rows["web-6"]["flags"] == []
    for vm in ("web-7", "web-8"):
        r = rows[vm]
        assert r["hooks_start"] == at(28, "05:20:00")
        assert r["waited_for"] == "lead"
        assert (r["approved"], r["approved_early"]) == (at(28, "05:30:00"), False)
        assert r["down"] == at(28, "05:30:00")
        assert r["back"] == at(28, "05:35:00")
        assert r["slot_from"] is None
        assert r["flags"] == ["cut_off", "late", "no_slot"]
    (group,) = data["summary"]["groups"]
    assert group["most_at_once"] == 3
    assert group["exceeds_max"]
    assert data["summary"]["problems"]["no_slot"] == 2
    assert data["summary"]["exit"] == 1
    assert "web over its max" in report.render(data, "text").splitlines()[-1]


def test_a_preempt_with_30_seconds_notice_cuts_off_a_60_second_drain(tmp_path):
    """The drain starts with the first poll after the notice is posted (at once) and needs a
    minute; the VM is taken at NotBefore, 30 s later, for good: cut_off, late, never back."""
    text = """\
vms:
  - names: spot-1
    config: web.yaml
    hooks: {drain: 60s}
maintenance:
  - type: Preempt
    vms: spot-1
    posted: 1h
    notice: 30s
"""
    data = planned(files(tmp_path, text))
    (r,) = data["rows"]
    assert r["hooks_start"] == "2026-11-23T01:00:00Z"
    assert r["down"] == r["not_before"] == "2026-11-23T01:00:30Z"
    assert r["back"] is None
    assert r["approved_early"] is False
    assert r["flags"] == ["cut_off", "late"]
    assert [s["phase"] for s in r["spans"]] == ["hooks", "down"]
    assert data["summary"]["exit"] == 1


def test_a_window_that_never_opens_before_not_before_is_flagged(tmp_path):
    """NotBefore on the Thursday: no Saturday window before it, so the engine starts the drain
    as it would without windows (at once, on Monday), and the row says no_window."""
    data = planned(files(tmp_path, wave(1, not_before="2026-11-26T12:00:00Z")))
    (r,) = data["rows"]
    assert r["hooks_start"] == START_ISO
    assert r["waited_for"] is None
    assert r["flags"] == ["no_window"]
    assert data["summary"]["exit"] == 0


def test_skipping_quiet_polls_changes_nothing_but_the_number_of_steps(tmp_path):
    """The same plan with every 1 s poll and every keep-alive replayed one by one: the same
    rows and summary, at a small fraction of the steps."""
    path = files(tmp_path, wave(3, not_before="2026-11-23T04:00:00Z"))
    text = wave(3, not_before="2026-11-23T04:00:00Z").replace(
        "not_before", "posted: 0s\n    not_before"
    )
    path.write_text(text)
    config = WEB.replace(
        'days: [sat], start: "02:00", end: "05:00"', 'start: "01:00", end: "05:00"'
    )
    (tmp_path / "web.yaml").write_text(config)
    fast = planned(path)
    slow = planned(path, skip_quiet=False)
    assert fast["rows"] == slow["rows"]
    steps = (fast["summary"].pop("steps"), slow["summary"].pop("steps"))
    assert fast["summary"] == slow["summary"]
    assert steps[0] * 20 < steps[1], steps
    assert [r["hooks_start"] for r in fast["rows"]] == [
        "2026-11-23T01:00:00Z", "2026-11-23T01:35:00Z", "2026-11-23T02:10:00Z",
    ]  # fmt: skip


def test_the_same_input_gives_the_same_bytes(tmp_path, capsys):
    path = files(tmp_path, wave(8))
    outputs = []
    for _ in range(2):
        for form in ("json", "text"):
            code = cli.main(["plan", "--fleet", str(path), "--from", START_ISO, "--format", form])
            assert code == 1
            outputs.append(capsys.readouterr().out)
    assert outputs[:2] == outputs[2:]
    json.loads(outputs[0])
    assert "web-8" in outputs[1]
    assert "2 no_slot" in outputs[1]


def test_plan_writes_its_output_file_and_exits_0_when_all_is_in_time(tmp_path, capsys):
    path = files(tmp_path, wave(4))
    out = tmp_path / "plan.json"
    code = cli.main(["plan", "--fleet", str(path), "--from", START_ISO, "--format", "json",
                     "--output", str(out)])  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out == ""
    assert json.loads(out.read_text())["summary"]["exit"] == 0


@pytest.mark.parametrize(
    ("fleet_text", "config_text", "problem"),
    [
        (
            wave(4).replace("drain: 30m", "drian: 30m"),
            WEB,
            "fleet.yaml: vms[0].hooks.drian: unknown hook",
        ),
        (
            wave(4).replace("vms: web-[1-4]", "vms: web-[5-6]"),
            WEB,
            "fleet.yaml: maintenance[0].vms: names no VM of vms: web-5, web-6",
        ),
        (
            wave(4).replace("vms: web-[1-4]", "vms: web-[4-1]"),
            WEB,
            "fleet.yaml: maintenance[0].vms: web-[4-1] names no VM",
        ),
        (
            wave(4).replace("not_before: 2026-11-28T05:30:00Z", "notice: -1m"),
            WEB,
            "fleet.yaml: maintenance[0].notice: must not be negative, got '-1m'",
        ),
        (
            wave(4),
            WEB.replace("concurrency: {group: web, max: 1}", "concurrency: {group: web, max: 0}"),
            "web.yaml: concurrency.max:",
        ),
        (
            wave(4).replace("names: web-[1-4]", "names: []"),
            WEB,
            "fleet.yaml: vms[0].names: must name a VM or a range like web-[1-12], got an empty",
        ),
        (
            wave(4).replace("web-[1-4]", "web-[1-100000000]"),
            WEB,
            "fleet.yaml: vms[0].names: web-[1-100000000] names 100000000 VMs, more than 100000",
        ),
        (
            wave(4).replace("not_before: 2026-11-28T05:30:00Z", "notice: .inf"),
            WEB,
            "fleet.yaml: maintenance[0].notice: must be a duration like 30s",
        ),
        (
            wave(4).replace("not_before: 2026-11-28T05:30:00Z", "notice: 100000000w"),
            WEB,
            "fleet.yaml: maintenance[0].notice: must be at most 366d",
        ),
        (
            wave(4, not_before="0001-01-01T00:00:00Z"),
            WEB,
            "fleet.yaml: maintenance[0].not_before: must be an instant from 1970 to 8999, "
            "got 0001-01-01T00:00:00+00:00",
        ),
        (
            "vms: [{names: web-1, config: web.yaml}]\nmaintenance: []\n",
            WEB,
            "fleet.yaml: maintenance: must be a list of mappings, got an empty list",
        ),
    ],
    ids=[
        "unknown-hook",
        "range-names-no-vm-of-the-fleet",
        "empty-range",
        "negative-notice",
        "config-the-daemon-refuses",
        "empty-list-of-names",
        "range-too-large",
        "infinite-notice",
        "notice-past-a-year",
        "not-before-in-year-1",
        "no-maintenance",
    ],
)
def test_bad_fleet_input_is_named_by_file_and_key_path_with_exit_2(
    tmp_path, capsys, fleet_text, config_text, problem
):
    path = files(tmp_path, fleet_text, config_text)
    with pytest.raises(ConfigError) as refused:
        fleet.load(path, tmp_path / "absent.yaml")
    assert any(problem in p and p.startswith(str(tmp_path)) for p in refused.value.problems), (
        refused.value.problems
    )
    code = cli.main(["plan", "--fleet", str(path), "--from", START_ISO])
    err = capsys.readouterr().err
    assert code == cli.EXIT_CONFIG
    assert problem in err
    assert "Traceback" not in err
    assert "nothing was planned" in err


@pytest.mark.parametrize("start", ["9999-12-31T23:00:00Z", "1960-01-01T00:00:00Z"])
def test_a_from_the_plan_cannot_run_from_is_refused_naming_from_with_exit_2(
    tmp_path, capsys, start
):
    """`--from` in year 9999 (or before 1970) is refused as a `not_before` there is: exit 2,
    `--from` and the range named. On the old code year 9999 raised OverflowError (a
    traceback) and 1960 was planned."""
    path = files(tmp_path, wave(4).replace("not_before: 2026-11-28T05:30:00Z", "notice: 7d"))
    with pytest.raises(SystemExit) as stopped:
        cli.main(["plan", "--fleet", str(path), "--from", start])
    assert stopped.value.code == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"argument --from: must be an instant from 1970 to 8999, got {start[:-1]}" in err


def test_durations_and_ranges():
    assert [fleet.duration(v) for v in ("30s", "10m", "2h", "7d", "1h30m", 90, "1w")] == [
        30, 600, 7200, 604800, 5400, 90, 604800,
    ]  # fmt: skip
    assert fleet.duration("-1m") == -60
    assert fleet.duration("ten minutes") is None
    assert fleet.duration(True) is None
    assert fleet.expand("web-[1-3]") == ("web-1", "web-2", "web-3")
    assert fleet.expand("db[08-10]x") == ("db08x", "db09x", "db10x")
    assert fleet.expand("solo") == ("solo",)


def test_the_planner_carries_out_every_effect_of_the_vocabulary():
    """A new effect in engine/vocabulary/effects.py without an executor here fails this test
    (and the plan, with a clear error, if it is ever emitted): none is silently ignored. A
    gate's effects (engine.GateEffect) are those its declaration in gates/pipeline.GATES names;
    a new gate's need no entry here (answered as GateEffect.planned says: test_engine_gated)."""
    own = {e for e in get_args(engine.Effect) if e is not engine.GateEffect}
    gates = {e for gate in pipeline.GATES for e in gate.effects}
    assert set(executors.EXECUTORS) == own | gates


def test_an_effect_the_planner_does_not_know_stops_the_plan_with_a_clear_error(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Unknown:
        pass

    plan = run.Plan(fleet.load(files(tmp_path, wave(1)), tmp_path / "absent.yaml"), START)
    with pytest.raises(run.PlanError, match="cannot carry out Unknown"):
        plan._carry(plan.vms[0], (Unknown(),), 0.0)  # type: ignore[arg-type]


WEB_1 = (Limit("web", 1),)


def test_a_stopped_vms_slot_is_held_for_what_it_is_told_as_the_etcd_keeper_holds_it():
    """Issue 28: held for concurrency.hold_max (was a fixed 15 minutes), 0 for a VM that does
    not come back."""
    slots = world.EtcdSlots()
    slots.acquire(WEB_1, "vm-a", "E1", 0.0)
    slots.stopped("vm-a", 10.0, 1800)
    assert slots.next_expiry() == 1810.0
    slots.acquire(WEB_1, "vm-b", "E2", 20.0)
    granted = slots.expire(1810.0)
    assert [vm for vm, _ in granted] == ["vm-b"]


SHARED = """\
hooks:
  drain: [{command: [/usr/local/bin/drain]}]
events:
  Reboot: {before: [drain]}
approve: all
coordination: {etcd: {endpoints: ["http://127.0.0.1:2379"]}}
"""


def test_a_shared_event_is_approved_once_every_vm_is_ready_and_starts_for_all(tmp_path):
    """One Reboot naming three VMs, approve: all, drains of 1, 2 and 3 minutes: each VM writes
    ready to the event's keys when its drain ends; once the last is ready (09:13) the event is
    approved and all three go down together, early, 47 minutes before NotBefore."""
    text = """\
vms:
  - names: app-1
    config: web.yaml
    hooks: {drain: 1m}
  - names: app-2
    config: web.yaml
    hooks: {drain: 2m}
  - names: app-3
    config: web.yaml
    hooks: {drain: 3m}
maintenance:
  - type: Reboot
    vms: app-[1-3]
    shared: true
    posted: 10m
    notice: 1h
    impact: 5m
"""
    data = planned(files(tmp_path, text, SHARED))
    assert [r["hooks_start"] for r in data["rows"]] == ["2026-11-23T00:10:00Z"] * 3
    for r in data["rows"]:
        assert (r["approved"], r["approved_early"]) == ("2026-11-23T00:13:00Z", True)
        assert r["down"] == "2026-11-23T00:13:00Z"
        assert r["back"] == "2026-11-23T00:18:00Z"
        assert r["flags"] == []
    assert len({r["event_id"] for r in data["rows"]}) == 1


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # web.yaml: Reboot waits for Saturday's window; Freeze and Terminate have no rule.
        ("live-migration", {"down": "00:15:00", "back": "00:15:05", "hooks_start": None}),
        ("reboot", {"down": "00:15:00", "back": "00:20:00", "hooks_start": "00:00:00"}),
        ("redeploy", {"down": "00:10:00", "back": "00:20:00", "hooks_start": None}),
        ("preempt", {"down": "00:00:30", "back": None, "hooks_start": "00:00:00"}),
        ("terminate", {"down": "00:05:00", "back": None, "hooks_start": None}),
        ("canceled", {"down": None, "back": None, "cancelled": "00:05:00"}),
        ("host-failure", {"down": "00:00:00", "back": "00:10:00", "hooks_start": None}),
    ],
)
def test_each_built_in_scenario_plays_azures_timings_for_one_vm(tmp_path, name, expected):
    """`--scenario NAME`: one VM, one event, Azure's minimum notice for its type. With no
    window before NotBefore the Reboot's drain starts at once, as without windows, and takes
    30 minutes here: cut off at NotBefore. A canceled Reboot is withdrawn while it drains; a
    host failure is Started when first seen: no hooks."""
    (tmp_path / "web.yaml").write_text(WEB)
    loaded = scenarios.load(name, tmp_path / "web.yaml")
    loaded = dataclasses.replace(
        loaded,
        sets=tuple(
            dataclasses.replace(s, hooks={"drain": fleet.HookTime(1800.0)}) for s in loaded.sets
        ),
    )
    (row,) = report.build(run.Plan(loaded, START).run())["rows"]
    for key, clock in expected.items():
        assert row[key] == (None if clock is None else f"2026-11-23T{clock}Z"), key


def test_a_dst_weekend_window_lasts_the_hours_the_clocks_show(tmp_path):
    """Sunday 25 October 2026, Europe/Berlin: 02:00-05:00 local opens at the first 02:00
    (CEST, 00:00 UTC) and closes at 05:00 CET (04:00 UTC), four hours. Seven VMs, 35 minutes
    each, one at a time: the seventh starts at 03:30 UTC and is back at 04:05, before its
    lead (04:20; NotBefore 04:30). Had the window opened at the second 02:00 (01:00 UTC), the
    seventh would still wait at the lead, without a slot."""
    config = WEB.replace(
        'days: [sat], start: "02:00", end: "05:00", timezone: UTC',
        'days: [sun], start: "02:00", end: "05:00", timezone: Europe/Berlin',
    )
    path = files(tmp_path, wave(7, not_before="2026-10-25T04:30:00Z"), config)
    loaded = fleet.load(path, tmp_path / "absent.yaml")
    start = dt.datetime(2026, 10, 19, tzinfo=dt.timezone.utc)
    data = report.build(run.Plan(loaded, start).run())
    starts = [r["hooks_start"] for r in data["rows"]]
    assert starts == [
        f"2026-10-25T{h}Z"
        for h in ("00:00:00", "00:35:00", "01:10:00", "01:45:00", "02:20:00", "02:55:00",
                  "03:30:00")
    ]  # fmt: skip
    assert all(r["flags"] == [] and r["approved_early"] for r in data["rows"])
    assert data["rows"][-1]["back"] == "2026-10-25T04:05:00Z"
    (window,) = data["windows"]
    assert (window["from"], window["to"]) == ("2026-10-25T00:00:00Z", "2026-10-25T04:00:00Z")
    assert (window["local_from"], window["local_to"]) == (
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T05:00:00+01:00",
    )
    assert data["summary"]["exit"] == 0


def test_skipping_quiet_polls_changes_nothing_where_slots_run_out(tmp_path):
    """The eight-VM wave (slots handed on, refused, given up at the lead, hooks cut off),
    from an hour before the window opens, at 2 s polls: the same plan either way."""
    path = files(tmp_path, wave(8))
    (tmp_path / "web.yaml").write_text(WEB + "metadata: {poll_interval: 2}\n")
    loaded = fleet.load(path, tmp_path / "absent.yaml")
    start = dt.datetime(2026, 11, 28, 1, tzinfo=dt.timezone.utc)
    fast = report.build(run.Plan(loaded, start).run())
    slow = report.build(run.Plan(loaded, start, skip_quiet=False).run())
    assert fast["rows"] == slow["rows"]
    assert fast["summary"]["problems"]["no_slot"] == 2
    assert fast["summary"]["steps"] * 10 < slow["summary"]["steps"]


def test_every_key_of_the_json_is_the_one_report_py_documents(tmp_path):
    """plan/svg.py and CI jobs read this shape: a key added, renamed or dropped without its
    line in plan/report.py's docstring fails here."""
    data = planned(files(tmp_path, wave(8)))
    doc = report.__doc__ or ""
    keys = {*data, *data["summary"], *data["summary"]["groups"][0], *data["rows"][0]}
    keys |= {*data["rows"][0]["spans"][0], *data["windows"][0]}
    assert sorted(k for k in keys if f'"{k}"' not in doc) == []
    assert {*data["rows"][0]} == {
        "vm", "group", "event_type", "event_id", "posted", "not_before", "hooks_start",
        "waited_for", "approved", "approved_early", "down", "back", "after_done", "cancelled",
        "slot_from", "slot_to", "flags", "spans", "groups",
    }  # fmt: skip
    phases = {s["phase"] for r in data["rows"] for s in r["spans"]}
    assert phases <= {"queued", "draining", "hooks", "ready", "down", "after", "retry"}
    assert all(f'"{flag}"' in doc for flag in report.FLAGS)


def test_a_plan_the_planner_cannot_simulate_ends_in_an_error_not_a_traceback(
    tmp_path, capsys, monkeypatch
):
    def cannot(self: run.Plan) -> run.Plan:
        raise run.PlanError("web-1: a poll taken as quiet was not at 12.0")

    monkeypatch.setattr(run.Plan, "run", cannot)
    code = cli.main(["plan", "--fleet", str(files(tmp_path, wave(1))), "--from", START_ISO])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: the plan could not be simulated: web-1" in err
    assert "Traceback" not in err


def test_provider_auto_is_planned_as_azure_whatever_machine_plans(tmp_path):
    """`provider: auto` reads the DMI data of the machine it runs on; the planner is not the VM.
    On a machine whose DMI data says AWS, the VMs' Azure events are still approved early."""
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    data = planned(files(tmp_path, wave(1), WEB + f"dmi_dir: {dmi}\n"))
    (row,) = data["rows"]
    assert (row["approved"], row["approved_early"]) == (at(28, "02:30:00"), True)


def test_a_vm_taken_for_good_never_has_the_maintenance_due_after(tmp_path):
    """A Preempt takes spot-1 once its 10 s drain is done and approved (01:00:10); the Reboot
    due on Saturday never happens to it: no down, no back, and the plan ends at its NotBefore
    (nothing is left to wait for)."""
    text = """\
vms:
  - names: spot-1
    config: web.yaml
    hooks: {drain: 10s}
maintenance:
  - type: Preempt
    vms: spot-1
    posted: 1h
    notice: 30s
  - type: Reboot
    vms: spot-1
    not_before: 2026-11-28T05:30:00Z
    impact: 5m
"""
    data = planned(files(tmp_path, text))
    reboot, preempt = data["rows"]
    assert preempt["event_type"] == "Preempt"
    assert preempt["down"] == preempt["approved"] == "2026-11-23T01:00:10Z"
    assert (reboot["down"], reboot["back"], reboot["hooks_start"]) == (None, None, None)
    assert data["until"] == reboot["not_before"]


def test_a_hook_that_fails_is_never_approved_early_and_a_hook_past_its_timeout_fails(tmp_path):
    """`drain: fail`: the VM is prepared (hooks_failed), not approved, down at NotBefore; it
    keeps the group's slot until then (the slot is held until its event is over), so the
    second VM gets none and prepares at the lead. A drain of 2 hours against its 3600 s
    timeout fails when the timeout ends (03:00)."""
    data = planned(files(tmp_path, wave(2).replace("drain: 30m", "drain: fail")))
    first, second = data["rows"]
    assert first["flags"] == ["hooks_failed"]
    assert first["slot_to"] == at(28, "05:35:00")
    assert (second["hooks_start"], second["flags"]) == (
        at(28, "05:20:00"),
        ["hooks_failed", "no_slot"],
    )
    for r in data["rows"]:
        assert (r["approved"], r["approved_early"]) == (at(28, "05:30:00"), False)
    timed_out = planned(files(tmp_path, wave(1).replace("drain: 30m", "drain: 2h")))
    (r,) = timed_out["rows"]
    assert r["flags"] == ["hooks_failed"]
    assert [s for s in r["spans"] if s["phase"] == "hooks"] == [
        {"phase": "hooks", "from": at(28, "02:00:00"), "to": at(28, "03:00:00")}
    ]


def test_an_output_file_that_cannot_be_written_is_an_error_not_a_traceback(tmp_path, capsys):
    path = files(tmp_path, wave(1))
    out = tmp_path / "no-such-dir" / "plan.json"
    code = cli.main(["plan", "--fleet", str(path), "--from", START_ISO, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_CONFIG  # bad input: 1 says a VM is late or a group over its max
    assert f"error: {out}: No such file or directory" in err
    assert "Traceback" not in err


def test_an_event_posted_after_the_vm_rebooted_is_seen_at_the_next_poll(tmp_path):
    """A first Reboot (no window before its NotBefore: at once) takes the VM down at 00:00:10
    and back at 00:05:10 on a new boot; a second is posted at 02:00: the new daemon's next
    poll sees it, and its drain starts then."""
    text = """\
vms:
  - names: web-1
    config: web.yaml
    hooks: {drain: 10s}
maintenance:
  - type: Reboot
    vms: web-1
    notice: 1h
    impact: 5m
  - type: Reboot
    vms: web-1
    posted: 2h
    notice: 1h
    impact: 5m
"""
    data = planned(files(tmp_path, text))
    first, second = data["rows"]
    assert first["back"] == "2026-11-23T00:05:10Z"
    assert second["hooks_start"] == second["posted"] == "2026-11-23T02:00:00Z"
    assert second["back"] == "2026-11-23T02:05:10Z"


def test_a_not_before_already_past_starts_the_event_when_it_is_posted(tmp_path):
    """not_before before the plan's start (a FLEET file planned again a week later): the cloud
    starts such an event when it lists it, as one with no notice; the VMs go down when it is
    posted (01:00) and are back 5 minutes later, and its `approved` is that instant."""
    text = wave(2, not_before="2026-11-20T00:00:00Z")
    text = text.replace("impact: 5m", "posted: 1h\n    impact: 5m")
    data = planned(files(tmp_path, text))
    for r in data["rows"]:
        assert (r["down"], r["back"]) == ("2026-11-23T01:00:00Z", "2026-11-23T01:05:00Z")
        assert (r["approved"], r["approved_early"]) == ("2026-11-23T01:00:00Z", False)


@pytest.mark.parametrize("notice", ["notice: 0s", "not_before: 2026-11-20T00:00:00Z"])
def test_vms_the_cloud_takes_before_any_hook_ran_are_late_and_in_maintenance(
    tmp_path, capsys, notice
):
    """No notice (or a NotBefore already past): the four VMs go down when it is posted, none of
    them drained. Each is `late` (its drain, which the config asks for, never ran) and counts
    in maintenance from then until it is back: four at once against max 1, so the CI gate the
    docs describe fails (exit 1). On the old code: no flag, "at most 0 in maintenance at
    once", "short for 0h00m00s", "problems: none", exit 0."""
    path = files(tmp_path, wave(4).replace("not_before: 2026-11-28T05:30:00Z", notice))
    code = cli.main(["plan", "--fleet", str(path), "--from", START_ISO, "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    for r in data["rows"]:
        assert (r["hooks_start"], r["down"]) == (None, START_ISO)
        assert r["flags"] == ["late"]
    (group,) = data["summary"]["groups"]
    assert (group["most_at_once"], group["exceeds_max"], group["short_s"]) == (4, True, 300)
    assert data["summary"]["problems"]["late"] == 4
    assert cli.main(["plan", "--fleet", str(path), "--from", START_ISO]) == 1
    text = capsys.readouterr().out
    assert "at most 4 in maintenance at once (max 1)  EXCEEDS max; short for 0h05m00s" in text
    assert text.splitlines()[-1] == "problems: 4 late, web over its max"


@pytest.mark.parametrize(
    ("name", "short", "rule", "late"),
    [
        ("redeploy", 600, "", False),  # no rule for Redeploy: left alone, never late
        ("host-failure", 600, "", False),
        ("live-migration", 5, "", False),
        ("host-failure", 600, "  Redeploy: [drain]\n", True),  # Started when first seen
        ("live-migration", 5, "  Freeze: [drain]\n", False),  # 15 minutes: drained in time
    ],
)
def test_a_scenarios_vm_is_in_maintenance_while_down_whether_or_not_its_hooks_ran(
    tmp_path, capsys, name, short, rule, late
):
    """`plan --scenario`: the VM is out of its group while it is down even with no hook for
    its type; a host failure (Started when first seen) is late where the config prepares for
    Redeploy. On the old code: "at most 0 in maintenance at once", short 0 s, never late."""
    (tmp_path / "web.yaml").write_text(WEB.replace("events:\n", "events:\n" + rule))
    code = cli.main(["plan", "--scenario", name, "--config", str(tmp_path / "web.yaml"),
                     "--from", START_ISO, "--format", "json"])  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    (row,) = data["rows"]
    (group,) = data["summary"]["groups"]
    assert (group["most_at_once"], group["short_s"]) == (1, short)
    assert ("late" in row["flags"]) is late
    assert code == (1 if late else 0)


def test_an_event_its_vm_was_gone_before_is_neither_late_nor_approved(tmp_path):
    """spot-1 drains for a Reboot due in an hour (no window before it: at once) when a Preempt
    takes it 30 s later: the Preempt's row is cut_off and late; the Reboot never happens to
    it: no approval, and not late (its NotBefore never came for the VM)."""
    text = """\
vms:
  - names: spot-1
    config: web.yaml
    hooks: {drain: 60s}
maintenance:
  - type: Reboot
    vms: spot-1
    notice: 1h
    impact: 5m
  - type: Preempt
    vms: spot-1
    notice: 30s
"""
    data = planned(files(tmp_path, text))
    rows = {r["event_type"]: r for r in data["rows"]}
    assert rows["Reboot"]["hooks_start"] == START_ISO
    assert (rows["Reboot"]["approved"], rows["Reboot"]["down"]) == (None, None)
    assert rows["Reboot"]["flags"] == ["no_window"]  # Saturday's window is after NotBefore
    assert rows["Preempt"]["flags"] == ["cut_off", "late"]
    assert data["summary"]["problems"]["late"] == 1
    (line,) = [x for x in report.as_text(data).splitlines() if x.startswith("spot-1  Reboot")]
    assert "NotBefore" not in line


TWO_REBOOTS = """\
vms:
  - names: web-1
    config: web.yaml
    hooks: {drain: 30m, undrain: 0s}
maintenance:
  - type: Reboot
    vms: web-1
    not_before: 2026-11-28T05:30:00Z
    impact: 5m
  - type: Reboot
    vms: web-1
    posted: 1m
    not_before: 2026-11-28T05:31:00Z
    impact: 5m
"""


def test_two_events_of_one_vm_share_its_slot_and_skipping_quiet_polls_changes_nothing(tmp_path):
    """Two Reboots of web-1 prepare together in Saturday's window and share its one slot: both
    are approved when the drains end (02:30) and it is back at 02:35, as when every keep-alive
    is replayed (the slot is not lost to a keep-alive told late to one event after the other).
    One VM is one VM in maintenance: the group is not over its max of 1."""
    loaded = fleet.load(files(tmp_path, TWO_REBOOTS), tmp_path / "absent.yaml")
    saturday = dt.datetime(2026, 11, 28, 1, 0, tzinfo=dt.timezone.utc)  # replayed: 1 s polls
    skipped, replayed = (
        report.build(run.Plan(loaded, saturday, skip_quiet=skip).run()) for skip in (True, False)
    )
    for data in (skipped, replayed):
        for r in data["rows"]:
            assert (r["approved"], r["approved_early"]) == (at(28, "02:30:00"), True)
            assert (r["back"], r["flags"]) == (at(28, "02:35:00"), [])
        (group,) = data["summary"]["groups"]
        assert (group["most_at_once"], group["exceeds_max"]) == (1, False)
        assert data["summary"]["exit"] == 0
    assert skipped["rows"] == replayed["rows"]


DOWN_TWICE = """\
vms:
  - names: v-[1-2]
    config: web.yaml
    hooks: {drain: 0s, undrain: 0s}
maintenance:
  - type: Redeploy
    vms: v-2
    posted: 10m
    notice: 0s
    impact: 5m
  - type: Redeploy
    vms: v-2
    posted: 10m
    notice: 30s
    impact: 5m
  - type: Reboot
    vms: v-2
    posted: 40m
    notice: 1h
    impact: 5m
"""
DOWN_TWICE_CONFIG = """\
hooks:
  drain: [{command: [/bin/true]}]
  undrain: [{command: [/bin/true]}]
events:
  Reboot: {before: [drain], after: [undrain]}
  Redeploy: {before: [drain], after: [undrain]}
concurrency: {group: g, max: 1}
coordination: {etcd: {endpoints: ["http://127.0.0.1:2379"]}}
approve: all
"""


def test_an_event_that_starts_while_its_vm_is_down_leaves_the_document_for_quiet_polls(tmp_path):
    """A host failure takes v-2 down at 00:10 (back 00:15); a second Redeploy starts at its
    NotBefore (00:10:30) while it is down and leaves the document 5 minutes later (00:15:30),
    after v-2 is back and polling quietly: that change is due in the plan's heap (it was not:
    "its document changed while quiet", no plan at all), and the plan is the one replayed
    poll by poll."""
    loaded = fleet.load(files(tmp_path, DOWN_TWICE, DOWN_TWICE_CONFIG), tmp_path / "absent.yaml")
    skipped, replayed = (
        report.build(run.Plan(loaded, START, skip_quiet=skip).run()) for skip in (True, False)
    )
    assert skipped["rows"] == replayed["rows"]
    reboot = next(r for r in skipped["rows"] if r["event_type"] == "Reboot")
    assert reboot["hooks_start"] == "2026-11-23T00:40:00Z"


def test_a_window_opening_exactly_at_the_lead_is_used_and_not_flagged_no_window(tmp_path):
    """NotBefore 02:10 on Saturday: the window opens at 02:00, exactly the 10-minute lead
    before it, and the engine starts the drain in it (waited_for window); the row is late and
    cut off (a 30-minute drain), but not no_window (it was: the flag read the window as
    having to open before the lead, the engine takes one opening at it)."""
    data = planned(files(tmp_path, wave(1, not_before="2026-11-28T02:10:00Z")))
    (r,) = data["rows"]
    assert (r["hooks_start"], r["waited_for"]) == (at(28, "02:00:00"), "window")
    assert r["flags"] == ["cut_off", "late"]


def test_a_hook_given_a_list_takes_one_entry_per_run_and_the_slot_waits_for_its_retry(tmp_path):
    """`undrain: [fail, 2m]`: web-1's undrain fails when it is back (02:35), runs again
    `after_retry` (60 s) later and succeeds at 02:38; its slot is held until then, so web-2's
    drain starts at 02:38, not at 02:35; the wait for the retry is its own span. web-2's
    undrain (its own first run) fails too and is retried: the runs are counted per VM."""
    text = wave(2).replace("undrain: 0s", "undrain: [fail, 2m]")
    first, second = planned(files(tmp_path, text))["rows"]
    assert (first["back"], first["after_done"]) == (at(28, "02:35:00"), at(28, "02:38:00"))
    assert first["slot_to"] == at(28, "02:38:00")
    assert (second["hooks_start"], second["waited_for"]) == (at(28, "02:38:00"), "slot")
    assert [s for s in first["spans"] if s["phase"] in ("after", "retry")] == [
        {"phase": "retry", "from": at(28, "02:35:00"), "to": at(28, "02:36:00")},
        {"phase": "after", "from": at(28, "02:36:00"), "to": at(28, "02:38:00")},
    ]  # drawn: the failed undrain, then its retry
    assert second["after_done"] == at(28, "03:16:00")  # back 03:13, retried 03:14, + 2m


def test_a_hook_list_that_is_empty_or_holds_no_duration_is_refused_by_key_path(tmp_path):
    for given, problem in [
        ("[]", "vms[0].hooks.undrain: must be a duration, fail, or a list of them"),
        ("[fail, soon]", "vms[0].hooks.undrain[1]: must be a duration like 30s"),
    ]:
        path = files(tmp_path, wave(1).replace("undrain: 0s", f"undrain: {given}"))
        with pytest.raises(ConfigError) as refused:
            fleet.load(path, tmp_path / "absent.yaml")
        assert any(problem in p for p in refused.value.problems), refused.value.problems


class _Told(run.Plan):
    """The plan, counting what each VM's engine is told (by message type)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.told: collections.Counter[tuple[str, str]] = collections.Counter()

    def _observe(self, vm: Any, message: Any, effects: Any, t: float) -> None:
        self.told[(vm.name, type(message).__name__)] += 1
        super()._observe(vm, message, effects, t)


def test_a_slot_handed_on_eleven_times_and_renewed_every_10s_is_told_a_few_times_the_same_plan(
    tmp_path,
):
    """Twelve VMs, one slot, 10-minute drains: the slot changes hands 11 times while the last
    VM waits, and each holder's lease (ttl 30 s) is renewed every 10 s for 15 minutes. Each
    waiting VM's engine is told only the last of a run of the slot's news (a probe showed
    they only say who holds it), and a holder is not woken at each end of its lease (the
    latest renewal is told before each step): a few messages each, not 11 and 20 (main
    told web-12 of every hand-off and each holder of 20 renewals). The plan is the one with
    every poll, hand-off and renewal replayed one by one."""
    path = files(tmp_path, wave(12).replace("drain: 30m", "drain: 10m"))
    (tmp_path / "web.yaml").write_text(WEB + "metadata: {poll_interval: 2}\n")
    loaded = fleet.load(path, tmp_path / "absent.yaml")
    start = dt.datetime(2026, 11, 28, 1, 50, tzinfo=dt.timezone.utc)
    fast = _Told(loaded, start)
    data = report.build(fast.run())
    slow = report.build(run.Plan(loaded, start, skip_quiet=False).run())
    assert data["rows"] == slow["rows"]
    assert data["summary"].pop("steps") * 100 < slow["summary"].pop("steps")
    assert data["summary"] == slow["summary"]
    assert [r["slot_from"] for r in data["rows"]][-1] == "2026-11-28T04:45:00Z"
    busy = [fast.told[(f"web-{i}", "SlotBusy")] for i in range(1, 13)]
    kept = [fast.told[(f"web-{i}", "SlotKept")] for i in range(1, 13)]
    assert max(busy) <= 3, busy
    assert max(kept) <= 3, kept
    # A catch-up answers the last rate window's polls one by one (at 2 s: none or one), not
    # also the interval before it (main: 12 polls a VM).
    polls = [fast.told[(f"web-{i}", "DocumentFetched")] for i in range(1, 13)]
    assert max(polls) <= 9, polls


@pytest.mark.parametrize("interval", [0.25, 1])
def test_skipping_quiet_polls_at_1_hz_and_4_hz_changes_nothing(tmp_path, interval):
    """At 1 s the polls of a rate window and the next can never fill IMDS' budget, so only the
    last window's are answered one by one when a VM's quiet polls are caught up; at 4 Hz they
    can, and the window and an interval are (the budget then holds polls back). Either way
    the plan is the one with every poll replayed, hand-offs and approvals at the same
    instants (at 4 Hz each approval 20 ms late, behind the polls in the budget)."""
    path = files(tmp_path, wave(3, not_before="2026-11-28T02:00:00Z"))
    path.write_text(path.read_text().replace("drain: 30m", "drain: 10m"))
    (tmp_path / "web.yaml").write_text(
        WEB.replace('start: "02:00"', 'start: "01:00"')
        + f"metadata: {{poll_interval: {interval}}}\n"
    )
    loaded = fleet.load(path, tmp_path / "absent.yaml")
    start = dt.datetime(2026, 11, 28, 0, 55, tzinfo=dt.timezone.utc)
    fast = report.build(run.Plan(loaded, start).run())
    slow = report.build(run.Plan(loaded, start, skip_quiet=False).run())
    assert fast["rows"] == slow["rows"]
    assert fast["summary"].pop("steps") * 50 < slow["summary"].pop("steps")
    assert fast["summary"] == slow["summary"]
    late = ".020" if interval < 1 else ""  # at 4 Hz the polls fill the budget: the POST waits
    assert [r["approved"] for r in fast["rows"]] == [
        f"2026-11-28T01:10:00{late}Z", f"2026-11-28T01:25:00{late}Z", f"2026-11-28T01:40:00{late}Z",
    ]  # fmt: skip


def test_a_vm_with_two_events_waiting_for_the_slot_is_told_of_each_events_wait(tmp_path):
    """Five VMs, one slot, each with a Reboot and four with a second one posted 10 minutes
    later: at each hand-off a waiting VM is told the slot's news for each of its two events.
    Both events of web-3 and web-4 waited for the slot (the news for one was dropped when only
    the last of a run was stepped, whatever its event: "window"); the same plan as replayed
    one by one."""
    config = WEB.replace('days: [sat], start: "02:00"', 'days: [mon], start: "01:00"')
    text = (
        "vms:\n  - names: web-[1-5]\n    config: web.yaml\n    hooks: {drain: 0s, undrain: 0s}\n"
        "maintenance:\n  - type: Reboot\n    vms: web-[1-5]\n    notice: 1h\n    impact: 30s\n"
        "  - type: Reboot\n    vms: web-[1-4]\n    posted: 10m\n    notice: 2h\n    impact: 5m\n"
    )
    path = files(tmp_path, text, config.replace("max: 1}", "max: 1, ttl: 15}"))
    loaded = fleet.load(path, tmp_path / "absent.yaml")
    start = dt.datetime(2026, 11, 23, 0, 30, tzinfo=dt.timezone.utc)
    fast = report.build(run.Plan(loaded, start).run())
    slow = report.build(run.Plan(loaded, start, skip_quiet=False).run())
    assert fast["rows"] == slow["rows"]
    waited = {(r["vm"], r["posted"]): r["waited_for"] for r in fast["rows"]}
    assert [waited[(vm, at(23, "00:40:00"))] for vm in ("web-3", "web-4")] == ["slot", "slot"]


def _limited(concurrency: str) -> str:
    return WEB.replace("concurrency: {group: web, max: 1}", f"concurrency: {concurrency}")


TIERS_AND_ZONES = """\
vms:
  - {names: web-1, config: web-a.yaml, hooks: {drain: 30m, undrain: 0s}}
  - {names: web-2, config: web-b.yaml, hooks: {drain: 30m, undrain: 0s}}
  - {names: "db-[1-2]", config: db-a.yaml, hooks: {drain: 30m, undrain: 0s}}
maintenance:
  - {type: Reboot, vms: [web-1, web-2, "db-[1-2]"], not_before: "2026-11-28T05:30:00Z",
     impact: 5m}
"""


def test_a_tier_and_a_zone_limit_at_once_are_planned_as_the_keeper_takes_them(tmp_path):
    """web-1 and web-2 (tier web, max 1) in zones a and b, db-1 and db-2 (tier db, max 2) both in
    zone a (max 2 per zone). At 02:00 web-1 and db-1 take a slot in both their groups; web-2
    waits for the tier (its zone has room), db-2 for its zone (its tier has room), holding
    nothing meanwhile. web-1 and db-1 are back at 02:35: web-2 and db-2 take their slots then,
    are approved at 03:05 and back at 03:10. No group ever has more than its max (zone a: 2);
    the rows carry both groups, the summary has all four."""
    for name, limits in {
        "web-a.yaml": "[{group: web, max: 1}, {group: zone-a, max: 2}]",
        "web-b.yaml": "[{group: web, max: 1}, {group: zone-b, max: 2}]",
        "db-a.yaml": "[{group: db, max: 2}, {group: zone-a, max: 2}]",
    }.items():
        (tmp_path / name).write_text(_limited(limits))
    (tmp_path / "fleet.yaml").write_text(TIERS_AND_ZONES)
    data = planned(tmp_path / "fleet.yaml")
    rows = {r["vm"]: r for r in data["rows"]}
    for vm, start, waited, groups in [
        ("web-1", "02:00:00", "window", ["web", "zone-a"]),
        ("db-1", "02:00:00", "window", ["db", "zone-a"]),
        ("web-2", "02:35:00", "slot", ["web", "zone-b"]),
        ("db-2", "02:35:00", "slot", ["db", "zone-a"]),
    ]:
        r = rows[vm]
        done = "02:30:00" if start == "02:00:00" else "03:05:00"
        back = "02:35:00" if start == "02:00:00" else "03:10:00"
        assert (r["group"], r["groups"]) == (groups[0], groups), vm
        assert (r["hooks_start"], r["waited_for"]) == (at(28, start), waited), vm
        assert (r["approved"], r["approved_early"]) == (at(28, done), True), vm
        assert r["back"] == r["after_done"] == at(28, back), vm
        assert (r["slot_from"], r["slot_to"]) == (at(28, start), at(28, back)), vm
        assert r["flags"] == [], vm
    summary = {g["group"]: g for g in data["summary"]["groups"]}
    assert list(summary) == ["db", "web", "zone-a", "zone-b"]
    assert {g: (s["vms"], s["most_at_once"], s["max"]) for g, s in summary.items()} == {
        "db": (2, 1, 2), "web": (2, 1, 1), "zone-a": (3, 2, 2), "zone-b": (1, 1, 2),
    }  # fmt: skip
    assert {g: s["short_s"] for g, s in summary.items()} == {
        "db": 4200, "web": 4200, "zone-a": 4200, "zone-b": 2100,
    }  # fmt: skip
    assert not any(s["exceeds_max"] for s in summary.values())
    assert data["summary"]["exit"] == 0
    assert "web,zone-a" in report.as_text(data)


def test_the_simulated_keeper_takes_a_slot_in_every_group_or_in_none():
    """As coordination/slotset.py: a VM whose zone is full takes no slot of its tier, and one
    whose tier is full none of its zone; SlotBusy names the full groups and who holds them, and
    is said again only when those holders change; freed, the slots go to the first that asked
    and can take all of its groups."""
    slots = world.EtcdSlots()
    a = (Limit("web", 1), Limit("zone-a", 2))
    db = (Limit("db", 2), Limit("zone-a", 2))
    assert slots.acquire(a, "web-1", "E1", 0.0) == [("web-1", engine.SlotGranted("E1", 0.0))]
    assert slots.acquire(db, "db-1", "E2", 0.0) == [("db-1", engine.SlotGranted("E2", 0.0))]
    busy = slots.acquire(db, "db-2", "E3", 1.0)
    assert busy == [("db-2", engine.SlotBusy("E3", ("db-1", "web-1"), ("zone-a",)))]
    # db-2 took no db slot while it waits: a third db VM without a zone limit gets db's last,
    # and db-2, trying again, is told both its groups are full now.
    assert slots.acquire((Limit("db", 2),), "db-3", "E4", 2.0) == [
        ("db-3", engine.SlotGranted("E4", 2.0)),
        ("db-2", engine.SlotBusy("E3", ("db-1", "db-3", "web-1"), ("db", "zone-a"))),
    ]
    tier_full = slots.acquire((Limit("web", 1), Limit("zone-b", 1)), "web-2", "E5", 3.0)
    assert tier_full == [("web-2", engine.SlotBusy("E5", ("web-1",), ("web",)))]
    # web-2 holds no zone-b slot: one zone-b VM more takes zone-b's only one (web-2 is told).
    zone_b = (Limit("zone-b", 1),)
    assert slots.acquire(zone_b, "x", "E6", 4.0) == [
        ("x", engine.SlotGranted("E6", 4.0)),
        ("web-2", engine.SlotBusy("E5", ("web-1", "x"), ("web", "zone-b"))),
    ]
    # y asks and stops asking in zone-b only: db-2 and web-2 are not told anything new.
    assert slots.acquire(zone_b, "y", "E7", 4.5) == [
        ("y", engine.SlotBusy("E7", ("x",), ("zone-b",)))
    ]
    assert slots.release("y", "E7", 4.6) == []
    # db-3 gives db's slot back: db-2 still waits for its zone, and is told so.
    assert slots.release("db-3", "E4", 5.0) == [
        ("db-2", engine.SlotBusy("E3", ("db-1", "web-1"), ("zone-a",)))
    ]
    # web-1 goes: db-2 takes zone-a and db together; web-2 now waits for zone-b (x holds it).
    assert slots.release("web-1", "E1", 6.0) == [
        ("db-2", engine.SlotGranted("E3", 6.0)),
        ("web-2", engine.SlotBusy("E5", ("x",), ("zone-b",))),
    ]
    assert [(g, vm, since, to) for g, vm, since, to in slots.held()] == [
        ("web", "web-1", 0.0, 6.0), ("db", "db-1", 0.0, None), ("db", "db-3", 2.0, 5.0),
        ("zone-b", "x", 4.0, None), ("db", "db-2", 6.0, None),
    ]  # fmt: skip


def test_a_restarted_vm_takes_back_its_slots_in_every_group_as_one_hold():
    """As slotset.plan's "the slot this VM holds already": slots handed over while the VM is
    down still count against both groups (another VM waits), and its new daemon takes both
    back at once, the same hold going on; given back, the waiting VM gets them."""
    slots = world.EtcdSlots()
    a = (Limit("web", 1), Limit("zone-a", 1))
    assert slots.acquire(a, "web-1", "E1", 0.0) == [("web-1", engine.SlotGranted("E1", 0.0))]
    slots.stopped("web-1", 10.0, 3600)
    busy = slots.acquire(a, "web-2", "E2", 20.0)
    assert busy == [("web-2", engine.SlotBusy("E2", ("web-1",), ("web", "zone-a")))]
    assert slots.acquire(a, "web-1", "E1", 300.0) == [("web-1", engine.SlotGranted("E1", 300.0))]
    assert slots.next_expiry() is None
    assert slots.release("web-1", "E1", 400.0) == [("web-2", engine.SlotGranted("E2", 400.0))]
    assert slots.held() == [("web", "web-1", 0.0, 400.0), ("web", "web-2", 400.0, None)]
