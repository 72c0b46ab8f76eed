"""Google Cloud through the same hooks: the real daemon against the simulated metadata server
(long-polls with etags, maintenance-event, preempted, upcoming-maintenance), and the mapping."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduledeventsd.model import SCHEDULED, STARTED
from scheduledeventsd.providers import gcp
from scheduledeventsd.providers.imds import ImdsError
from scheduledeventsd.simulators.gcp import INSTANCE_NAME, GcpSimulator
from tests.conftest import Daemon, DaemonFactory, Hooks, processes_mentioning, wait_for


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


def not_before_of(notice: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(notice["NotBefore"].replace("Z", "+00:00")).timestamp()


def env_of(hooks: Hooks, name: str) -> dict[str, str]:
    lines = (hooks.out / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_failed_get_after_a_change_does_not_hide_the_notice_behind_the_next_long_poll(
    daemons, gce, hooks
):
    """Issue 26 #4: the preemption's answer came, the upcoming-maintenance GET beside it failed
    (503); the next poll asks at once (no ETag), and NotBefore counts from that first answer."""
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    wait_for(lambda: any("wait_for_change=true" in r.query for r in list(gce.requests)),
             what="a long-poll at rest")  # fmt: skip
    gce.fail_next(503, path="/instance/upcoming-maintenance")
    posted = time.time()
    gce.preempt()
    daemon.wait_log("poll_failed", timeout=10)
    daemon.wait_log("hook_finished", hook="spot", timeout=10)  # not 30 s later
    assert time.time() - posted < 8
    left = not_before_of(stdin_of(hooks, "spot")) - posted
    assert 29 <= left <= 31, f"NotBefore {left:.1f} s after the preemption was posted"


def test_an_unreadable_window_start_time_is_skipped_and_a_later_preemption_is_seen(
    daemons, gce, hooks
):
    """Issue 26 #5: one notice that cannot be read is skipped with its reason; every poll does
    not fail, and a Preempt posted later runs its hooks."""
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    gce.upcoming("2026-12-05 02:00 UTC")
    gce.attribute("nudge", "1")  # the directory changes: the long-poll answers now
    skipped = daemon.wait_log("event_skipped", timeout=10)
    assert "window_start_time" in skipped["reason"]
    assert "2026-12-05 02:00 UTC" in skipped["reason"]
    gce.preempt()
    daemon.wait_log("hook_finished", hook="spot", timeout=10)
    assert not daemon.logs("poll_failed")
    assert not daemons.defects()


def test_every_live_migration_that_ends_runs_its_after_hooks_not_only_the_first(
    daemons, gce, hooks
):
    """Issue 26 #12: the second migration of the same kind (same id) that ends is over, not
    cancelled: its after-hooks run with SCHEDULED_EVENT_STAGE=after."""
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    for migration in (1, 2):
        gce.maintenance("MIGRATE_ON_HOST_MAINTENANCE")
        wait_for(lambda n=migration: len(daemon.logs("hook_finished", hook="freeze")) == n)
        gce.maintenance("NONE")
        wait_for(lambda n=migration: len(daemon.logs("after_hooks_finished")) == n)
        assert hooks.order()[-1] == "after", f"migration {migration}: {hooks.order()}"
        assert env_of(hooks, "after")["SCHEDULED_EVENT_STAGE"] == "after"
    assert hooks.order() == ["freeze", "after", "freeze", "after"]
    assert not daemon.logs("event_cancelled")


def test_a_moved_maintenance_window_is_the_same_event_with_a_new_not_before(daemons, gce, hooks):
    """Issue 26 #13: Google moves the upcoming window: the event waits for the new one; it is
    not listed Started (missed, or after-hooks for maintenance that never happened)."""
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    first = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(hours=3)
    gce.upcoming(first.strftime("%Y-%m-%dT%H:%M:%SZ"))
    gce.attribute("nudge", "1")
    waiting = daemon.wait_log("event_waiting", timeout=10)
    moved = first + dt.timedelta(hours=1)
    gce.upcoming(moved.strftime("%Y-%m-%dT%H:%M:%SZ"))
    gce.attribute("nudge", "2")
    wait_for(lambda: len(daemon.logs("event_waiting")) == 2, what="the wait placed again")
    again = daemon.logs("event_waiting")[1]
    assert again["event_id"] == waiting["event_id"]
    assert again["not_before"] == moved.strftime("%Y-%m-%dT%H:%M:%SZ")
    asked = gce.gets("/upcoming-maintenance")
    gce.attribute("nudge", "3")  # one more whole answer, so a quick second one came too
    wait_for(lambda: gce.gets("/upcoming-maintenance") > asked, what="one more answer")
    assert len(daemon.logs("event_detected")) == 1
    assert not daemon.logs("event_missed")
    assert not daemon.logs("event_status_changed")
    assert hooks.order() == []


def announce(gce: GcpSimulator, window: dt.datetime, nudge: str) -> None:
    """Google shows the upcoming window starting at `window`; the long-poll answers."""
    gce.upcoming(window.strftime("%Y-%m-%dT%H:%M:%SZ"))
    gce.attribute("nudge", nudge)


def window_in_30_minutes(
    daemons: DaemonFactory, gce: GcpSimulator, cfg: dict
) -> tuple[Daemon, dt.datetime]:
    """The daemon started on `cfg`, Redeploy drained an hour ahead and undrained if cancelled,
    then a window 30 minutes from now shown: the daemon, and now."""
    cfg["events"]["Redeploy"] = {"before": ["redeploy"], "cancelled": ["cancelled"],
                                 "start_before": 3600}  # fmt: skip
    daemon = daemons.start(cfg)
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    announce(gce, now + dt.timedelta(minutes=30), "1")
    return daemon, now


def test_a_window_moved_days_later_after_the_drain_undrains_and_drains_again_at_its_new_lead(
    daemons, gce, hooks
):
    """Google moves the upcoming window 3 days later after the before-hook (drain) ran: the
    cancelled-hook (undrain) runs now and the event waits for its new lead. Before: nothing
    happened, and the node stayed drained for the 3 days until the maintenance."""
    cfg = gcp_config(daemons, gce, hooks)
    daemon, now = window_in_30_minutes(daemons, gce, cfg)
    daemon.wait_log("hook_finished", hook="redeploy", timeout=10)
    daemon.wait_log("approval_skipped", timeout=10)
    moved = now + dt.timedelta(days=3)
    announce(gce, moved, "2")
    cancelled = daemon.wait_log("event_cancelled", timeout=10)
    assert cancelled["hooks_start_at"] == (moved - dt.timedelta(hours=1)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    daemon.wait_log("hook_finished", hook="cancelled", timeout=10)
    assert env_of(hooks, "cancelled")["SCHEDULED_EVENT_STAGE"] == "cancelled"
    assert not_before_of(stdin_of(hooks, "cancelled")) == moved.timestamp()
    gce.attribute("nudge", "3")  # the next answer: judged anew, it waits for its new lead
    waiting = daemon.wait_log("event_waiting", timeout=10)
    assert waiting["event_id"] == gcp.UPCOMING_ID
    assert waiting["hooks_start_at"] == cancelled["hooks_start_at"]
    assert hooks.order() == ["redeploy", "cancelled"], "not drained again before its new lead"


def instance_requests(gce: GcpSimulator) -> list[Any]:
    return [r for r in list(gce.requests) if r.path.endswith("/instance/")]


def test_an_unreadable_instance_answer_neither_ends_a_preemption_nor_moves_its_not_before(
    daemons, gce, hooks
):
    """Review of issue 26: one answer of the instance directory that is not JSON (a proxy's
    page, status 200) listed the preemption Started (event_status_changed), and the next answer
    saw it anew with a NotBefore moved later (the first sighting dropped). It cannot say the
    notice is over: the notice stays as last read, and the next poll asks at once."""
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    gce.preempt()
    daemon.wait_log("hook_finished", hook="spot", timeout=10)
    detected = daemon.wait_log("event_detected")
    polls = len(instance_requests(gce))  # the last is the long-poll under way
    gce.fail_next(200, path="/instance/")  # 200 with the text "Service Unavailable"
    gce.attribute("nudge", "1")  # the long-poll answers; the next one gets the page
    assert daemon.wait_log("event_skipped", timeout=10)["reason"] == "instance: not JSON"
    wait_for(lambda: len(instance_requests(gce)) >= polls + 2, what="a poll after the page")
    asked = gce.gets("/upcoming-maintenance")
    gce.attribute("nudge", "2")
    wait_for(lambda: gce.gets("/upcoming-maintenance") > asked, what="one more answer")
    garbled, next_poll = instance_requests(gce)[polls : polls + 2]
    assert "last_etag" in garbled.query
    assert "last_etag" not in next_poll.query, "after an unreadable answer: asked at once"
    assert not daemon.logs("event_status_changed")
    assert len(daemon.logs("event_detected")) == 1
    assert {r.get("not_before") for r in daemon.records if r.get("event_id") == "gcp-preempted"} - {
        None
    } == {detected["not_before"]}
    assert hooks.order() == ["spot"]


def test_an_upcoming_window_unreadable_for_one_answer_is_not_over(daemons, gce, hooks):
    """Review of issue 26: the window's drain ran; for one answer `window_start_time` could not
    be read (event_skipped), and the event completed at once (after-hooks, the undrain, as if
    the maintenance were over), to be detected and drained anew on the next answer. An
    unreadable notice is not over: it is kept as last read until a readable answer drops it."""
    cfg = gcp_config(daemons, gce, hooks)
    cfg["events"]["Redeploy"] = {"before": ["redeploy"], "after": ["after"]}
    daemon = daemons.start(cfg)
    start = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(hours=2)
    gce.upcoming(start.strftime("%Y-%m-%dT%H:%M:%SZ"))
    gce.attribute("nudge", "1")
    daemon.wait_log("hook_finished", hook="redeploy", timeout=10)
    gce.upcoming("2026-12-05 02:00 UTC")
    gce.attribute("nudge", "2")
    daemon.wait_log("event_skipped", timeout=10)
    gce.upcoming(start.strftime("%Y-%m-%dT%H:%M:%SZ"))
    asked = gce.gets("/upcoming-maintenance")
    gce.attribute("nudge", "3")
    wait_for(lambda: gce.gets("/upcoming-maintenance") > asked, what="a readable answer")
    assert not daemon.logs("event_status_changed"), "listed Started: taken as over"
    assert not daemon.logs("event_completed")
    assert len(daemon.logs("event_detected")) == 1
    assert hooks.order() == ["redeploy"]
    gce.upcoming(None)  # a readable answer without the window: now it is over
    gce.attribute("nudge", "4")
    daemon.wait_log("after_hooks_finished", timeout=10)
    assert hooks.order() == ["redeploy", "after"]
    assert env_of(hooks, "after")["SCHEDULED_EVENT_STAGE"] == "after"
    assert not daemons.defects()


def test_a_restart_keeps_the_not_before_counted_from_the_first_sighting(daemons, gce, hooks):
    """Suspected in issue 26, confirmed: a restart saw the notice anew, moving NotBefore later
    (the hooks run again believing they have more time). The saved event keeps it."""
    slow = hooks.make("slow", 'cat > "$OUT/slow.stdin"; sleep 30')
    cfg = gcp_config(daemons, gce, hooks)
    cfg["hooks"]["freeze"] = [{"command": [slow]}]
    daemon = daemons.start(cfg)
    gce.maintenance()
    daemon.wait_log("hook_started", hook="freeze", timeout=10)
    wait_for(
        lambda: (
            (hooks.out / "slow.stdin").stat().st_size if (hooks.out / "slow.stdin").exists() else 0
        )
    )
    first = not_before_of(json.loads((hooks.out / "slow.stdin").read_text()))
    time.sleep(3)
    daemon.signal(signal.SIGKILL)
    daemon.stop()
    for pid, _ in processes_mentioning(slow):  # systemd would end them with the unit's cgroup
        os.kill(pid, signal.SIGKILL)
    cfg["hooks"]["freeze"] = [{"command": [hooks.recorder("freeze")]}]
    again = daemons.start(cfg)
    again.wait_log("hook_finished", hook="freeze", timeout=10)
    assert not_before_of(stdin_of(hooks, "freeze")) == first


@pytest.fixture
def silent_resolver(tmp_path: Path) -> Any:
    """A mount namespace prefix whose resolver is a DNS server that never answers (options
    timeout:15 attempts:1: a lookup takes 15 s), and whose hosts file names only localhost."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    address = "127.{}.{}.{}".format(*(secrets.randbelow(240) + 2 for _ in range(3)))
    sock.bind((address, 53))
    sock.settimeout(0.2)
    stop = threading.Event()

    def swallow() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                sock.recvfrom(4096)

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    resolv, hosts = tmp_path / "resolv.conf", tmp_path / "hosts"
    resolv.write_text(f"nameserver {address}\noptions timeout:15 attempts:1\n")
    hosts.write_text("127.0.0.1 localhost\n")
    script = (
        f'mount --bind {resolv} /etc/resolv.conf && mount --bind {hosts} /etc/hosts && exec "$@"'
    )
    yield ("unshare", "-m", "sh", "-c", script, "sh")
    stop.set()
    thread.join(5)
    sock.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root")
