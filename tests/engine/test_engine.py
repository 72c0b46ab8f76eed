"""The pure state machine with a fake clock: every rule, timer, backoff and retry, no I/O."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from scheduledeventsd import engine
from scheduledeventsd.config import ApprovePolicy, Config, EventRule, Metadata, UserEvents
from scheduledeventsd.engine import (
    ApprovalFailed,
    ApprovalSent,
    Boot,
    CancelRuns,
    DocumentFetched,
    Exit,
    Fetch,
    HooksFinished,
    NameResolved,
    Notify,
    Outcome,
    Persist,
    Persisted,
    Phase,
    PollFailed,
    PostApproval,
    Record,
    Reloaded,
    ResolveName,
    SpawnHooks,
    StopRequested,
    Tick,
    Tracked,
    WakeAt,
)
from scheduledeventsd.engine.state import Events
from scheduledeventsd.model import Document, Event

VM = "vm-a"
EVENTS = {
    "Reboot": EventRule(("drain", "checkpoint")),
    "Freeze": EventRule(()),
    "Preempt": EventRule(("shutdown",)),
}


def config(**overrides):
    base = Config(
        metadata=Metadata(poll_interval=1.0, timeout=5.0, first_call_timeout=150.0),
        vm_name=VM,
        state_dir=Path("/state"),
        approve=ApprovePolicy.SOLE,
        hooks={},
        events=EVENTS,
        shutdown_grace=10.0,
    )
    return dataclasses.replace(base, **overrides)


def event(event_id="E1", event_type="Reboot", status="Scheduled", resources=(VM,)):
    return Event(
        event_id,
        event_type,
        status,
        "VirtualMachine",
        tuple(resources),
        dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
    )


def doc(*events, incarnation=2):
    return Document(incarnation, tuple(events))


class Machine:
    """Drives engine.step with a fake monotonic clock and keeps every effect. Every step leaves
    the state's events an `Events` (a plain dict would drop the kept list of ours: slower, and a
    path the shortcuts' test does not compare)."""

    def __init__(
        self, cfg=None, *, watchdog_usec=None, loaded=None, problem="", now=100.0, boot="boot-1"
    ):
        self.now = now
        self.state = engine.initial(cfg or config(), watchdog_usec, strict=True)
        self.effects = self.send(Boot(loaded or {}, problem, boot))

    def send(self, message, at=None):
        if at is not None:
            assert at >= self.now, "the fake clock never goes back"
            self.now = at
        self.state, effects = engine.step(self.state, message, self.now)
        assert type(self.state.events) is Events, f"{type(message).__name__}: a plain dict"
        self.effects = list(effects)
        return self.effects

    def tick(self, at):
        return self.send(Tick(), at=at)

    def fetched(self, document, at=None):
        return self.send(DocumentFetched(document), at=at)

    def phase(self, event_id="E1"):
        return self.state.events[event_id].phase

    def wake(self):
        (wake,) = [e for e in self.effects if isinstance(e, WakeAt)]
        return wake.at


def logs(effects, name=None):
    found = [e for e in effects if isinstance(e, Record)]
    return [e for e in found if e.name == name] if name else [e.name for e in found]


def of(effects, kind):
    return [e for e in effects if isinstance(e, kind)]


# ---- start ---------------------------------------------------------------------------------


def test_boot_with_a_configured_name_is_ready_and_fetches_at_once():
    m = Machine()
    assert logs(m.effects)[:2] == ["daemon_starting", "vm_name"]
    ready = of(m.effects, Notify)[0].fields
    assert ready["READY"] == "1"
    assert f"for {VM}" in ready["STATUS"]
    assert of(m.effects, Fetch)


def test_boot_keeps_runs_cut_off_by_a_stop_as_interrupted_and_runs_them_again():
    loaded = {
        "E1": Tracked(event(), Phase.RUNNING),
        "E2": Tracked(event("E2"), Phase.APPROVED),
    }
    m = Machine(loaded=loaded)
    assert logs(m.effects, "hooks_interrupted")[0].fields["event_id"] == "E1"
    assert m.phase("E1") is Phase.INTERRUPTED
    assert of(m.effects, Persist)[0].events["E1"].phase is Phase.INTERRUPTED
    m.fetched(doc(event(), event("E2")))
    assert [s.event.event_id for s in of(m.effects, SpawnHooks)] == ["E1"]
    assert m.phase("E1") is Phase.RUNNING


def test_an_unreadable_state_is_reported_and_shown_as_degraded_but_events_are_handled():
    m = Machine(problem="/state/state.json: cannot read: Permission denied")
    assert logs(m.effects, "state_degraded")
    assert "DEGRADED" in of(m.effects, Notify)[0].fields["STATUS"]
    m.fetched(doc(event()))
    assert of(m.effects, SpawnHooks)


def test_without_a_configured_name_imds_is_asked_before_polling():
    m = Machine(config(vm_name=None))
    assert of(m.effects, ResolveName)
    assert not of(m.effects, Fetch)
    assert not m.state.ready
    m.send(NameResolved("vm-x", "imds"), at=101)
    assert logs(m.effects, "vm_name")[0].fields == {"vm_name": "vm-x", "source": "imds"}
    assert of(m.effects, Fetch)
    assert of(m.effects, Notify)[0].fields["READY"] == "1"


def test_the_hostname_stands_in_and_imds_is_asked_again_at_2_4_8_s_up_to_60():
    m = Machine(config(vm_name=None))
    m.send(NameResolved("host", "hostname", "timeout"), at=100)
    assert logs(m.effects, "vm_name_fallback")[0].fields["retry_in_s"] == 2.0
    retries = []
    for _ in range(8):
        due = m.state.name_failures.retry_at
        retries.append(due - m.now)
        assert not of(m.tick(due - 0.01), ResolveName)
        assert of(m.tick(due), ResolveName)
        m.send(NameResolved("host", "hostname", "timeout"))
    assert retries == [2, 4, 8, 16, 32, 60, 60, 60]
    assert logs(m.effects, "vm_name_fallback") == [], "the fallback is logged once"


