"""Choosing when, end to end: the real daemon, the simulator, real hook processes. Windows are
placed from the test's own clock (whole minutes, as the config writes them)."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from scheduledeventsd.simulators.azure import rfc1123
from tests.conftest import VM


def _window(opens_in_min: int, lasts_min: int) -> dict[str, str]:
    now = dt.datetime.now(dt.timezone.utc)
    opens = now + dt.timedelta(minutes=opens_in_min)
    closes = opens + dt.timedelta(minutes=lasts_min)
    return {"start": f"{opens:%H:%M}", "end": f"{closes:%H:%M}", "timezone": "UTC"}


def test_a_reboot_waits_for_a_window_and_a_reload_that_opens_one_starts_its_hooks(
    daemons, sim, hooks
):
    cfg = daemons.config(
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"], "Freeze": ["drain"]},
        approve="always",
        windows=[_window(180, 60)],
    )
    daemon = daemons.start(cfg)
    reboot = sim.add_event("Reboot", [VM], not_before_in=6 * 3600)
    freeze = sim.add_event("Freeze", [VM], not_before_in=6 * 3600)
    waiting = daemon.wait_log("event_waiting", event_id=reboot)
    assert waiting["reason"] == "window"
    assert waiting["window"].endswith("UTC")
    daemon.wait_log("event_approved", event_id=freeze)  # Freeze does not obey windows
    assert hooks.order() == ["drain"]

    daemons.write_config(dict(cfg, windows=[_window(-1, 30)]))  # a window open now
    daemon.signal(signal.SIGHUP)
    daemon.wait_log("config_reloaded")
    daemon.wait_log("event_approved", event_id=reboot)
    assert hooks.order() == ["drain", "drain"]


def test_hooks_know_how_many_seconds_are_left_and_the_fast_hooks_run_when_few_are(
    daemons, sim, hooks
):
    cfg = daemons.config(
        hooks={
            "drain": [{"command": [hooks.recorder("drain")]}],
            "checkpoint": [{"command": [hooks.recorder("checkpoint")]}],
        },
        events={"Reboot": {"before": ["drain"], "fast": ["checkpoint"], "fast_below": 300}},
        approve="always",
    )
    daemon = daemons.start(cfg)
    soon = sim.add_event("Reboot", [VM], not_before_in=120)
    rule = daemon.wait_log("event_rule", event_id=soon)
    assert rule["rule"] == "fast"
    daemon.wait_log("event_approved", event_id=soon)
    later = sim.add_event("Reboot", [VM], not_before_in=900)
    daemon.wait_log("event_approved", event_id=later)
    assert hooks.order() == ["checkpoint", "drain"]
    env = dict(
        line.split("=", 1)
        for line in (hooks.out / "drain.env").read_text().splitlines()
        if "=" in line
    )
    assert 890 <= int(env["SCHEDULED_EVENT_SECONDS_LEFT"]) <= 900
    env = dict(
        line.split("=", 1)
        for line in (hooks.out / "checkpoint.env").read_text().splitlines()
        if "=" in line
    )
    assert 100 <= int(env["SCHEDULED_EVENT_SECONDS_LEFT"]) <= 120


def test_dry_run_says_it_would_take_a_slot_takes_none_and_waits_for_its_deadline(
    daemons, sim, hooks
):
    """No etcd is reached (none runs here): --dry-run asks for nothing and logs the wait."""
    cfg = daemons.config(
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"]},
        approve="always",
        coordination={"etcd": {"endpoints": ["http://127.0.0.1:9"], "timeout": 1}},
        concurrency={"group": "web", "max": 1},
    )
    daemon = daemons.start(cfg, args=("--dry-run",))
    event_id = sim.add_event("Reboot", [VM], not_before_in=3600)
    daemon.wait_log("would_take_slot", event_id=event_id)
    waiting = daemon.wait_log("event_waiting", event_id=event_id)
    assert waiting["reason"] == "slot"
    daemon.polls_seen(sim)
    assert not daemon.logs("slot_failed"), "no etcd was asked"
    assert not daemon.logs("would_run_hooks")


def test_a_window_open_now_waits_for_start_before_to_allow_the_hooks(daemons, sim, hooks):
    """The docs' promise, broken: with a window open now, start_before: 60 and NotBefore 25 min
    away the hooks ran at once (SECONDS_LEFT 1346). Windows choose within what start_before
    allows: the hooks wait until 60 s before NotBefore."""
    cfg = daemons.config(
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": {"before": ["drain"], "start_before": 60}},
        approve="always",
        windows=[_window(-5, 120)],  # open now, and for two hours
    )
    daemon = daemons.start(cfg)
    reboot = sim.add_event("Reboot", [VM], not_before_in=25 * 60)
    waiting = daemon.wait_log("event_waiting", event_id=reboot)
    starts = dt.datetime.fromisoformat(waiting["hooks_start_at"].replace("Z", "+00:00"))
    left = starts.timestamp() - time.time()
    assert 25 * 60 - 60 - 10 < left <= 25 * 60 - 60, left
    daemon.polls_seen(sim)
    assert hooks.order() == [], "no hook runs 24 minutes early"


# ---- daylight saving, end to end: the daemon's wall clock faked by libfaketime -----------------

SHIM = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* libfaketime with FAKETIME_DONT_FAKE_MONOTONIC=1 breaks clock_nanosleep on the monotonic
   clock (its issue 426: Python's time.sleep fails with EINVAL): pass it on untouched. */
int clock_nanosleep(clockid_t clock, int flags, const struct timespec *request,
                    struct timespec *remain) {
    return syscall(SYS_clock_nanosleep, clock, flags, request, remain) == -1 ? errno : 0;
}
"""