def test_the_lookup_of_the_metadata_servers_name_is_within_the_request_deadline(
    daemons, gce, hooks, silent_resolver
):
    """Suspected in issue 26, confirmed: `metadata.google.internal` was looked up before the
    request's deadline began, by the C library's resolver with its own timeouts (here 15 s
    against a 3 s deadline). The lookup is within the deadline: the poll fails as a timeout
    after 3 s."""
    url = gce.url.replace("127.0.0.1", "metadata.google.internal")
    cfg = gcp_config(daemons, gce, hooks, vm_name=INSTANCE_NAME)
    cfg["metadata"] |= {"url": url, "timeout": 2, "first_call_timeout": 3}
    started = time.monotonic()
    daemon = daemons.start(cfg, ready=False, prefix=silent_resolver)
    failed = daemon.wait_log("poll_failed", timeout=30)
    took = time.monotonic() - started
    assert took < 8, f"the first poll failed {took:.1f} s after the start (deadline 3 s)"
    assert failed["kind"] == "timeout", failed
    assert "metadata.google.internal" in failed["error"]


def test_a_named_metadata_server_is_looked_up_and_answers(gce):
    """The lookup path (Google Cloud's URL names a host; Azure's and AWS's are addresses)."""
    client = gcp.GcpClient(gce.url.replace("127.0.0.1", "localhost"), 2, 5)
    try:
        assert client.fetch_vm_name() == INSTANCE_NAME
        gce.preempt()
        assert [e.event_type for e in client.fetch_document().events] == ["Preempt"]
    finally:
        client.close()