def test_learning_the_real_name_judges_not_ours_events_again():
    m = Machine(config(vm_name=None))
    m.send(NameResolved("host", "hostname", "timeout"))
    m.fetched(doc(event(resources=("vm-real",))), at=101)
    assert m.phase() is Phase.NOT_OURS
    m.send(NameResolved("vm-real", "imds"), at=102.5)
    assert "E1" not in m.state.events
    assert m.state.incarnation is None
    m.fetched(doc(event(resources=("vm-real",))), at=103)
    assert of(m.effects, SpawnHooks)


# ---- documents and hooks -------------------------------------------------------------------


def test_a_new_scheduled_event_for_us_runs_its_hooks_in_configured_order_as_run_1():
    m = Machine()
    m.fetched(doc(event()), at=100.1)
    assert logs(m.effects) == ["document_changed", "event_detected"]
    (spawn,) = of(m.effects, SpawnHooks)
    assert (spawn.run, spawn.hooks, spawn.vm_name, spawn.incarnation) == (
        1,
        ("drain", "checkpoint"),
        VM,
        2,
    )
    assert m.phase() is Phase.RUNNING
    kinds = [type(e) for e in m.effects]
    assert kinds.index(Persist) < kinds.index(SpawnHooks), "RUNNING is on disk before hooks start"


def test_an_approval_is_posted_before_the_state_write_of_the_same_step():
    m = Machine()
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.SUCCEEDED), at=101)
    kinds = [type(e) for e in m.effects]
    assert kinds.index(PostApproval) < kinds.index(Persist)


def test_the_same_incarnation_again_changes_nothing_and_writes_nothing():
    m = Machine()
    m.fetched(doc(event()), at=100.1)
    effects = m.fetched(doc(event()), at=101.1)
    assert logs(effects) == []
    assert not of(effects, SpawnHooks)
    assert not of(effects, Persist)


def test_events_not_naming_us_are_ignored_once_and_never_written():
    m = Machine()
    m.fetched(doc(event(resources=("vm-b",))), at=100.1)
    assert logs(m.effects) == ["document_changed", "event_ignored"]
    assert not of(m.effects, Persist)
    assert logs(m.fetched(doc(event(resources=("vm-b",)), incarnation=3), at=101.1)) == [
        "document_changed"
    ]


def test_the_state_written_holds_only_our_events_and_no_process_bound_fields():
    m = Machine()
    m.fetched(doc(event(), event("X", resources=("vm-b",))))
    (persist,) = of(m.effects, Persist)
    assert set(persist.events) == {"E1"}, "events for other VMs are never written"
    assert persist.events["E1"].run is None


def test_matching_the_vm_name_is_case_insensitive():
    m = Machine()
    m.fetched(doc(event(resources=("VM-A",))))
    assert m.phase() is Phase.RUNNING


def test_an_event_first_seen_started_is_missed_and_never_approved():
    m = Machine()
    m.fetched(doc(event(status="Started")))
    assert logs(m.effects)[-2:] == ["event_detected", "event_missed"]
    assert not of(m.effects, SpawnHooks)
    assert not of(m.effects, PostApproval)


def test_unconfigured_type_is_left_alone_and_empty_hooks_approve_at_once():
    m = Machine()
    m.fetched(doc(event("T", "Terminate"), event("F", "Freeze")))
    assert m.phase("T") is Phase.UNHANDLED
    assert m.phase("F") is Phase.APPROVING
    assert [p.event.event_id for p in of(m.effects, PostApproval)] == ["F"]


def test_success_approves_a_sole_event_once_and_failure_does_not():
    m = Machine()
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.SUCCEEDED), at=101)
    assert [p.event.event_id for p in of(m.effects, PostApproval)] == ["E1"]
    assert not of(m.tick(101.5), PostApproval), "one POST in flight at a time"
    m.send(ApprovalSent("E1", 0.01), at=101.6)
    assert logs(m.effects, "event_approved")[0].fields["attempts"] == 1
    assert m.phase() is Phase.APPROVED

    f = Machine()
    f.fetched(doc(event()))
    f.send(HooksFinished(1, Outcome.FAILED))
    assert logs(f.effects) == ["event_not_approved"]
    assert f.phase() is Phase.HOOKS_FAILED
    assert not of(f.effects, PostApproval)


def test_hooks_that_could_not_run_at_all_say_why_in_the_records():
    """A run that ends without any command's result (no thread for it, a defect while starting
    its commands: a lone surrogate in the event's text was one) logged only `hooks_failed`."""
    why = "cannot start a thread: can't start new thread"
    m = Machine(config(events={"Reboot": EventRule(("drain",), ("undrain",), ("undrain",))}))
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.FAILED, why))
    (refused,) = logs(m.effects, "event_not_approved")
    assert refused.fields["error"] == why
    m.fetched(doc(incarnation=3), at=101)  # withdrawn: its cancelled-hooks run, and cannot
    (after,) = [e.run for e in of(m.effects, SpawnHooks)]
    m.send(HooksFinished(after, Outcome.FAILED, why))
    (failed,) = logs(m.effects, "after_hooks_failed")
    assert failed.fields["error"] == why


