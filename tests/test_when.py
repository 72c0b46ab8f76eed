"""Choosing when, end to end: the real daemon, the simulator, real hook processes. Windows are
placed from the test's own clock (whole minutes, as the config writes them)."""

from __future__ import annotations

import datetime as dt
import signal

from .conftest import VM


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