def test_a_migration_that_ends_while_the_daemon_is_down_is_over_not_cancelled(daemons, gce, hooks):
    """Found beside the restart's NotBefore: the saved notice gone at the restart was taken as
    withdrawn (undrain ran with SCHEDULED_EVENT_STAGE=cancelled). It ended: after-hooks."""
    daemon = daemons.start(gcp_config(daemons, gce, hooks))
    gce.maintenance()
    daemon.wait_log("hook_finished", hook="freeze", timeout=10)
    daemon.wait_log("approval_skipped", timeout=10)
    assert daemon.stop() == 0
    gce.maintenance("NONE")
    again = daemons.start(gcp_config(daemons, gce, hooks))
    again.wait_log("after_hooks_finished", timeout=10)
    assert hooks.order() == ["freeze", "after"]
    assert env_of(hooks, "after")["SCHEDULED_EVENT_STAGE"] == "after"


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


def test_not_before_counts_from_the_first_answer_even_when_the_poll_failed_after_it(gce):
    """Issue 26 #4, at the client: the instance answer showed the preemption, the GET beside it
    failed; the next poll (2 s later) asks without an ETag and NotBefore is the first answer's
    instant + 30 s, not the later sighting's."""
    client = gcp.GcpClient(gce.url, 2, 5)
    try:
        client.fetch_document()
        gce.fail_next(503, path="/instance/upcoming-maintenance")
        gce.preempt()
        answered = time.time()
        with pytest.raises(ImdsError):
            client.fetch_document()
        time.sleep(2)
        started = time.monotonic()
        (event,) = client.fetch_document().events
        assert time.monotonic() - started < 1, "asked at once, not by a long-poll"
        assert "last_etag" not in gce.requests[-2].query
        assert event.not_before is not None
        assert abs(event.not_before.timestamp() - (answered + 30)) < 0.5
    finally:
        client.close()