@pytest.mark.parametrize(
    ("policy", "approved"),
    [(ApprovePolicy.SOLE, False), (ApprovePolicy.ALWAYS, True), (ApprovePolicy.NEVER, False)],
)
def test_the_approve_policy_decides_for_an_event_shared_with_other_vms(policy, approved):
    m = Machine(config(approve=policy))
    m.fetched(doc(event(resources=(VM, "vm-b", "vm-c"))))
    m.send(HooksFinished(1, Outcome.SUCCEEDED))
    assert bool(of(m.effects, PostApproval)) is approved
    if not approved:
        (skipped,) = logs(m.effects, "approval_skipped")
        assert policy.value in str(skipped.fields["reason"])


def test_an_event_that_started_while_hooks_ran_is_not_approved():
    m = Machine()
    m.fetched(doc(event()))
    m.fetched(doc(event(status="Started"), incarnation=3), at=101)
    assert logs(m.effects) == ["document_changed", "event_status_changed"]
    m.send(HooksFinished(1, Outcome.SUCCEEDED))
    assert logs(m.effects) == ["approval_not_needed"]
    assert not of(m.effects, PostApproval)


def test_a_failed_approval_is_retried_at_half_1_2_4_8_8_s_and_logged_once_per_change():
    m = Machine()
    m.fetched(doc(event("F", "Freeze")), at=100)
    delays, logged = [], 0
    for _ in range(6):
        m.send(ApprovalFailed("F", "http_500", "HTTP 500"))
        logged += len(logs(m.effects, "approval_failed"))
        due = m.state.approvals.failures["F"].retry_at
        delays.append(due - m.now)
        assert m.wake() <= due
        assert not of(m.tick(due - 0.01), PostApproval)
        assert of(m.tick(due), PostApproval)
    assert delays == [0.5, 1, 2, 4, 8, 8]
    assert logged == 1
    m.send(ApprovalFailed("F", "timeout", "timed out"))
    assert logs(m.effects, "approval_failed"), "a change of error is logged"
    m.tick(m.state.approvals.failures["F"].retry_at)
    m.send(ApprovalSent("F"))
    assert logs(m.effects, "event_approved")[0].fields["attempts"] == 8


def test_a_pending_approval_stops_when_the_event_starts():
    m = Machine()
    m.fetched(doc(event("F", "Freeze")))
    m.send(ApprovalFailed("F", "http_500", "x"))
    m.fetched(doc(event("F", "Freeze", status="Started"), incarnation=3), at=101)
    assert m.phase("F") is Phase.DONE
    assert not of(m.tick(200), PostApproval)


def test_events_that_leave_the_document_are_completed_and_forgotten():
    m = Machine()
    m.fetched(doc(event("F", "Freeze"), event("X", resources=("x",))))
    m.send(ApprovalSent("F"))
    m.fetched(doc(incarnation=3), at=101)
    assert logs(m.effects) == ["document_changed", "event_completed", "event_gone"]
    assert m.state.events == {}
    assert of(m.effects, Persist)[0].events == {}


def test_a_run_whose_event_left_and_came_back_cannot_approve_it():
    """The stopped run's result (exit 0 or not) approves nothing; the event that came back is
    judged anew once that run has ended, and only its new run's success approves it."""
    m = Machine()
    m.fetched(doc(event()))
    m.fetched(doc(incarnation=3), at=101)
    assert logs(m.effects, "event_gone_while_hooks_running")
    assert of(m.effects, CancelRuns)[0].runs == (1,)
    assert m.phase() is Phase.ENDING
    m.fetched(doc(event(), incarnation=4), at=102)
    assert not of(m.effects, SpawnHooks), "not while its first run is being stopped"
    m.send(HooksFinished(1, Outcome.SUCCEEDED), at=103)
    assert not of(m.effects, PostApproval)
    assert "E1" not in m.state.events
    m.fetched(doc(event(), incarnation=4), at=104)
    assert of(m.effects, SpawnHooks)[0].run == 2
    m.send(HooksFinished(2, Outcome.SUCCEEDED), at=105)
    assert of(m.effects, PostApproval)


def test_a_cancelled_run_is_interrupted_on_disk_and_runs_again_while_still_scheduled():
    """At least once: before-hooks that did not finish are never taken as done."""
    m = Machine()
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.CANCELLED), at=101)
    assert m.phase() is Phase.INTERRUPTED
    assert of(m.effects, Persist)[0].events["E1"].phase is Phase.INTERRUPTED
    assert not of(m.effects, PostApproval)
    assert of(m.fetched(doc(event(), incarnation=3), at=102), SpawnHooks)[0].run == 2


# ---- polling -------------------------------------------------------------------------------


def test_polls_are_scheduled_start_to_start_and_a_slow_one_skips_ticks():
    """The next poll is ordered with the answer, for its instant: the loop never wakes just to
    start one."""
    m = Machine(now=100.0)
    assert of(m.effects, Fetch) == [Fetch(100.0)]
    m.fetched(doc(), at=100.3)
    assert of(m.effects, Fetch) == [Fetch(101.0)]
    assert m.wake() > 101.0, "no wake for the poll: the lane carries it out at its instant"
    assert not of(m.tick(101.0), Fetch), "ordered once"
    m.fetched(doc(), at=103.4)  # took 2.4 s: ticks 102 and 103 are skipped, not made up
    assert of(m.effects, Fetch) == [Fetch(104.0)]


def test_a_quiet_answer_orders_the_next_poll_as_the_whole_step_would():
    """The same incarnation, on time, no timer due: the shortcut's state and effects are the
    full step's (here, and in every history of test_promises)."""
    m = Machine(now=100.0)
    m.send(DocumentFetched(doc(event()), WALL0), at=100.2)
    for at in (101.2, 102.3, 103.25):
        quick = engine.step(m.state, DocumentFetched(doc(event()), WALL0 + at - 100), at)
        assert quick == engine.full_step(
            m.state, DocumentFetched(doc(event()), WALL0 + at - 100), at
        )
        assert [type(e) for e in quick[1]] == [Fetch, WakeAt]
        m.state, m.now = quick[0], at