@pytest.fixture(scope="module")
def faked_wall(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dt.datetime], dict[str, str]]:
    """The environment that starts a process with its wall clock at a chosen instant (Debian's
    faketime: `make test` installs it) while its monotonic clock, which the daemon's timers
    use, stays real."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    assert found, "libfaketime is missing: apt-get install faketime (make test does)"
    shim = tmp_path_factory.mktemp("faketime") / "sleep-shim.so"
    source = shim.with_suffix(".c")
    source.write_text(SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(source)], check=True)

    def env(at: dt.datetime) -> dict[str, str]:
        return {
            "LD_PRELOAD": f"{shim} {found[0]}",
            "FAKETIME": f"@{at.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "TZ": "UTC",
        }

    return env


def _local(day: str, at: str, zone: str) -> dt.datetime:
    return dt.datetime.fromisoformat(f"{day}T{at}").replace(tzinfo=ZoneInfo(zone))


# (zone, the Sunday of a change in 2027, the window: the hour skipped in spring (which has no
# length that day) or the hour shown twice in autumn, and whether the clocks go forward)
CHANGES_2027 = [
    ("Europe/Berlin", "2027-03-28", "02:00", "03:00", True),
    ("Europe/Berlin", "2027-10-31", "02:00", "03:00", False),
    ("America/New_York", "2027-03-14", "02:00", "03:00", True),
    ("America/New_York", "2027-11-07", "01:00", "02:00", False),
    ("Australia/Lord_Howe", "2027-10-03", "02:00", "02:30", True),
    ("Australia/Lord_Howe", "2027-04-04", "01:30", "02:00", False),
]


@pytest.mark.parametrize(("zone", "sunday", "start", "end", "spring"), CHANGES_2027)
def test_in_the_week_before_a_daylight_saving_change_a_freeze_is_still_seen_and_handled(
    daemons, sim, hooks, faked_wall, zone, sunday, start, end, spring
):
    """Issue 26 #2: with `sun START-END ZONE` and the wall clock in the week before the change,
    a Reboot due after it made every DocumentFetched an internal_error (StopIteration) for
    days: a Freeze posted meanwhile was never seen. Now the Reboot waits for the window's
    next real opening (spring: the Sunday after; autumn: the first showing of START), and the
    Freeze runs its hook and is approved."""
    change = dt.date.fromisoformat(sunday)
    fake_start = dt.datetime.combine(change - dt.timedelta(days=6), dt.time(12, 0), dt.timezone.utc)
    cfg = daemons.config(
        hooks={
            "drain": [{"command": [hooks.recorder("drain")]}],
            "checkpoint": [{"command": [hooks.recorder("checkpoint")]}],
        },
        events={"Reboot": ["drain"], "Freeze": ["checkpoint"]},
        approve="always",
        windows=[{"days": ["sun"], "start": start, "end": end, "timezone": zone}],
    )
    began = time.time()
    daemon = daemons.start(cfg, env=faked_wall(fake_start))

    def faked(after_s: float) -> str:
        return rfc1123(fake_start.timestamp() + (time.time() - began) + after_s)

    due = _local((change + dt.timedelta(days=8)).isoformat(), "12:00", zone)
    reboot = sim.add_event(raw=_raw("Reboot", rfc1123(due.timestamp())))
    waiting = daemon.wait_log("event_waiting", event_id=reboot)
    opens_on = change + dt.timedelta(days=7 if spring else 0)
    opens = _local(opens_on.isoformat(), start, zone).astimezone(dt.timezone.utc)
    assert waiting["reason"] == "window"
    assert waiting["hooks_start_at"] == f"{opens:%Y-%m-%dT%H:%M:%SZ}"
    freeze = sim.add_event(raw=_raw("Freeze", faked(900)))
    daemon.wait_log("event_approved", event_id=freeze)
    assert hooks.order() == ["checkpoint"], "the Reboot still waits for its window"
    assert not daemon.logs("internal_error")


def _raw(event_type: str, not_before: str) -> dict[str, object]:
    return {
        "EventId": str(uuid.uuid4()),
        "EventType": event_type,
        "EventStatus": "Scheduled",
        "ResourceType": "VirtualMachine",
        "Resources": [VM],
        "NotBefore": not_before,
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
