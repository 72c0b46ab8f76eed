"""The observer on made-up engine states: health per `unhealthy_from`, the timeline of an event,
and when `status` calls the daemon unhealthy. No process, no clock."""

from __future__ import annotations

import dataclasses

import pytest

from scheduledeventsd import engine
from scheduledeventsd.config import HealthFrom
from scheduledeventsd.engine import DocumentFetched, Phase, PollFailed, Tick, Tracked
from scheduledeventsd.model import Document
from scheduledeventsd.observe.observer import BLIND_AFTER, Observer, problems, unhealthy
from tests.engine.test_engine import config, event

UNHEALTHY = {
    HealthFrom.DETECTED: {
        Phase.UNHANDLED, Phase.MISSED, Phase.WAITING, Phase.QUEUED, Phase.GATED, Phase.DRAINING,
        Phase.RUNNING, Phase.INTERRUPTED, Phase.REBOOTED,
        Phase.ENDING, Phase.COORDINATING, Phase.APPROVING, Phase.APPROVED, Phase.NOT_APPROVED,
        Phase.HOOKS_FAILED, Phase.DONE, Phase.AFTER,
    },
    HealthFrom.HOOKS_STARTED: {  # a Pacemaker node's drain is the start of its preparation
        Phase.DRAINING, Phase.RUNNING, Phase.INTERRUPTED, Phase.REBOOTED, Phase.ENDING,
        Phase.COORDINATING,
        Phase.APPROVING, Phase.APPROVED, Phase.NOT_APPROVED, Phase.HOOKS_FAILED, Phase.DONE,
        Phase.AFTER,
    },
    HealthFrom.HOOKS_DONE: {  # rebooted: prepared before a boot, not yet judged; out as it was
        Phase.REBOOTED, Phase.ENDING, Phase.COORDINATING, Phase.APPROVING, Phase.APPROVED,
        Phase.NOT_APPROVED, Phase.HOOKS_FAILED, Phase.DONE, Phase.AFTER,
    },
}  # fmt: skip


def state_with(*tracked):
    return dataclasses.replace(
        engine.initial(config()), events={t.event.event_id: t for t in tracked}
    )


@pytest.mark.parametrize("since", list(HealthFrom))
@pytest.mark.parametrize("phase", list(Phase))
def test_health_is_503_exactly_in_the_phases_its_setting_names(since, phase):
    state = state_with(Tracked(event(), phase))
    assert (unhealthy(state, since) is not None) == (phase in UNHEALTHY[since])


def test_the_event_with_the_nearest_not_before_is_named():
    early = event("E1")
    late = dataclasses.replace(event("E2"), not_before=early.not_before.replace(year=2031))
    state = state_with(Tracked(late, Phase.RUNNING), Tracked(early, Phase.WAITING))
    assert unhealthy(state, HealthFrom.DETECTED).event_id == "E1"


def test_the_timeline_records_each_moment_once_with_the_wall_clock():
    watcher = Observer(started_wall=1000.0)
    steps = [Phase.RUNNING, Phase.APPROVING, Phase.APPROVED, Phase.AFTER, Phase.OVER]
    before = state_with()
    for wall, phase in zip((1001.0, 1005.0, 1006.0, 1100.0, 1102.0), steps):
        after = state_with(Tracked(event(), phase))
        watcher.observe(before, Tick(), after, wall)
        before = after
    doc = watcher.document(before, 1200.0, HealthFrom.DETECTED)
    (shown,) = doc["events"]
    assert shown["detected_at"] == "1970-01-01T00:16:41.000Z"
    assert shown["hooks_started_at"] == "1970-01-01T00:16:41.000Z"
    assert shown["hooks_done_at"] == "1970-01-01T00:16:45.000Z"
    assert shown["approved_at"] == "1970-01-01T00:16:46.000Z"
    assert shown["after_hooks_at"] == "1970-01-01T00:18:22.000Z"
    assert doc["health"]["ok"]


def test_the_last_successful_poll_is_the_documents_fetch_time():
    watcher = Observer(started_wall=1000.0)
    state = state_with()
    watcher.observe(state, DocumentFetched(Document(1, ()), wall=1010.5), state, 1011.0)
    failed = dataclasses.replace(
        state, poll=dataclasses.replace(state.poll, last="timeout (1 failures)")
    )
    watcher.observe(state, PollFailed("timeout", "x"), failed, 1012.0)
    doc = watcher.document(failed, 1013.0, HealthFrom.DETECTED)
    assert doc["poll"]["last_ok_unix"] == 1010.5
    assert doc["poll"]["last"] == "timeout (1 failures)"


def doc(**fields):
    base = {
        "written_at_unix": 10_000.0,
        "started_at_unix": 1_000.0,
        "poll": {"last_ok_unix": 9_999.0},
        "events": [],
    }
    return {**base, **fields}


def test_healthy_status_has_no_problems():
    assert problems(doc(), now=10_001.0) == []


def test_imds_unreachable_for_over_five_minutes_is_a_problem():
    blind = doc(poll={"last_ok_unix": 10_000.0 - BLIND_AFTER - 1})
    (found,) = problems(blind, now=10_000.0)
    assert found.startswith("IMDS unreachable: 301 s since the last successful poll")
    assert problems(doc(poll={"last_ok_unix": 10_000.0 - BLIND_AFTER + 1}), now=10_000.0) == []


def test_never_polled_since_a_start_five_minutes_ago_is_a_problem():
    never = doc(poll={"last_ok_unix": None}, started_at_unix=10_000.0 - 400)
    (found,) = problems(never, now=10_000.0)
    assert "since the start, and no poll yet" in found


def test_a_stale_status_file_means_the_daemon_is_not_running():
    (found, *_) = problems(doc(), now=10_000.0 + BLIND_AFTER + 10)
    assert "is the daemon running?" in found


def test_a_failed_hook_on_a_pending_event_is_a_problem_but_not_once_it_is_over():
    failed = {"event_type": "Reboot", "event_id": "E1", "phase": "hooks_failed"}
    assert problems(doc(events=[failed]), now=10_000.0) == [
        "a hook failed for Reboot E1, which is still pending"
    ]
    assert problems(doc(events=[dict(failed, phase="over")]), now=10_000.0) == []


def test_a_mark_of_ours_that_fails_to_come_off_is_shown_and_a_problem_even_unconfigured():
    """Issue 26 #8b: `cluster.pacemaker` reloaded away, the restore failing: `status`
    still shows the mark and exits 1."""
    from scheduledeventsd.config import DrainMethod  # noqa: PLC0415
    from scheduledeventsd.observe.report import status  # noqa: PLC0415

    mark = engine.ClusterMark(DrainMethod.HEALTH, "#health-scheduledevents")
    state = dataclasses.replace(state_with(), cluster_mark=mark, restore_error="exit 102")
    shown = Observer(10_000.0).document(state, 10_000.0, HealthFrom.DETECTED)
    cluster = shown["pacemaker"]
    assert cluster["marked"] == {"method": "health", "attribute": "#health-scheduledevents"}
    (found,) = problems(shown, now=10_000.0)
    assert found.startswith("cluster_restore_failed: this node is still marked")
    assert "pacemaker: not configured; marked by this daemon: health" in status(
        shown, 10_000.0, [found]
    )