def test_a_reload_takes_back_a_poll_ordered_for_later_and_polls_at_once():
    m = Machine(config(metadata=Metadata(poll_interval=20.0)), now=100.0)
    m.fetched(doc(), at=100.2)
    assert of(m.effects, Fetch) == [Fetch(120.0)]
    m.send(Reloaded(config(metadata=Metadata(poll_interval=1.0))), at=101.0)
    assert of(m.effects, Fetch) == [Fetch(101.0)], "the lane replaces the order for 120"
    assert 120.0 not in m.state.sent, "the poll taken back no longer counts against IMDS' limit"


def test_only_one_fetch_is_in_flight_however_long_it_takes():
    m = Machine()
    for t in (101, 102, 105):
        assert not of(m.tick(t), Fetch)
    m.fetched(doc(), at=105.5)
    assert len(of(m.effects, Fetch)) == 1


def test_poll_backoff_doubles_from_the_interval_and_is_capped_at_2_s():
    m = Machine(now=100.0)
    delays = []
    for _ in range(7):
        m.send(PollFailed("http_500", "HTTP 500", 500))
        delays.append(m.state.poll.next_at - m.now)
        m.tick(m.state.poll.next_at)
    assert delays == [1, 2, 2, 2, 2, 2, 2]
    started = m.now
    m.fetched(doc(event()))
    assert of(m.effects, SpawnHooks), "IMDS back: the event is seen on the very next answer"
    assert m.now - started == 0
    assert logs(m.effects, "poll_recovered")[0].fields["failures"] == 7


def test_a_slow_poll_interval_is_its_own_backoff_cap():
    m = Machine(config(metadata=Metadata(poll_interval=20.0)))
    m.send(PollFailed("timeout", "timed out"))
    assert m.state.poll.next_at - m.now == 20


def test_a_persisting_poll_failure_is_logged_first_on_change_and_every_5_minutes():
    m = Machine(now=0.0)
    logged = []
    for _ in range(400):
        m.send(PollFailed("http_500", "HTTP 500", 500))
        logged += [(m.now, r.fields["kind"]) for r in logs(m.effects, "poll_failed")]
        m.tick(m.state.poll.next_at)
    m.send(PollFailed("timeout", "timed out"))
    logged += [(m.now, r.fields["kind"]) for r in logs(m.effects, "poll_failed")]
    assert [k for _, k in logged] == ["http_500", "http_500", "http_500", "timeout"]
    assert logged[1][0] - logged[0][0] >= 300


def test_retry_after_on_a_429_is_honoured_up_to_the_cap():
    m = Machine(config(metadata=Metadata(poll_interval=0.25)))
    m.send(PollFailed("http_429", "HTTP 429", 429, retry_after=1.5))
    assert m.state.poll.next_at - m.now == 1.5
    m.tick(m.state.poll.next_at)
    m.send(PollFailed("http_429", "HTTP 429", 429, retry_after=3600))
    assert m.state.poll.next_at - m.now == 2.0


def test_a_400_is_a_configuration_error_shown_in_status_until_a_reload_fixes_it():
    m = Machine()
    m.send(
        PollFailed("http_400", 'HTTP 400: {"error": "Bad request. api-version is invalid"}', 400)
    )
    (rejected,) = logs(m.effects, "imds_rejected_request")
    assert rejected.level is engine.Level.ERROR
    assert "api-version is invalid" in str(rejected.fields["error"])
    assert "IMDS REJECTS OUR REQUEST" in of(m.effects, Notify)[-1].fields["STATUS"]
    assert m.state.poll.next_at - m.now == 2.0
    fixed = config(metadata=Metadata(api_version="2019-08-01"))
    m.send(Reloaded(fixed), at=m.now + 0.5)
    assert of(m.effects, Fetch), "the fixed request is tried at once"
    assert "REJECTS" not in of(m.effects, Notify)[-1].fields.get("STATUS", "")


# ---- the watchdog --------------------------------------------------------------------------


def test_the_watchdog_is_pinged_every_half_period_whatever_the_poll_interval():
    m = Machine(config(metadata=Metadata(poll_interval=20.0)), watchdog_usec=2_000_000)
    pings = []
    t, end = m.now, m.now + 30
    while t < end:
        t = m.wake()
        if [e for e in m.tick(t) if isinstance(e, Notify) and "WATCHDOG" in e.fields]:
            pings.append(t)
    gaps = {round(b - a, 6) for a, b in zip(pings, pings[1:])}
    assert gaps == {1.0}


def test_a_fetch_that_outlives_its_timeouts_stops_the_watchdog_so_systemd_restarts_us():
    m = Machine(watchdog_usec=2_000_000)
    assert of(m.effects, Fetch)
    limit = 150 + 5 + engine.STALL_MARGIN
    t = m.now
    while t < 100 + limit - 1:
        t = m.wake()
        m.tick(t)
    assert any(isinstance(e, Notify) for e in m.effects)
    m.tick(100 + limit + 1)
    assert logs(m.effects, "poll_stalled")
    assert not [e for e in m.effects if isinstance(e, Notify) and "WATCHDOG" in e.fields]


# ---- state, reload, stop -------------------------------------------------------------------


def test_a_state_write_failure_is_logged_once_shown_in_status_and_its_recovery_too():
    m = Machine()
    m.send(Persisted("/state/state.json: Read-only file system"))
    assert logs(m.effects, "state_degraded")
    assert "DEGRADED" in of(m.effects, Notify)[0].fields["STATUS"]
    assert logs(m.send(Persisted("/state/state.json: Read-only file system"))) == []
    m.send(Persisted(""))
    assert logs(m.effects) == ["state_recovered"]
    assert "DEGRADED" not in of(m.effects, Notify)[0].fields["STATUS"]