def test_an_unreadable_upcoming_window_is_skipped_and_the_rest_of_the_answer_used():
    """Issue 26 #5: the reason is kept, the preemption beside it is an event, and the answer
    differs from one without the bad notice (so event_skipped is logged)."""
    instance = b'{"preempted": "TRUE"}'
    for start in ("2026-12-05 02:00 UTC", "", 17, None, "9999-99-99T00:00:00Z"):
        upcoming = json.dumps({"window_start_time": start, "maintenance_status": "PENDING"})
        doc = gcp.document_of(instance, upcoming.encode(), vm_name="vm", now=NOW, seen=gcp.Seen())
        assert [e.event_type for e in doc.events] == ["Preempt"]
        (reason,) = doc.skipped
        assert reason.startswith("upcoming-maintenance: window_start_time is not a time")
        clean = gcp.document_of(instance, None, vm_name="vm", now=NOW, seen=gcp.Seen())
        assert clean.incarnation != doc.incarnation


def test_each_migration_of_the_same_kind_that_ends_is_listed_started_once():
    """Issue 26 #12, in the mapping: the second migration (same id) ends Started too."""
    seen = gcp.Seen()
    on, off = (
        b'{"maintenanceEvent": "MIGRATE_ON_HOST_MAINTENANCE"}',
        b'{"maintenanceEvent": "NONE"}',
    )
    for n in range(3):
        last = gcp.document_of(on, None, vm_name="vm", now=NOW + n, seen=seen)
        assert [e.status for e in last.events] == [SCHEDULED]
        ended = gcp.document_of(off, None, vm_name="vm", now=NOW + n, seen=seen)
        gcp.notice_over(last, ended, seen)
        once = gcp.document_of(off, None, vm_name="vm", now=NOW + n, seen=seen)
        assert [e.status for e in once.events] == [STARTED], f"migration {n + 1}"
        gone = gcp.document_of(off, None, vm_name="vm", now=NOW + n, seen=seen)
        gcp.notice_over(once, gone, seen)
        assert gone.events == ()
        assert gcp.document_of(off, None, vm_name="vm", now=NOW + n, seen=seen).events == ()


