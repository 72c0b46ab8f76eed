"""Google Cloud through the same hooks: the real daemon against the simulated metadata server
(long-polls with etags, maintenance-event, preempted, upcoming-maintenance), and the mapping."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduledeventsd import gcp
from scheduledeventsd.gcp_simulator import INSTANCE_NAME, GcpSimulator
from scheduledeventsd.model import SCHEDULED, STARTED
from tests.conftest import DaemonFactory, Hooks, processes_mentioning


@pytest.fixture
def gce() -> Any:
    simulator = GcpSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def gcp_config(daemons: DaemonFactory, gce: GcpSimulator, hooks: Hooks, **extra: Any) -> dict:
    names = ("freeze", "after", "cancelled", "spot", "redeploy")
    recorder = {n: hooks.recorder(n) for n in names}
    return {
        "provider": "gcp",
        "metadata": {"url": gce.url, "poll_interval": 0.25, "timeout": 2, "first_call_timeout": 5},
        "state_dir": str(daemons.state_dir),
        "hooks": {name: [{"command": [path]}] for name, path in recorder.items()},
        "events": {
            "Freeze": {"before": ["freeze"], "after": ["after"], "cancelled": ["cancelled"]},
            "Preempt": ["spot"],
            "Redeploy": {"before": ["redeploy"], "start_before": 3600},
        },
        **extra,
    }


def stdin_of(hooks: Hooks, name: str) -> dict[str, Any]:
    return json.loads((hooks.out / f"{name}.stdin").read_text())


def test_a_live_migration_notice_is_a_freeze_seen_by_long_poll_and_over_when_it_ends(
    daemons, gce, hooks
):
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    assert daemon.wait_log("vm_name")["vm_name"] == INSTANCE_NAME
    asked = gce.gets("/instance/")
    time.sleep(2)
    # A long-poll waits for the change: at 4 Hz a plain poll would have asked 8 times.
    assert gce.gets("/instance/") - asked <= 2
    assert any("wait_for_change=true" in r.query for r in list(gce.requests))
    gce.maintenance("MIGRATE_ON_HOST_MAINTENANCE")
    daemon.wait_log("hook_finished", hook="freeze", timeout=10)
    notice = stdin_of(hooks, "freeze")
    assert notice["Provider"] == "gcp"
    assert notice["ProviderNotice"] == {"maintenanceEvent": "MIGRATE_ON_HOST_MAINTENANCE",
                                        "preempted": "FALSE"}  # fmt: skip
    assert notice["EventType"] == "Freeze"
    gce.maintenance("NONE")
    daemon.wait_log("hook_finished", hook="after", timeout=10)
    assert hooks.order() == ["freeze", "after"], "over, not cancelled"


def test_preemption_runs_the_preempt_hooks_and_nothing_is_posted(daemons, gce, hooks):
    daemon = daemons.start(gcp_config(daemons, gce, hooks, approve="always"))
    gce.preempt()
    daemon.wait_log("hook_finished", hook="spot", timeout=10)
    event = stdin_of(hooks, "spot")
    left = dt.datetime.fromisoformat(event["NotBefore"].replace("Z", "+00:00")).timestamp()
    assert 20 < left - time.time() <= 30, "NotBefore: 30 s after it was seen"
    assert "gcp takes no approval" in daemon.wait_log("approval_skipped")["reason"]


def test_upcoming_maintenance_waits_for_its_lead_like_any_long_notice(daemons, gce, hooks):
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    start = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=3)
    gce.upcoming(start.strftime("%Y-%m-%dT%H:%M:%SZ"))
    gce.maintenance("NONE")  # the instance directory does not change: seen at the next answer
    gce.preempt()  # a change, so the long-poll answers at once
    waiting = daemon.wait_log("event_waiting", timeout=10)
    assert waiting["event_type"] == "Redeploy"
    assert waiting["reason"] == "start_before"


def test_a_503_during_maintenance_is_retried(daemons, gce, hooks):
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    gce.fail_next(503, 503)
    gce.maintenance("TERMINATE_ON_HOST_MAINTENANCE")
    daemon.wait_log("poll_failed", timeout=10)
    daemon.wait_log("poll_recovered", timeout=10)


def test_a_restart_mid_hook_keeps_the_event_and_runs_its_hooks_again(daemons, gce, hooks):
    slow = hooks.make("slow", 'echo slow >> "$OUT/order"; sleep 30')
    cfg = gcp_config(daemons, gce, hooks)
    cfg["hooks"]["freeze"] = [{"command": [slow]}]
    daemon = daemons.start(cfg)
    gce.maintenance()
    daemon.wait_log("hook_started", hook="freeze", timeout=10)
    daemon.signal(signal.SIGKILL)
    daemon.stop()
    for pid, _ in processes_mentioning(slow):  # systemd would end them with the unit's cgroup
        os.kill(pid, signal.SIGKILL)
    cfg["hooks"]["freeze"] = [{"command": [hooks.recorder("freeze")]}]
    again = daemons.start(cfg)
    interrupted = again.wait_log("hooks_interrupted", timeout=10)
    assert interrupted["event_id"] == "gcp-migrate_on_host_maintenance"
    again.wait_log("hook_finished", hook="freeze", timeout=10)
    assert not again.logs("event_detected"), "the same event, not a new one"


NOW = 1_800_000_000.0


def test_the_mapping_of_every_notice():
    seen = gcp.Seen()
    for value, event_type in gcp.MAINTENANCE.items():
        body = json.dumps({"maintenanceEvent": value, "preempted": "TRUE"}).encode()
        doc = gcp.document_of(body, None, vm_name="vm", now=NOW, seen=seen)
        assert {e.event_type for e in doc.events} == {event_type, "Preempt"}
        assert {e.status for e in doc.events} == {SCHEDULED}
    later = gcp.document_of(body, None, vm_name="vm", now=NOW + 61, seen=seen)
    assert {e.event_type: e.status for e in later.events} == {
        "Redeploy": STARTED, "Preempt": STARTED
    }, "past the documented notice it has started"  # fmt: skip


def test_an_ended_notice_is_listed_started_once_then_gone():
    seen = gcp.Seen()
    on = gcp.document_of(b'{"maintenanceEvent": "MIGRATE_ON_HOST_MAINTENANCE"}', None,
                         vm_name="vm", now=NOW, seen=seen)  # fmt: skip
    off = gcp.document_of(b'{"maintenanceEvent": "NONE"}', None, vm_name="vm", now=NOW, seen=seen)
    gcp.notice_over(on, off, seen)
    once = gcp.document_of(b'{"maintenanceEvent": "NONE"}', None, vm_name="vm", now=NOW, seen=seen)
    assert [(e.event_id, e.status) for e in once.events] == [
        ("gcp-migrate_on_host_maintenance", STARTED)
    ]
    gone = gcp.document_of(b'{"maintenanceEvent": "NONE"}', None, vm_name="vm", now=NOW, seen=seen)
    assert gone.events == ()
    again = gcp.document_of(b'{"maintenanceEvent": "MIGRATE_ON_HOST_MAINTENANCE"}', None,
                            vm_name="vm", now=NOW + 500, seen=seen)  # fmt: skip
    assert again.events[0].not_before.timestamp() == NOW + 560, "a new notice is seen anew"


@settings(max_examples=300, deadline=None)
@given(st.none() | st.binary(max_size=300), st.none() | st.binary(max_size=300))
def test_any_bytes_are_a_document_never_an_exception(instance, upcoming):
    gcp.document_of(instance, upcoming, vm_name="vm", now=NOW, seen=gcp.Seen())


def test_simulate_provider_gcp_serves_the_metadata_server_and_plays_its_notices(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduledeventsd", "simulate", "--provider", "gcp",
         "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).parents[1],
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        url = first[-1]
        assert first[:3] == ["gcp", "metadata", "simulator"]
        answer = requests.get(
            f"{url}/instance/name", headers={"Metadata-Flavor": "Google"}, timeout=5
        )
        assert answer.text == INSTANCE_NAME
        assert requests.get(f"{url}/instance/name", timeout=5).status_code == 403
    finally:
        proc.terminate()
        proc.wait(10)