def test_a_reload_that_moves_state_dir_is_refused_and_the_old_config_kept():
    m = Machine()
    m.send(Reloaded(config(state_dir=Path("/elsewhere"))))
    assert logs(m.effects) == ["config_invalid", "config_reload_failed"]
    assert "state_dir" in str(logs(m.effects, "config_invalid")[0].fields["error"])
    assert m.state.config.state_dir == Path("/state")


def test_status_is_sent_only_when_it_changes():
    m = Machine()
    assert of(m.fetched(doc(event())), Notify)
    assert not of(m.tick(m.now + 0.5), Notify)


def test_stop_waits_for_running_hooks_then_exits_without_fetching_more():
    m = Machine()
    m.fetched(doc(event()))
    m.send(StopRequested(), at=101)
    assert "STOPPING" in of(m.effects, Notify)[0].fields
    assert not of(m.tick(105), Fetch)
    assert not of(m.effects, Exit)
    m.send(HooksFinished(1, Outcome.SUCCEEDED), at=106)
    assert of(m.effects, PostApproval), "hooks that finish in the grace period are approved"
    assert not of(m.effects, Exit)
    m.send(ApprovalSent("E1"), at=106.1)
    assert logs(m.effects)[-2:] == ["event_approved", "daemon_stopped"]
    assert of(m.effects, Exit)[0].status == 0


def test_starting_extends_systemds_start_timeout_to_cover_the_first_imds_call():
    """first_call_timeout may be 900 s while the unit's TimeoutStartSec is 300."""
    cfg = config(vm_name=None, metadata=Metadata(first_call_timeout=900.0, timeout=5.0))
    m = Machine(cfg)
    (extend,) = [n for n in of(m.effects, Notify) if "EXTEND_TIMEOUT_USEC" in n.fields]
    assert int(extend.fields["EXTEND_TIMEOUT_USEC"]) / 1_000_000 >= 905
    assert of(m.effects, ResolveName)


def test_stopping_extends_systemds_stop_timeout_to_cover_a_long_grace():
    """shutdown_grace may be an hour while the unit's TimeoutStopSec is 180 s."""
    m = Machine(config(shutdown_grace=3600.0))
    m.send(StopRequested(), at=101)
    (stopping,) = of(m.effects, Notify)
    extend = int(stopping.fields["EXTEND_TIMEOUT_USEC"]) / 1_000_000
    assert extend >= 3600 + engine.KILL_WAIT, "SIGKILL must not come before our own kill wait"


def test_at_the_end_of_the_grace_hooks_are_cancelled_and_are_interrupted_on_disk():
    m = Machine()
    m.fetched(doc(event()))
    m.send(StopRequested(), at=101)
    assert m.wake() == 111
    m.tick(111)
    assert of(m.effects, CancelRuns)[0].runs == (1,)
    assert logs(m.effects, "hooks_cancelled")
    m.send(HooksFinished(1, Outcome.CANCELLED), at=112)
    assert of(m.effects, Exit)
    assert of(m.effects, Persist)[0].events["E1"].phase is Phase.INTERRUPTED


def test_hooks_that_ignore_the_cancel_do_not_keep_the_daemon_from_exiting():
    m = Machine()
    m.fetched(doc(event()))
    m.send(StopRequested(), at=101)
    m.tick(111)
    assert not of(m.tick(111 + engine.KILL_WAIT - 0.1), Exit)
    assert of(m.tick(111 + engine.KILL_WAIT), Exit)


def test_stop_with_nothing_running_exits_at_once():
    m = Machine()
    m.send(StopRequested())
    assert of(m.effects, Exit)


# ---- the whole life of an event: after, cancelled, reboots ---------------------------------

LIFE = {
    "Reboot": EventRule(("drain",), ("undrain",), ("restore",)),
    "Freeze": EventRule(("checkpoint",), approve=ApprovePolicy.NEVER),
}


def spawned(effects):
    return [(s.stage, s.hooks, s.rebooted) for s in of(effects, SpawnHooks)]


def approved_reboot(m):
    m.fetched(doc(event()), at=100.1)
    m.send(HooksFinished(1, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))


def test_after_hooks_run_once_when_an_approved_event_leaves_the_document():
    m = Machine(config(events=LIFE), boot="boot-1")
    approved_reboot(m)
    m.fetched(doc(event(status="Started"), incarnation=3), at=101)
    assert not of(m.effects, SpawnHooks), "Started is not over yet"
    m.fetched(doc(incarnation=4), at=102)
    assert spawned(m.effects) == [("after", ("undrain",), False)]
    assert logs(m.effects, "event_completed")[0].fields["stage"] == "after"
    assert m.phase() is Phase.AFTER
    kinds = [type(e) for e in m.effects]
    assert kinds.index(Persist) < kinds.index(SpawnHooks), "AFTER is on disk before they start"
    m.send(HooksFinished(2, Outcome.SUCCEEDED), at=103)
    assert logs(m.effects) == ["after_hooks_finished"]
    assert "E1" not in m.state.events
    assert not of(m.fetched(doc(incarnation=5), at=104), SpawnHooks), "never twice"


def test_an_event_that_started_without_our_approval_is_over_too():
    m = Machine(config(events=LIFE, approve=ApprovePolicy.NEVER))
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.SUCCEEDED))
    m.fetched(doc(event(status="Started"), incarnation=3), at=101)
    m.fetched(doc(incarnation=4), at=102)
    assert spawned(m.effects) == [("after", ("undrain",), False)]