def test_a_migration_shown_again_in_the_answer_right_after_one_ended_is_listed_started_at_its_end():
    """Found by the property below: a notice of the same kind shown again in the answer right
    after its predecessor's "Started once" was taken as that one still ending, and its own end
    was never listed Started (cancelled-hooks, as #12)."""
    on, off = (
        b'{"maintenanceEvent": "MIGRATE_ON_HOST_MAINTENANCE"}',
        b'{"maintenanceEvent": "NONE"}',
    )
    seen = gcp.Seen()
    first = gcp.document_of(on, None, vm_name="vm", now=NOW, seen=seen)
    ended = gcp.document_of(off, None, vm_name="vm", now=NOW + 1, seen=seen)
    gcp.notice_over(first, ended, seen)
    once = gcp.document_of(off, None, vm_name="vm", now=NOW + 1, seen=seen)
    assert [e.status for e in once.events] == [STARTED]
    second = gcp.document_of(on, None, vm_name="vm", now=NOW + 2, seen=seen)
    gcp.notice_over(once, second, seen)
    assert [(e.status, e.not_before.timestamp()) for e in second.events] == [
        (SCHEDULED, NOW + 62)
    ], "seen anew"
    over = gcp.document_of(off, None, vm_name="vm", now=NOW + 3, seen=seen)
    gcp.notice_over(second, over, seen)
    last = gcp.document_of(off, None, vm_name="vm", now=NOW + 3, seen=seen)
    assert [(e.status, e.not_before.timestamp()) for e in last.events] == [(STARTED, NOW + 62)]


def test_a_moved_window_keeps_its_id_and_moves_its_not_before():
    """Issue 26 #13, in the mapping."""
    seen = gcp.Seen()
    docs = [
        gcp.document_of(
            None,
            json.dumps({"window_start_time": start}).encode(),
            vm_name="vm",
            now=NOW,
            seen=seen,
        )
        for start in ("2027-02-01T02:00:00Z", "2027-02-08T02:00:00Z")
    ]
    gcp.notice_over(docs[0], docs[1], seen)
    assert not seen.ending, "nothing ended"
    (first,), (moved,) = (d.events for d in docs)
    assert first.event_id == moved.event_id == gcp.UPCOMING_ID
    assert (first.status, moved.status) == (SCHEDULED, SCHEDULED)
    assert moved.not_before == dt.datetime(2027, 2, 8, 2, tzinfo=dt.timezone.utc)