def test_a_cancelled_event_runs_its_cancelled_hooks_once():
    m = Machine(config(events=LIFE, approve=ApprovePolicy.NEVER))
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.SUCCEEDED))
    m.fetched(doc(incarnation=3), at=101)
    assert logs(m.effects, "event_cancelled")[0].level is engine.Level.WARNING
    assert spawned(m.effects) == [("cancelled", ("restore",), False)]
    m.send(HooksFinished(2, Outcome.FAILED), at=102)
    (failed,) = logs(m.effects, "after_hooks_failed")
    assert failed.level is engine.Level.ERROR
    assert failed.fields["stage"] == "cancelled"
    assert m.state.events == {}, "a failure is reported, not retried"


def test_before_hooks_still_running_are_stopped_before_the_cancelled_hooks_start():
    m = Machine(config(events=LIFE))
    m.fetched(doc(event()))
    m.fetched(doc(incarnation=3), at=101)
    assert of(m.effects, CancelRuns)[0].runs == (1,)
    assert not of(m.effects, SpawnHooks)
    m.send(HooksFinished(1, Outcome.CANCELLED), at=102)
    assert spawned(m.effects) == [("cancelled", ("restore",), False)]


def test_cancelled_defaults_to_the_after_hooks_and_none_means_just_completed():
    no_after = config(events={"Reboot": EventRule(("drain",))})
    m = Machine(no_after)
    m.fetched(doc(event()))
    m.send(HooksFinished(1, Outcome.SUCCEEDED))
    m.send(ApprovalSent("E1"))
    m.fetched(doc(incarnation=3), at=101)
    assert not of(m.effects, SpawnHooks)
    assert m.state.events == {}


def test_after_a_new_boot_the_after_hooks_run_once_the_event_is_listed_started():
    """A new boot id alone proves nothing (issue 26 #1): nothing runs until a document says
    Started (or gone); then the after-hooks run once, with SCHEDULED_EVENT_REBOOTED=1."""
    m = Machine(config(events=LIFE), boot="boot-1")
    approved_reboot(m)
    saved = of(m.effects, Persist)[-1].events
    assert saved["E1"].boot_id == "boot-1"
    again = Machine(config(events=LIFE), loaded=saved, boot="boot-2")
    assert not logs(again.effects, "reboot_detected")
    assert not of(again.effects, SpawnHooks)
    assert again.phase() is Phase.REBOOTED
    assert of(again.effects, Persist)[0].events["E1"].phase is Phase.REBOOTED
    again.send(PollFailed("connection", "refused"), at=101)
    assert not of(again.effects, SpawnHooks), "IMDS silent: not judged yet"
    again.fetched(doc(event(status="Started")), at=102)
    assert logs(again.effects, "reboot_detected")[0].fields["stage"] == "after"
    assert spawned(again.effects) == [("after", ("undrain",), True)]
    again.send(HooksFinished(1, Outcome.SUCCEEDED), at=102.5)
    assert again.phase() is Phase.OVER, "kept while IMDS may still list it"
    again.fetched(doc(event(status="Started"), incarnation=3), at=103)
    assert not of(again.effects, SpawnHooks)
    assert not logs(again.effects, "event_detected")
    again.fetched(doc(incarnation=4), at=104)
    assert not of(again.effects, SpawnHooks), "not again when it leaves the document"
    assert again.state.events == {}


def test_after_a_new_boot_an_event_gone_from_the_first_document_gets_its_after_hooks():
    m = Machine(config(events=LIFE), boot="boot-1")
    approved_reboot(m)
    again = Machine(config(events=LIFE), loaded=of(m.effects, Persist)[-1].events, boot="boot-2")
    again.fetched(doc(incarnation=3), at=101)
    assert logs(again.effects, "reboot_detected")[0].fields["stage"] == "after"
    assert spawned(again.effects) == [("after", ("undrain",), True)]


def test_a_new_boot_while_the_event_is_still_scheduled_prepares_it_again():
    """Issue 26 #1: a crash or an operator's reboot while IMDS still lists the event Scheduled
    with NotBefore ahead is not the maintenance: its before-hooks run again on this boot, it is
    approved as usual, and its after-hooks run once, when it really is over."""
    m = Machine(config(events=LIFE), boot="boot-1")
    m.fetched(doc(event()), at=100.1)  # its drain runs; the VM goes down mid-drain
    again = Machine(config(events=LIFE), loaded=of(m.effects, Persist)[-1].events, boot="boot-2")
    assert not of(again.effects, SpawnHooks)
    again.fetched(doc(event()), at=101)
    (note,) = logs(again.effects, "reboot_detected")
    assert (note.fields["stage"], note.fields["maintenance"]) == ("before", False)
    assert spawned(again.effects) == [("before", ("drain",), False)]
    assert of(again.effects, Persist)[0].events["E1"].boot_id == "boot-2"
    again.send(HooksFinished(1, Outcome.SUCCEEDED), at=102)
    assert of(again.effects, PostApproval), "approved as usual"
    again.send(ApprovalSent("E1"), at=102.1)
    again.fetched(doc(event(status="Started"), incarnation=3), at=103)
    assert not of(again.effects, SpawnHooks), "Started is not over yet"
    again.fetched(doc(incarnation=4), at=104)
    assert spawned(again.effects) == [("after", ("undrain",), False)]
    again.send(HooksFinished(2, Outcome.SUCCEEDED), at=105)
    assert again.state.events == {}
    # The real maintenance reboots the VM once the event is approved: after-hooks, REBOOTED=1.
    third = Machine(config(events=LIFE), boot="boot-2")
    third.fetched(doc(event()), at=100.1)
    third.send(HooksFinished(1, Outcome.SUCCEEDED))
    third.send(ApprovalSent("E1"))
    saved = of(third.effects, Persist)[-1].events
    fourth = Machine(config(events=LIFE), loaded=saved, boot="boot-3")
    fourth.fetched(doc(event(status="Started")), at=101)
    assert spawned(fourth.effects) == [("after", ("undrain",), True)]


def test_hooks_cut_off_by_a_reboot_get_after_hooks_once_it_started_not_a_second_before_run():
    m = Machine(config(events=LIFE), boot="boot-1")
    m.fetched(doc(event()))
    saved = of(m.effects, Persist)[-1].events
    again = Machine(config(events=LIFE), loaded=saved, boot="boot-2")
    assert not logs(again.effects, "hooks_interrupted")
    again.fetched(doc(event(status="Started")), at=101)
    assert spawned(again.effects) == [("after", ("undrain",), True)]


def test_an_event_that_had_started_before_the_boot_gets_its_after_hooks_at_start():
    """Started, then a new boot: that was the maintenance, whether IMDS answers or not."""
    m = Machine(config(events=LIFE), boot="boot-1")
    approved_reboot(m)
    m.fetched(doc(event(status="Started"), incarnation=3), at=101)
    again = Machine(config(events=LIFE), loaded=of(m.effects, Persist)[-1].events, boot="boot-2")
    assert logs(again.effects, "reboot_detected")
    assert spawned(again.effects) == [("after", ("undrain",), True)]


def test_after_hooks_cut_off_by_a_stop_do_not_run_again():
    m = Machine(config(events=LIFE), boot="boot-1")
    approved_reboot(m)
    m.fetched(doc(incarnation=3), at=101)
    saved = of(m.effects, Persist)[-1].events
    assert saved["E1"].phase is Phase.AFTER
    again = Machine(config(events=LIFE), loaded=saved, boot="boot-1")
    assert logs(again.effects, "after_hooks_interrupted")
    assert not of(again.effects, SpawnHooks)


def test_events_for_other_vms_and_missed_ones_get_no_hooks_of_any_stage():
    m = Machine(config(events=LIFE))
    m.fetched(doc(event("X", resources=("vm-b",)), event("M", status="Started")))
    m.fetched(doc(incarnation=3), at=101)
    assert not of(m.effects, SpawnHooks)


def test_a_per_type_approve_overrides_the_top_level_one():
    m = Machine(config(events=LIFE, approve=ApprovePolicy.ALWAYS))
    m.fetched(doc(event("F", "Freeze")))
    m.send(HooksFinished(1, Outcome.SUCCEEDED))
    assert "approve: never" in str(logs(m.effects, "approval_skipped")[0].fields["reason"])
    assert not of(m.effects, PostApproval)


def short_freeze(duration, source="Platform"):
    e = event("F", "Freeze")
    return dataclasses.replace(e, duration_seconds=duration, source=source)


@pytest.mark.parametrize(
    ("duration", "hooks_run"), [(0, False), (9, False), (10, True), (-1, True)]
)
def test_a_short_freeze_is_approved_without_hooks(duration, hooks_run):
    rules = {"Freeze": EventRule(("checkpoint",), ("after",), short_seconds=9)}
    m = Machine(config(events=rules, hooks={}))
    m.fetched(doc(short_freeze(duration)))
    assert bool(of(m.effects, SpawnHooks)) is hooks_run
    if not hooks_run:
        (rule,) = logs(m.effects, "event_rule")
        assert rule.fields["rule"] == "short"
        assert of(m.effects, PostApproval)
        m.send(ApprovalSent("F"))
        m.fetched(doc(incarnation=3), at=101)
        assert not of(m.effects, SpawnHooks), "no after-hooks without before-hooks"


@pytest.mark.parametrize(
    ("user_events", "phase", "posted"),
    [
        (UserEvents.APPROVE, Phase.APPROVING, True),
        (UserEvents.IGNORE, Phase.UNHANDLED, False),
        (UserEvents.HOOKS, Phase.RUNNING, False),
    ],
)
def test_user_events_are_approved_at_once_ignored_or_handled_like_any_other(
    user_events, phase, posted
):
    m = Machine(config(user_events=user_events, approve=ApprovePolicy.NEVER))
    m.fetched(doc(dataclasses.replace(event(), source="User")))
    assert m.phase() is phase
    assert bool(of(m.effects, PostApproval)) is posted
    if user_events is not UserEvents.HOOKS:
        assert logs(m.effects, "event_rule")[0].fields["rule"] == "user"


WALL0 = 1_800_000_000.0  # the wall clock at monotonic 100 in the lead-time tests
LEAD = {"Reboot": EventRule(("drain",), start_before=900)}


def due_in(seconds, event_id="E1"):
    """A Reboot whose NotBefore is `seconds` after WALL0 (None: no NotBefore)."""
    when = None if seconds is None else dt.datetime.fromtimestamp(WALL0 + seconds, dt.timezone.utc)
    return dataclasses.replace(event(event_id), not_before=when)


def test_start_before_holds_the_hooks_until_the_lead_time_and_follows_a_moving_not_before():
    m = Machine(config(events=LEAD))
    m.send(DocumentFetched(doc(due_in(3 * 86400)), WALL0), at=100)
    assert m.phase() is Phase.WAITING
    (waiting,) = logs(m.effects, "event_waiting")
    assert waiting.fields["hooks_start_at"] == "2027-01-18T07:45:00Z"
    assert not of(m.effects, SpawnHooks)
    m.send(DocumentFetched(doc(due_in(2000), incarnation=3), WALL0 + 1), at=101)
    assert logs(m.effects, "event_waiting"), "the new start is logged"
    due = 100 + 2000 - 900
    assert m.state.events["E1"].start_at == due
    assert not of(m.tick(due - 0.01), SpawnHooks)
    assert [s.hooks for s in of(m.tick(due), SpawnHooks)] == [("drain",)]
    assert m.phase() is Phase.RUNNING