def test_recall_gives_back_the_first_sighting_of_a_notice_still_shown():
    """The restart half of the suspected defect, in the client: a saved event's NotBefore."""
    saved = gcp.document_of(b'{"preempted": "TRUE"}', None, vm_name="vm", now=NOW, seen=gcp.Seen())
    client = gcp.GcpClient("http://127.0.0.1:9/computeMetadata/v1", 2, 5)
    client.recall(saved.events)
    assert client._seen.first == {"PREEMPTED": NOW}


UNREADABLE_INSTANCE = (
    b"<html>Service Unavailable</html>",
    b"[]",
    b"",
    b'{"maintenanceEvent": "SOMETHING_NEW", "preempted": "TRUE"}',
    b'{"preempted": "TRUE"}',  # no maintenanceEvent at all
)


def timing(doc: Any) -> set[tuple[str, str, Any]]:
    return {(e.event_id, e.status, e.not_before) for e in doc.events}


def test_an_instance_answer_that_cannot_say_keeps_its_notices_as_last_read():
    """Review of issue 26: an unreadable answer (or one whose maintenanceEvent is missing or
    unknown) is not the end of the notices it cannot see: they stay listed with their first
    sighting (NotBefore not moved), Started once that has passed; a readable answer ends them."""
    on = b'{"maintenanceEvent": "MIGRATE_ON_HOST_MAINTENANCE", "preempted": "TRUE"}'
    for garbled in UNREADABLE_INSTANCE:
        seen = gcp.Seen()
        shown = gcp.document_of(on, None, vm_name="vm", now=NOW, seen=seen)
        kept = gcp.document_of(garbled, None, vm_name="vm", now=NOW + 5, seen=seen)
        gcp.notice_over(shown, kept, seen)
        assert timing(kept) == timing(shown), garbled
        assert not seen.ending, garbled
        late = gcp.document_of(garbled, None, vm_name="vm", now=NOW + 61, seen=seen)
        assert {e.event_type: e.status for e in late.events} == {
            "Freeze": STARTED, "Preempt": STARTED
        }, "past its notice it has started, as a readable answer would say"  # fmt: skip
        again = gcp.document_of(on, None, vm_name="vm", now=NOW + 62, seen=seen)
        assert {e.event_id: e.not_before for e in again.events} == {
            e.event_id: e.not_before for e in shown.events
        }, "the first sighting survived"
        off = b'{"maintenanceEvent": "NONE", "preempted": "FALSE"}'
        over = gcp.document_of(off, None, vm_name="vm", now=NOW + 63, seen=seen)
        gcp.notice_over(again, over, seen)
        assert set(seen.ending) == {e.event_id for e in shown.events}, "a readable answer ends"


def test_an_upcoming_window_that_cannot_be_read_is_kept_as_last_read():
    """Review of issue 26: a window whose `window_start_time` cannot be read (or an answer that
    is not JSON) is skipped with its reason, and the window last read stays listed; an answer
    without a window (`{}`, or 404) ends it."""
    window = json.dumps({"window_start_time": "2027-02-01T02:00:00Z"}).encode()
    garbled = (
        json.dumps({"window_start_time": "2026-12-05 02:00 UTC"}).encode(),
        b"<html>Service Unavailable</html>",
    )
    for bad in garbled:
        for gone in (b"{}", None):
            seen = gcp.Seen()
            shown = gcp.document_of(b"{}", window, vm_name="vm", now=NOW, seen=seen)
            kept = gcp.document_of(b"{}", bad, vm_name="vm", now=NOW, seen=seen)
            gcp.notice_over(shown, kept, seen)
            assert kept.events == shown.events
            assert len(kept.skipped) == 1
            assert not seen.ending
            over = gcp.document_of(b"{}", gone, vm_name="vm", now=NOW, seen=seen)
            gcp.notice_over(kept, over, seen)
            assert set(seen.ending) == {gcp.UPCOMING_ID}


def test_after_a_restart_an_unreadable_first_answer_keeps_the_saved_notices():
    """The saved events stand for the last answer: an unreadable first one does not end them."""
    saved = gcp.document_of(b'{"preempted": "TRUE"}', None, vm_name="vm", now=NOW, seen=gcp.Seen())
    client = gcp.GcpClient("http://127.0.0.1:9/computeMetadata/v1", 2, 5)
    client.recall(saved.events)
    doc = gcp.document_of(b"<html>", None, vm_name="vm", now=NOW + 3, seen=client._seen)
    gcp.notice_over(client._last, doc, client._seen)
    assert doc.events == saved.events
    assert not client._seen.ending