def test_an_event_without_not_before_or_already_close_starts_at_once():
    m = Machine(config(events=LEAD))
    m.send(DocumentFetched(doc(due_in(600), due_in(None, "E2")), WALL0), at=100)
    assert len(of(m.effects, SpawnHooks)) == 2


def test_a_waiting_event_that_starts_is_missed_and_never_approved():
    m = Machine(config(events=LEAD))
    m.send(DocumentFetched(doc(due_in(86400)), WALL0), at=100)
    m.send(DocumentFetched(doc(event(status="Started"), incarnation=3), WALL0 + 1), at=101)
    assert m.phase() is Phase.MISSED
    assert logs(m.effects, "event_missed")
    assert not of(m.tick(100 + 86400), SpawnHooks)
    assert not of(m.effects, PostApproval)


def test_after_a_restart_a_waiting_event_waits_for_the_next_document():
    far = due_in(86400)
    m = Machine(config(events=LEAD), loaded={"E1": Tracked(far, Phase.WAITING)})
    assert not of(m.tick(101), SpawnHooks)
    m.send(DocumentFetched(doc(far), WALL0 + 5), at=105)
    assert m.phase() is Phase.WAITING
    assert not of(m.effects, SpawnHooks)


def test_a_waiting_event_loaded_before_the_name_is_known_asks_for_no_infinite_wait():
    m = Machine(
        config(vm_name=None, events=LEAD), loaded={"E1": Tracked(due_in(86400), Phase.WAITING)}
    )
    assert m.wake() == m.now + 3600.0


# ---- Resources that change (issue 26 #17) -------------------------------------------------


def test_an_event_whose_resources_gain_this_vm_later_is_judged_again_and_prepared():
    """Listed first for another VM (not ours), then its Resources name this VM too (same
    EventId): judged anew at once, as at first sight; before, it stayed "not ours" for ever and
    the VM was rebooted unprepared."""
    m = Machine(config(events=LIFE))
    m.fetched(doc(event(resources=("vm-b",))))
    assert m.phase() is Phase.NOT_OURS
    m.fetched(doc(event(resources=("vm-b", VM)), incarnation=3), at=101)
    assert logs(m.effects, "event_detected")
    assert spawned(m.effects) == [("before", ("drain",), False)]
    assert m.phase() is Phase.RUNNING


def test_an_event_whose_resources_drop_this_vm_is_handled_as_leaving():
    """Ours and prepared, then its Resources no longer name this VM: its running before-hooks
    are stopped and its cancelled-hooks run, once; then it is not ours."""
    m = Machine(config(events=LIFE))
    m.fetched(doc(event()))
    m.fetched(doc(event(resources=("vm-b",)), incarnation=3), at=101)
    assert of(m.effects, CancelRuns)[0].runs == (1,)
    assert logs(m.effects, "event_cancelled")
    m.send(HooksFinished(1, Outcome.CANCELLED), at=102)
    assert spawned(m.effects) == [("cancelled", ("restore",), False)]
    m.send(HooksFinished(2, Outcome.SUCCEEDED), at=103)
    m.fetched(doc(event(resources=("vm-b",)), incarnation=4), at=104)
    assert not of(m.effects, SpawnHooks)
    assert m.phase() is Phase.NOT_OURS
    m.fetched(doc(event(resources=("vm-b", VM)), incarnation=5), at=105)
    assert spawned(m.effects) == [("before", ("drain",), False)], "named again: judged anew"


def test_an_approved_event_whose_resources_drop_this_vm_gets_its_after_hooks():
    m = Machine(config(events=LIFE))
    approved_reboot(m)
    m.fetched(doc(event(resources=("vm-b",)), incarnation=3), at=101)
    assert spawned(m.effects) == [("after", ("undrain",), False)]


def test_after_a_new_boot_an_event_that_no_longer_names_this_vm_gets_its_cancelled_hooks():
    """Review of issue 26: prepared (not approved, or approved), then a new boot; the first
    document lists the event for another VM only, Scheduled or Started. That is not proof that
    the boot was this VM's maintenance (it had run the after-hooks, reboot_detected
    stage=after): it is handled as leaving, as without a boot, with its cancelled-hooks."""
    for approve in ("never", "always"):
        for status in ("Scheduled", "Started"):
            m = Machine(config(events=LIFE, approve=ApprovePolicy(approve)), boot="boot-1")
            m.fetched(doc(event()))
            m.send(HooksFinished(1, Outcome.SUCCEEDED))
            saved = of(m.effects, Persist)[-1].events
            again = Machine(config(events=LIFE), loaded=saved, boot="boot-2")
            again.fetched(doc(event(status=status, resources=("vm-b",)), incarnation=3), at=101)
            assert not logs(again.effects, "reboot_detected"), (approve, status)
            assert logs(again.effects, "event_cancelled")
            assert spawned(again.effects) == [("cancelled", ("restore",), True)]
            (run,) = of(again.effects, SpawnHooks)
            again.send(HooksFinished(run.run, Outcome.SUCCEEDED), at=102)
            again.fetched(doc(event(status=status, resources=("vm-b",)), incarnation=4), at=103)
            assert not of(again.effects, SpawnHooks), "once"
            assert again.phase() is Phase.NOT_OURS


def test_a_waiting_event_whose_resources_drop_this_vm_is_forgotten_as_not_ours():
    m = Machine(config(events={"Reboot": EventRule(("drain",), start_before=60)}))
    m.send(DocumentFetched(doc(event()), wall=dt.datetime(2029, 12, 31).timestamp()))
    assert m.phase() is Phase.WAITING
    m.fetched(doc(event(resources=("vm-b",)), incarnation=3), at=101)
    assert m.phase() is Phase.NOT_OURS
    assert not of(m.effects, SpawnHooks)