ANSWERS = (
    b'{"maintenanceEvent": "MIGRATE_ON_HOST_MAINTENANCE", "preempted": "TRUE"}',
    b'{"maintenanceEvent": "TERMINATE_ON_HOST_MAINTENANCE", "preempted": "FALSE"}',
    b'{"maintenanceEvent": "NONE", "preempted": "TRUE"}',
    b'{"maintenanceEvent": "NONE", "preempted": "FALSE"}',
    *UNREADABLE_INSTANCE,
)


NOT_JSON = (b"<html>Service Unavailable</html>", b"[]", b"")


def readable_documents(answers: list[tuple[int, bytes]]) -> list[tuple[Any, ...]]:
    """The events each readable answer gives, in turn, as the client keeps `Seen`."""
    seen, last, out = (
        gcp.Seen(),
        gcp.document_of(None, None, vm_name="vm", now=NOW, seen=gcp.Seen()),
        [],
    )
    for at, body in answers:
        doc = gcp.document_of(body, None, vm_name="vm", now=NOW + at, seen=seen)
        gcp.notice_over(last, doc, seen)
        if seen.ending:  # listed Started once in the next answer, as the client asks at once
            doc = gcp.document_of(body, None, vm_name="vm", now=NOW + at, seen=seen)
        if body not in NOT_JSON:
            out.append(doc.events)
        last = doc
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=14))
def test_an_answer_that_is_not_json_changes_nothing_the_next_readable_ones_say(answers):
    """Any run of instance answers: those that are not JSON (or not an object) are as if they
    had never come: every readable answer gives the same events (first sightings, notices
    that end listed Started once) as in the run without them."""
    timed = [(n * 7, body) for n, body in enumerate(answers)]
    without = [(at, body) for at, body in timed if body not in NOT_JSON]
    assert readable_documents(timed) == readable_documents(without), answers


@settings(max_examples=300, deadline=None)
@given(
    st.none() | st.text(max_size=40) | st.integers() | st.floats(),
    st.sampled_from(["PENDING", "ONGOING", None, 3]),
)
def test_any_upcoming_window_is_an_event_or_a_reason_never_an_exception(start, status):
    body = json.dumps({"window_start_time": start, "maintenance_status": status}).encode()
    doc = gcp.document_of(b"{}", body, vm_name="vm", now=NOW, seen=gcp.Seen())
    assert len(doc.events) + len(doc.skipped) == 1


@settings(max_examples=300, deadline=None)
@given(st.none() | st.binary(max_size=300), st.none() | st.binary(max_size=300))
def test_any_bytes_are_a_document_never_an_exception(instance, upcoming):
    gcp.document_of(instance, upcoming, vm_name="vm", now=NOW, seen=gcp.Seen())


def test_simulate_provider_gcp_serves_the_metadata_server_and_plays_its_notices(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduledeventsd", "simulate", "--provider", "gcp",
         "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).parents[2],
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


def test_a_window_moved_days_later_while_the_drain_runs_undrains_once_it_ended(daemons, gce, hooks):
    """Google moves the upcoming window 3 days later while the before-hook (drain) still runs,
    and says nothing more: once the drain ended, the cancelled-hook (undrain) runs. Before: the
    move was taken while the hook ran, the unchanged answer was not judged again, and the node
    stayed drained for the 3 days until the maintenance."""
    cfg = gcp_config(daemons, gce, hooks)
    cfg["hooks"]["redeploy"] = [{"command": [hooks.recorder("redeploy", "sleep 2")]}]
    daemon, now = window_in_30_minutes(daemons, gce, cfg)
    wait_for(lambda: hooks.order() == ["redeploy"], 10, "the drain to start")
    moved = now + dt.timedelta(days=3)
    announce(gce, moved, "2")
    daemon.wait_log("hook_finished", hook="redeploy", timeout=10)
    cancelled = daemon.wait_log("event_cancelled", timeout=10)
    assert cancelled["moved_s"] == 3 * 86400 - 30 * 60
    daemon.wait_log("hook_finished", hook="cancelled", timeout=10)
    assert not_before_of(stdin_of(hooks, "cancelled")) == moved.timestamp()
    assert hooks.order() == ["redeploy", "cancelled"]
