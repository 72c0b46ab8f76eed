"""Property tests (hypothesis): untrusted input is typed data or a clear error, never a crash."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from pathlib import Path
from typing import Optional
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduledeventsd import config, engine
from scheduledeventsd.config import loader, schema
from scheduledeventsd.coordination.etcd import EtcdError
from scheduledeventsd.coordination.etcd import _change as etcd_change
from scheduledeventsd.coordination.etcd import _decode as etcd_decode
from scheduledeventsd.coordination.etcd import _revision as etcd_revision
from scheduledeventsd.coordination.peers import state_of
from scheduledeventsd.engine import (
    AcquireSlot,
    ApprovalFailed,
    ApprovalSent,
    AskGate,
    Boot,
    ClusterChecked,
    ClusterDrained,
    ClusterDraining,
    ClusterHeld,
    ClusterMarked,
    ClusterRestored,
    CoordinationFailed,
    DocumentFetched,
    DrainNode,
    Exit,
    GateAnswered,
    HooksFinished,
    Outcome,
    PeersChanged,
    Persist,
    PollFailed,
    PostApproval,
    Reloaded,
    ReloadRequested,
    RestoreNode,
    SlotBusy,
    SlotFailed,
    SlotGranted,
    SlotKept,
    SpawnHooks,
    StopRequested,
    Tick,
    Tracked,
)
from scheduledeventsd.engine.gates.lead import lead
from scheduledeventsd.engine.lifecycle import Phase, Slot
from scheduledeventsd.model import Document, DocumentError, Event, parse_document
from scheduledeventsd.simulators.azure import _start_requests
from scheduledeventsd.windows import Window

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
field_values = scalars | st.lists(st.text(max_size=12), max_size=3) | json_values
# Times at the edges of what datetime can hold, in both of the formats IMDS is seen to use.
edge_times = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)
).flatmap(
    lambda when: st.sampled_from(
        [when.strftime("%Y-%m-%dT%H:%M:%S") + zone for zone in ("Z", "-01:00", "+14:00", "-23:59")]
        + [when.strftime("%a, %d %b ") + f"{when.year:04d}" + when.strftime(" %H:%M:%S -0100")]
    )
) | st.sampled_from(["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"])
event_like = st.fixed_dictionaries(
    {},
    optional={
        key: (field_values | edge_times) if key == "NotBefore" else field_values
        for key in (
            "EventId",
            "EventType",
            "EventStatus",
            "ResourceType",
            "Resources",
            "NotBefore",
            "Description",
            "EventSource",
            "DurationInSeconds",
        )
    },
)
# Events IMDS could send, but for their times: what must reach the engine and not break it.
plausible_event = st.fixed_dictionaries(
    {
        "EventId": st.text("ABCDEF0123456789-", min_size=1, max_size=12),
        "EventType": st.sampled_from(["Reboot", "Freeze", "Redeploy", "Preempt", "Terminate"]),
        "EventStatus": st.sampled_from(["Scheduled", "Started"]),
        "ResourceType": st.just("VirtualMachine"),
        "Resources": st.lists(st.sampled_from(["vm-a", "vm-b"]), min_size=1, max_size=2),
        "NotBefore": edge_times | st.just(""),
    },
    optional={"DurationInSeconds": st.integers(-1, 60), "EventSource": st.just("User")},
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "DocumentIncarnation": json_values,
        "Events": st.lists(event_like | plausible_event, max_size=4) | json_values,
    },
)


def _parses_or_refuses(body: bytes) -> None:
    """A Document or a DocumentError; and a Document never makes the engine raise, whether its
    events are ours or not (the first one's first resource is taken as this VM)."""
    try:
        doc = parse_document(body)
    except DocumentError:
        return
    assert isinstance(doc, Document)
    assert all(e.event_id and e.event_type and e.status for e in doc.events)
    step_through_the_engine(doc)


def step_through_the_engine(doc: Document) -> None:
    names = [r for e in doc.events for r in e.resources[:1]]
    cfg = dataclasses.replace(CONFIG, vm_name=names[0] if names else VM)
    state, _ = engine.step(engine.initial(cfg, strict=True), Boot({}, "", "b"), 0.0)
    state, effects = engine.step(state, DocumentFetched(doc, 1_800_000_000.0), 1.0)
    polls_on(state, effects, 1.0)
    after_a_new_boot(cfg, doc, effects)
    changed_under_it(state, doc, cfg.vm_name or VM)
    # Slots, and a Reboot of no before-hooks: a queued one once wedged the loop (#16).
    slotted = dataclasses.replace(
        cfg,
        concurrency=config.Concurrency("web", 1),
        events={**RULES, "Reboot": config.EventRule((), ("undrain",))},
    )
    queued, _ = engine.step(engine.initial(slotted, strict=True), Boot({}, "", "b"), 0.0)
    queued, effects = engine.step(queued, DocumentFetched(doc, 1_800_000_000.0), 1.0)
    changed_under_it(queued, doc, cfg.vm_name or VM)
    state, _ = engine.step(state, Tick(), 3600.0)
    engine.step(state, DocumentFetched(Document(doc.incarnation + 1, ()), 1_800_003_600.0), 3601)
    answered_after_a_restart(doc, cfg.vm_name or VM)


def answered_after_a_restart(doc: Document, vm: str) -> None:
    """Under slots through etcd and under Pacemaker: the state file of the first sight loaded
    again, then every answer etcd's worker and the drainer can give, for every event, before
    the first document (issue 26: SlotBusy after a restart raised, #14), then the document, and
    a wait past the slot's ttl with no keep-alive. Every step strict; the poll goes on."""
    for coordinated in (SLOTTED, paced(config.DrainMethod.STANDBY)):
        cfg = dataclasses.replace(CONFIG, vm_name=vm, **coordinated)  # type: ignore[arg-type]
        state, _ = engine.step(engine.initial(cfg, strict=True), Boot({}, "", "b"), 0.0)
        state, effects = engine.step(state, DocumentFetched(doc, 1_800_000_000.0), 1.0)
        saved = [e for e in effects if isinstance(e, Persist)]
        loaded = (
            Boot(saved[-1].events, "", "b", mark=saved[-1].mark) if saved else Boot({}, "", "b")
        )
        state, _ = engine.step(engine.initial(cfg, strict=True), loaded, 2.0)
        for event in doc.events:
            for message in answers_for(event.event_id, 2.0):
                state, _ = engine.step(state, message, 3.0)
        state, effects = engine.step(state, DocumentFetched(doc, 1_800_000_004.0), 4.0)
        polls_on(state, effects, 4.0)
        state, _ = engine.step(state, Tick(), 4.0 + KEPT_TTL + 1)


def answers_for(event_id: str, sent: float) -> tuple[engine.Message, ...]:
    return (
        SlotBusy(event_id, ("vm-b",)),
        SlotFailed(event_id, "unreachable", "refused"),
        SlotGranted(event_id, confirmed=sent),
        SlotKept(event_id, sent + 0.5),
        ClusterMarked(event_id, ours=True),
        ClusterDraining(event_id, ("rsc-1",)),
        ClusterHeld(event_id, "no_quorum"),
        ClusterDrained(event_id),
        ClusterRestored(event_id, "crm_attribute exited 102"),
        ClusterRestored(event_id),
        ClusterChecked(("no quorum",)),
    )


def polls_on(state: engine.State, effects: tuple[engine.Effect, ...], now: float) -> None:
    """The loop never stops polling: after a document, the next poll is ordered (issue 26 #16:
    a refused document left its poll in flight for ever)."""
    assert state.poll.in_flight_since is not None or engine.next_wakeup(state, now) <= now + 3.1
    assert all(e.at >= now for e in effects if isinstance(e, engine.WakeAt))


def after_a_new_boot(cfg: config.Config, doc: Document, effects: tuple[engine.Effect, ...]) -> None:
    """What the state file kept, loaded on a new boot (issue 26 #1), then the same document,
    then every event Started, then none."""
    saved = [e.events for e in effects if isinstance(e, engine.Persist)]
    state, _ = engine.step(
        engine.initial(cfg, strict=True), Boot(saved[-1] if saved else {}, "", "b2"), 0.0
    )
    state, effects = engine.step(state, DocumentFetched(doc, 1_800_000_100.0), 1.0)
    polls_on(state, effects, 1.0)
    started = tuple(dataclasses.replace(e, status="Started", not_before=None) for e in doc.events)
    state, effects = engine.step(
        state, DocumentFetched(Document(doc.incarnation + 1, started), 1_800_000_101.0), 2.0
    )
    polls_on(state, effects, 2.0)
    engine.step(state, DocumentFetched(Document(doc.incarnation + 2, ()), 1_800_000_102.0), 3.0)


def changed_under_it(state: engine.State, doc: Document, vm: str) -> None:
    """The same EventIds naming this VM only now, or no longer (issue 26 #17), then with a
    status the engine has no rule for and NotBefore cleared (#16)."""
    flipped = tuple(
        dataclasses.replace(
            e, resources=("vm-other",) if e.names(vm) else (*e.resources, vm.upper())
        )
        for e in doc.events
    )
    unknown = tuple(dataclasses.replace(e, status="Completed", not_before=None) for e in flipped)
    for i, events in enumerate((flipped, unknown, doc.events), start=1):
        now = 10.0 + i
        fetched = DocumentFetched(Document(doc.incarnation + i, events), 1_800_000_000.0 + now)
        state, effects = engine.step(state, fetched, now)
        polls_on(state, effects, now)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_any_bytes_are_a_document_or_a_document_error(body):
    _parses_or_refuses(body)


# Generation speed depends on how loaded the machine is (four workers, etcd): not a failure.
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_any_json_shaped_like_a_document_is_a_document_or_a_document_error(raw):
    _parses_or_refuses(json.dumps(raw).encode())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.lists(plausible_event, min_size=1, max_size=4))
def test_no_document_imds_could_send_makes_a_step_of_the_engine_raise(incarnation, events):
    """Times at the edges of what Python can hold included (a NotBefore past 9999 in UTC)."""
    body = {"DocumentIncarnation": incarnation, "Events": events}
    _parses_or_refuses(json.dumps(body).encode())


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=1, max_value=20_000))
def test_bodies_nested_arbitrarily_deep_are_refused_not_crashed_on(depth):
    _parses_or_refuses(b"[" * depth + b"]" * depth)
    _parses_or_refuses(
        b'{"DocumentIncarnation": 1, "Events": [' + b'{"a":' * depth + b"1" + b"}" * depth + b"]}"
    )


config_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(sorted({key.name for key in schema.KEYS} | {"x"}))
            | st.text(max_size=10),
            inner,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config_values)
def test_any_yaml_value_is_a_config_or_errors_that_name_the_source(raw):
    problems: list[str] = []
    try:
        parsed = loader.parse(raw, "fuzz.yaml", check_files=False)
    except config.ConfigError as e:
        problems = e.problems
    else:
        assert isinstance(parsed, config.Config)
        return
    assert problems
    assert all(p.startswith("fuzz.yaml: ") for p in problems)


# ---- the state machine under random histories ---------------------------------------------

VM = "vm-a"
RULES = {
    "Reboot": config.EventRule(("drain",), ("undrain",), ("restore",)),
    "Freeze": config.EventRule((), ("thaw",)),
    "Preempt": config.EventRule(("shutdown",), short_seconds=5),
}
CONFIG = config.Config(
    vm_name=VM,
    state_dir=Path("/unused"),
    approve=config.ApprovePolicy.ALWAYS,  # shared events are approved too: more to check
    hooks={},
    events=RULES,
    shutdown_grace=5.0,
)

step_kinds = st.one_of(
    st.tuples(
        st.just("add"),
        st.sampled_from(sorted(RULES)),
        st.sampled_from([(VM,), ("vm-b",), (VM, "vm-b")]),
        st.sampled_from(["Scheduled", "Started"]),
        st.sampled_from([None, 3, 30]),
    ),
    st.tuples(st.just("start"), st.integers(0, 9)),
    st.tuples(st.just("remove"), st.integers(0, 9)),
    st.tuples(st.just("finish"), st.integers(0, 9), st.sampled_from(list(Outcome))),
    st.tuples(st.just("approval"), st.integers(0, 9), st.booleans()),
    st.tuples(
        st.just("poll_fails"),
    ),
    st.tuples(st.just("wait"), st.floats(0.1, 20)),
    st.tuples(st.just("restart"), st.booleans()),
    st.tuples(st.just("reload"), st.sampled_from(list(config.ApprovePolicy))),
    st.tuples(
        st.just("stop"),
    ),
)
steps = st.lists(step_kinds, max_size=40)


def needs_before(event: Event) -> bool:
    """Whether its approval must wait for a successful before-run (not a short one, say)."""
    rule = RULES[event.event_type]
    short, duration = rule.short_seconds, event.duration_seconds
    decided = short is not None and duration is not None and 0 <= duration <= short
    return bool(rule.before) and not decided


class History:
    """Drives the engine through a random history, restarts included, checking invariants on
    every effect: the daemon's promise, proven on the pure state machine."""

    def __init__(self, cfg: config.Config = CONFIG) -> None:
        self.cfg = cfg
        self.peers_ok: set[str] = set()  # shared events all VMs said ready for, after before_ok
        self.now = 100.0
        self.doc: dict[str, Event] = {}
        self.incarnation = 1
        self.next_id = 0
        self.boot = "boot-0"
        self.saved: dict[str, Tracked] = {}
        self.succeeded_runs: set[int] = set()
        self.run_of: dict[int, tuple[str, str]] = {}  # run -> (event id, stage)
        self.stage_runs: dict[str, int] = {}  # event id -> after/cancelled runs started
        self.before_ok: set[str] = set()  # events whose current before-run succeeded
        self.posting: list[str] = []
        self.state = engine.initial(cfg, strict=True)
        self.feed(Boot({}, "", self.boot))

    def feed(self, message) -> None:
        self.state, effects = engine.step(self.state, message, self.now)
        for effect in effects:
            self.check(effect)
        if any(isinstance(e, Exit) for e in effects):  # systemd starts it again
            self.restart(False)

    def check(self, effect) -> None:
        if isinstance(effect, SpawnHooks):
            assert effect.event.names(VM), "hooks for an event not ours"
            self.run_of[effect.run] = (effect.event.event_id, effect.stage)
            if effect.stage == "before":
                self.before_ok.discard(effect.event.event_id)
                self.peers_ok.discard(effect.event.event_id)
            else:
                n = self.stage_runs.get(effect.event.event_id, 0) + 1
                self.stage_runs[effect.event.event_id] = n
                # Issue 28: again only while they have not succeeded and its slot is held, or
                # asked for (hold.keeps: after a lease expired, or queued again after a boot and
                # then cancelled: a VM whose undrain failed still counts against its group).
                now = self.state.events.get(effect.event.event_id)
                again = (
                    now is not None
                    and now.phase is Phase.AFTER
                    and now.slot in (Slot.HELD, Slot.ASKED)
                )
                assert n == 1 or again, "after- or cancelled-hooks twice for one event"
        elif isinstance(effect, PostApproval):
            event = effect.event
            assert event.names(VM), "approved an event that is not ours"
            assert not needs_before(event) or event.event_id in self.before_ok, (
                "approved without a successful run of its before-hooks"
            )
            shared = len(event.resources) > 1
            if self.cfg.approve is config.ApprovePolicy.ALL and shared:
                assert event.event_id in self.peers_ok, "a shared event approved before all ready"
            self.posting.append(event.event_id)
        elif isinstance(effect, Persist):
            self.saved = dict(effect.events)

    def document(self) -> None:
        self.incarnation += 1
        doc = Document(self.incarnation, tuple(self.doc.values()))
        self.feed(DocumentFetched(doc, self.now + 1_800_000_000.0))

    def apply(self, step) -> None:
        kind = step[0]
        ids = list(self.doc)
        if kind == "add":
            _, event_type, resources, status, duration = step
            event_id = f"E{self.next_id}"
            self.next_id += 1
            self.doc[event_id] = Event(
                event_id, event_type, status, "VirtualMachine", resources, None, "", "", duration
            )
            self.document()
        elif kind in ("start", "remove") and ids:
            event_id = ids[step[1] % len(ids)]
            if kind == "remove":
                del self.doc[event_id]
            else:
                self.doc[event_id] = dataclasses.replace(self.doc[event_id], status="Started")
            self.document()
        elif kind == "finish" and any(r in self.run_of for r in self.state.runs):
            # Hook runs only: a gate run (AskGate, AskCluster) is answered by GateAnswered.
            runs = sorted(r for r in self.state.runs if r in self.run_of)
            run = runs[step[1] % len(runs)]
            event_id, stage = self.run_of[run]
            if step[2] is Outcome.SUCCEEDED and stage == "before":
                tracked = self.state.events.get(event_id)
                if tracked is not None and tracked.run == run:
                    self.before_ok.add(event_id)
            self.feed(HooksFinished(run, step[2]))
        elif kind == "approval" and self.posting:
            event_id = self.posting.pop(step[1] % len(self.posting))
            self.feed(ApprovalSent(event_id) if step[2] else ApprovalFailed(event_id, "x", "x"))
        elif kind == "poll_fails":
            self.feed(PollFailed("timeout", "timed out"))
        elif kind == "wait":
            self.now += step[1]
            self.feed(Tick())
        else:
            self.apply_other(step, ids)

    def restart(self, rebooted: bool) -> None:
        if rebooted:
            self.boot = f"boot-{self.next_id}"
        self.posting.clear()  # before_ok stays: an APPROVING event is posted again
        self.state = engine.initial(self.cfg, strict=True)
        self.feed(Boot(self.saved, "", self.boot))
        self.document()

    def apply_other(self, step, ids) -> None:
        """Restarts, reloads, stops, and what the other VMs say (approve: all); steps that
        found nothing to do (no event, no run) end here too."""
        if step[0] == "restart":
            self.restart(step[1])
        elif step[0] == "reload" and self.state.stopping is None:
            policy = step[1]
            if self.cfg.coordination is not None:
                policy = config.ApprovePolicy.ALL  # what the fleet invariant is about
            elif policy is config.ApprovePolicy.ALL:
                policy = config.ApprovePolicy.SOLE  # the validator refuses `all` alone
            self.feed(ReloadRequested())
            self.feed(Reloaded(dataclasses.replace(self.cfg, approve=policy)))
        elif step[0] == "stop":
            self.feed(StopRequested())
        if step[0] not in ("peers", "coordination_fails") or not ids:
            return
        event_id = ids[step[1] % len(ids)]
        if step[0] == "coordination_fails":
            self.feed(CoordinationFailed(event_id, "unreachable", "refused"))
            return
        states = dict(zip((VM, "vm-b"), step[2]))
        everyone = all(states.get(r) == "ready" for r in self.doc[event_id].resources)
        prepared = event_id in self.before_ok or not needs_before(self.doc[event_id])
        if everyone and prepared:
            self.peers_ok.add(event_id)
        self.feed(PeersChanged(event_id, states))


# 500: tests/engine/test_promises.py holds the engine to the same promises and more, with a model.
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_no_history_approves_what_is_not_ours_or_unprepared_or_runs_after_hooks_twice(history):
    h = History()
    for step in history:
        h.apply(step)


FLEET = dataclasses.replace(
    CONFIG,
    approve=config.ApprovePolicy.ALL,
    coordination=config.Coordination(etcd=config.Etcd(endpoints=("http://127.0.0.1:2379",))),
)
_state = st.sampled_from(["ready", "failed", ""])
fleet_steps = st.lists(
    st.one_of(
        step_kinds,
        st.tuples(st.just("peers"), st.integers(0, 9), st.tuples(_state, _state)),
        st.tuples(st.just("coordination_fails"), st.integers(0, 9)),
    ),
    max_size=40,
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet_steps)
def test_no_history_approves_a_shared_event_before_every_vm_it_names_said_ready(history):
    """approve: all, with random peer states, coordination failures, restarts and reboots."""
    h = History(FLEET)
    for step in history:
        h.apply(step)


# ---- time: wall-clock steps, windows across daylight saving, slot answers after restarts ---

# Reboot obeys windows and takes a concurrency slot; the windows are ones daylight saving cuts
# (the hour skipped in spring, the hour shown twice in autumn) in zones with 1-hour and
# 30-minute changes; the history's wall clock starts in the week before one of their changes.
CUT_WINDOWS = tuple(
    Window(frozenset({6}), dt.time.fromisoformat(start), dt.time.fromisoformat(end), ZoneInfo(z))
    for z, start, end in (
        ("Europe/Berlin", "02:00", "03:00"),
        ("America/New_York", "02:00", "03:00"),
        ("America/New_York", "01:00", "02:00"),
        ("Australia/Lord_Howe", "02:00", "02:30"),
        ("Australia/Lord_Howe", "01:30", "02:00"),
    )
)
TIMED = dataclasses.replace(
    CONFIG,
    events={**RULES, "Reboot": config.EventRule(("drain",), ("undrain",), ("restore",))},
    concurrency=config.Concurrency("web", 1),
)
# Monday 12:00 UTC six days before a change in 2027, with the window of CUT_WINDOWS it cuts.
_WEEKS = {(3, 22): 0, (3, 8): 1, (11, 1): 2, (9, 27): 3, (3, 29): 4, (10, 25): 0}
clock_and_windows = st.sampled_from(
    [
        (dt.datetime(2027, m, d, 12, tzinfo=dt.timezone.utc).timestamp(), (CUT_WINDOWS[w],))
        for (m, d), w in _WEEKS.items()
    ]
) | st.tuples(
    st.sampled_from(
        [dt.datetime(2027, m, d, 12, tzinfo=dt.timezone.utc).timestamp() for m, d in _WEEKS]
    ),
    st.sampled_from([(w,) for w in CUT_WINDOWS] + [CUT_WINDOWS]),
)
timed_kinds = st.one_of(
    step_kinds,
    st.tuples(
        st.just("add_due"),
        st.sampled_from(sorted(RULES)),
        st.sampled_from([(VM,), ("vm-b",), (VM, "vm-b")]),
        st.sampled_from([30, 700, 3600, 86400, 3 * 86400, 8 * 86400, 13 * 86400]),
    ),
    st.tuples(st.just("clock"), st.sampled_from([-7200, -3600, -600, 1800, 3600, 86400])),
    st.tuples(st.just("slot"), st.integers(0, 9), st.sampled_from(["granted", "busy", "failed"])),
    st.tuples(
        st.just("restart_then_slot"),
        st.booleans(),
        st.integers(0, 9),
        st.sampled_from(["granted", "busy", "failed"]),
    ),
    st.tuples(st.just("move"), st.integers(0, 9), st.sampled_from([-86400, -3000, 600, 7 * 86400])),
)


class TimedHistory(History):
    """History with a wall clock that starts before a daylight-saving change and steps back and
    forth, events with NotBefore, windows and slot answers (after restarts too). Every step is
    strict: none may raise. A windowed Reboot is approved early only while holding its slot."""

    def __init__(self, wall: float, windows: tuple[Window, ...]) -> None:
        self.offset = wall - 100.0  # wall clock minus the fake monotonic one
        super().__init__(dataclasses.replace(TIMED, windows=windows))

    def document(self) -> None:
        self.incarnation += 1
        self.same_document()

    def same_document(self) -> None:
        doc = Document(self.incarnation, tuple(self.doc.values()))
        self.feed(DocumentFetched(doc, self.now + self.offset))

    def apply(self, step) -> None:
        super().apply(step)
        self.deadlines_follow_the_wall_clock()

    def deadlines_follow_the_wall_clock(self) -> None:
        """A queued event's slot deadline is its lead before NotBefore on the wall clock as it
        is now (#15: a step left it where the old clock put it), or, past the lead, at most
        SLOT_GRACE from now: etcd's time to answer a slot asked for when the hooks are due."""
        if self.state.stopping is not None or self.state.wall_offset is None:
            return
        for event_id, t in self.state.events.items():
            if t.phase is Phase.QUEUED and math.isfinite(t.start_at) and event_id in self.doc:
                not_before = self.doc[event_id].not_before
                assert not_before is not None
                wall_deadline = not_before.timestamp() - lead(self.cfg.events["Reboot"])
                latest = max(wall_deadline, self.now + self.offset + engine.SLOT_GRACE)
                assert wall_deadline - 1.0 < t.start_at + self.offset < latest + 1.0, "deadline off"

    def check(self, effect) -> None:
        super().check(effect)
        if isinstance(effect, PostApproval) and effect.event.event_type == "Reboot":
            tracked = self.state.events[effect.event.event_id]
            assert tracked.slot is Slot.HELD, "a windowed Reboot approved early without its slot"

    def apply_other(self, step, ids) -> None:
        kind = step[0]
        if kind == "add_due":
            _, event_type, resources, due = step
            event_id = f"E{self.next_id}"
            self.next_id += 1
            when = dt.datetime.fromtimestamp(self.now + self.offset + due, dt.timezone.utc)
            self.doc[event_id] = Event(
                event_id, event_type, "Scheduled", "VirtualMachine", resources, when
            )
            self.document()
        elif kind == "clock":  # the wall clock steps against the monotonic one
            self.offset += step[1]
            self.same_document()
        elif kind == "move" and ids:
            event_id = ids[step[1] % len(ids)]
            event = self.doc[event_id]
            if event.not_before is not None:
                moved = event.not_before + dt.timedelta(seconds=step[2])
                self.doc[event_id] = dataclasses.replace(event, not_before=moved)
                self.document()
        elif kind == "slot" and ids:
            self.feed(self.slot_answer(ids[step[1] % len(ids)], step[2]))
        elif kind == "restart_then_slot":  # the etcd worker answers before IMDS does (#14)
            if step[1]:
                self.boot = f"boot-{self.next_id}"
            self.posting.clear()
            self.state = engine.initial(self.cfg, strict=True)
            self.feed(Boot(self.saved, "", self.boot))
            if self.saved:
                saved = sorted(self.saved)
                self.feed(self.slot_answer(saved[step[2] % len(saved)], step[3]))
            self.document()
        else:
            super().apply_other(step, ids)

    @staticmethod
    def slot_answer(event_id: str, answer: str) -> object:
        return {
            "granted": SlotGranted(event_id),
            "busy": SlotBusy(event_id, ("vm-b",)),
            "failed": SlotFailed(event_id, "unreachable", "refused"),
        }[answer]


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clock_and_windows, st.lists(timed_kinds, max_size=40))
def test_no_history_of_clock_steps_windows_and_slot_answers_makes_a_step_raise(
    clock_and_windows, history
):
    """Issue 26 #2, #14, #15: the week before a daylight-saving change with windows the change
    cuts, wall-clock steps both ways, NotBefore moves, slot answers before and after restarts:
    no step raises (strict mode), and the promises of History hold."""
    h = TimedHistory(*clock_and_windows)
    for step in history:
        h.apply(step)


# ---- slot keep-alives and Pacemaker's answers, after restarts and reloads ------------------

# A short ttl, so keep-alives that stop coming lose the slot within a few waits.
KEPT_TTL = 10
PACEMAKER = config.Pacemaker(event_types=("Reboot", "Preempt"))
# Slots through etcd, or a Pacemaker drain (cluster.pacemaker): histories switch between them.
SLOTTED = {
    "coordination": config.Coordination(etcd=config.Etcd(endpoints=("http://127.0.0.1:2379",))),
    "concurrency": config.Concurrency("web", 1, ttl=KEPT_TTL),
    "cluster": None,
}


def paced(method: config.DrainMethod) -> dict[str, object]:
    pacemaker = dataclasses.replace(PACEMAKER, method=method)
    return {"coordination": None, "cluster": pacemaker, "concurrency": None}


CLUSTER_ANSWERS = (
    "marked_ours",
    "marked_other",
    "draining",
    "drained",
    "held",
    "restored",
    "restore_failed",
    "restored_unwanted",
    "checked_ok",
    "checked_bad",
)
ANSWERS = ("granted", "busy", "failed", "kept", "granted_confirmed", *CLUSTER_ANSWERS)
_answer = st.tuples(
    st.just("answer"),
    st.integers(0, 9),
    st.sampled_from(ANSWERS),
    st.sampled_from([0.0, 1.0, 4.0, 12.0]),
)
_finish = st.tuples(st.just("finish"), st.integers(0, 9), st.sampled_from(list(Outcome)))
clustered_kinds = st.one_of(
    timed_kinds,
    *[_answer] * 6,
    *[_finish] * 2,
    st.tuples(st.just("leap"), st.sampled_from([60.0, 300.0, 3000.0]), st.booleans()),
    *[
        st.tuples(
            st.just("serve"),
            st.integers(1, 4),
            st.sampled_from([0.0, 0.0, 4.0, 15.0]),
            st.booleans(),
        )
    ]
    * 4,
    st.tuples(
        st.just("restart_then"),
        st.booleans(),
        st.integers(0, 9),
        st.sampled_from(ANSWERS),
        st.sampled_from([0.0, 4.0]),
    ),
    st.tuples(
        st.just("pacemaker"),
        st.sampled_from([None, *config.DrainMethod]),
        st.sampled_from(["reload", "restart", "reboot"]),
    ),
)
# Every history starts with a Reboot of this VM due soon (its lead comes within a few
# leaps), under Pacemaker or not: what the answers are about.
clustered_start = st.tuples(
    st.sampled_from([700.0, 1200.0, 3600.0]), st.sampled_from([None, *config.DrainMethod])
)


class ClusteredHistory(TimedHistory):
    """TimedHistory, with the answers added for issue 26: keep-alives acknowledged (SlotKept,
    SlotGranted(confirmed=...)), ones that stop coming (a slot lost by its ttl), slot answers
    and Pacemaker's answers after restarts, and reloads and restarts that add or remove
    `cluster.pacemaker`. Invariants, besides History's: the poll is always ordered, an
    approval goes out only while the slot's lease is confirmed (the last acknowledged request
    sent less than ttl ago), and a mark of ours on the cluster is never forgotten (nor left out
    of the state file) until a restore of it succeeded."""

    def __init__(self, wall: float, windows: tuple[Window, ...]) -> None:
        self.confirmed: dict[str, float] = {}  # as etcd told this daemon run: lease sent at
        self.saved_mark: Optional[engine.ClusterMark] = None
        self.asked = False  # the engine asked for something since the leap began
        self.pending: list[object] = []  # what it asked for, for "serve" to answer as asked
        self.unslotted: set[str] = set()  # prepared while no concurrency was configured
        # How the last drainer marks the node: its command may still run after a reload or a
        # restart that removed cluster.pacemaker.
        self.drainer_mark: Optional[engine.ClusterMark] = None
        super().__init__(wall, windows)
        self.cfg = dataclasses.replace(self.cfg, **SLOTTED)  # type: ignore[arg-type]
        self.state = engine.initial(self.cfg, strict=True)
        self.feed(Boot({}, "", self.boot))

    def feed(self, message) -> None:
        if isinstance(message, SlotGranted):  # what etcd told this run, before the step
            self.confirmed[message.event_id] = (
                self.now if message.confirmed is None else message.confirmed
            )
        elif isinstance(message, SlotKept) and message.event_id in self.confirmed:
            was = self.confirmed[message.event_id]
            self.confirmed[message.event_id] = max(was, message.confirmed)
        held = self.state.cluster_mark
        super().feed(message)
        pacemaker = self.state.config.cluster
        if pacemaker is not None:
            self.drainer_mark = engine.mark_of(pacemaker)
        if isinstance(message, ClusterMarked) and message.ours:
            assert self.state.cluster_mark is not None, "a mark set on the node went unrecorded"
        restored = isinstance(message, ClusterRestored) and not message.error
        if held is not None and not restored and not isinstance(message, Boot):
            assert self.state.cluster_mark is not None, f"our mark forgotten on {message}"
        if self.state.stopping is None:
            self.polls_on(message)

    def apply(self, step) -> None:
        """A run the engine started may be a gate's (approve: all under Pacemaker asks the
        cluster whether the other nodes are drained): it ends with GateAnswered."""
        if step[0] == "finish" and self.state.runs:
            runs = sorted(self.state.runs)
            run = runs[step[1] % len(runs)]
            event_id, stage = self.run_of.get(run, ("", ""))
            if stage == "gate":
                ready = step[2] is Outcome.SUCCEEDED
                tracked = self.state.events.get(event_id)
                prepared = event_id in self.before_ok
                if ready and tracked is not None and (prepared or not needs_before(tracked.event)):
                    self.peers_ok.add(event_id)
                self.feed(GateAnswered(run, 0 if ready else 1))
                return
        super().apply(step)

    def polls_on(self, message) -> None:
        """A poll is in flight, or ordered, and the engine wakes for it, at most the backoff's
        cap away, or later only as the rate limit spreads the requests this history crowded
        into one instant (documents fed without time passing)."""
        poll, now = self.state.poll, self.now
        if poll.in_flight_since is not None:
            return
        crowded = engine.RATE_WINDOW * len(self.state.sent)
        assert poll.next_at <= now + 3.1 + crowded, f"no poll ordered after {message}"
        assert engine.next_wakeup(self.state, now) <= now + 3.1 + crowded, (
            f"no wake-up for the poll after {message}"
        )

    def check(self, effect) -> None:
        if isinstance(effect, AskGate):
            self.run_of[effect.run] = (effect.event.event_id, "gate")
        if isinstance(effect, (AcquireSlot, DrainNode, RestoreNode, SpawnHooks, PostApproval)):
            self.asked = True
            self.pending.append(effect)
        if isinstance(effect, (SpawnHooks, DrainNode)) and self.state.config.concurrency is None:
            self.unslotted.add(effect.event.event_id)
        if (
            isinstance(effect, PostApproval)
            and effect.event.event_type == "Reboot"
            and self.state.config.concurrency is not None
            and effect.event.event_id not in self.unslotted
        ):
            sent = self.confirmed.get(effect.event.event_id)
            assert sent is not None, "approved early without etcd ever confirming the slot"
            assert sent + KEPT_TTL > self.now, "approved early on a lease etcd did not confirm"
        elif isinstance(effect, Persist):
            if self.state.cluster_mark is not None:
                assert effect.mark == self.state.cluster_mark, "the state file lacks our mark"
            self.saved_mark = effect.mark
        History.check(self, effect)  # TimedHistory's slot check, above, knows the config now

    def boot_again(self, rebooted: bool, cfg: config.Config) -> None:
        """A restart: what the state file holds, mark included; leases are etcd's news of the
        run that ended (the slot is taken back first)."""
        if rebooted:
            self.boot = f"boot-{self.next_id}"
        self.posting.clear()
        self.pending.clear()
        self.confirmed.clear()
        held = self.state.cluster_mark
        self.state = engine.initial(cfg, strict=True)
        self.feed(Boot(self.saved, "", self.boot, mark=self.saved_mark))
        if held is not None:
            assert self.state.cluster_mark is not None, "our mark forgotten over a restart"

    def restart(self, rebooted: bool) -> None:
        self.boot_again(rebooted, self.state.config)
        self.document()

    def apply_other(self, step, ids) -> None:
        kind = step[0]
        if kind == "answer" and ids:
            self.feed_answer(self.answered(ids, step[1]), step[2], step[3])
        elif kind == "restart_then":  # etcd's or the cluster's answer before IMDS's
            self.boot_again(step[1], self.state.config)
            known = sorted(self.saved) or ids
            if known:
                self.feed_answer(known[step[2] % len(known)], step[3], step[4])
            self.document()
        elif kind == "serve":
            self.serve(step[1], step[2], kept=step[3])
        elif kind == "leap":
            self.leap(step[1], kept=step[2])
        elif kind in ("reload", "pacemaker"):
            self.reconfigure(step)
        elif kind == "restart_then_slot":
            self.boot_again(step[1], self.state.config)
            if self.saved:
                saved = sorted(self.saved)
                self.feed(self.slot_answer(saved[step[2] % len(saved)], step[3]))
            self.document()
        else:
            super().apply_other(step, ids)

    def answered(self, ids: list[str], pick: int) -> str:
        """Mostly an event of ours still under way (what etcd and the drainer answer about),
        else any listed one (an answer that comes late)."""
        live = [
            k
            for k, t in self.state.events.items()
            if t.phase not in (Phase.NOT_OURS, Phase.MISSED, Phase.OVER, Phase.GONE)
        ]
        return live[pick % len(live)] if live and pick < 7 else ids[pick % len(ids)]

    def reconfigure(self, step) -> None:
        """`reload`: the approval policy, nothing else. `pacemaker`: slots through etcd (None)
        or Pacemaker with this method, by a reload, a restart or a reboot."""
        if self.state.stopping is not None:
            return
        if step[0] == "reload":
            policy = step[1]
            if policy is config.ApprovePolicy.ALL and self.state.config.coordination is None:
                policy = config.ApprovePolicy.SOLE
            self.feed(ReloadRequested())
            self.feed(Reloaded(dataclasses.replace(self.state.config, approve=policy)))
            return
        method, how = step[1], step[2]
        settings = SLOTTED if method is None else paced(method)
        cfg = dataclasses.replace(self.state.config, **settings)  # type: ignore[arg-type]
        if how == "reload":
            self.feed(ReloadRequested())
            self.feed(Reloaded(cfg))
        else:
            self.boot_again(how == "reboot", cfg)
            self.document()

    def serve(self, count: int, after: float, *, kept: bool) -> None:
        """The world answers the oldest `count` requests as asked, each `after` seconds (with
        keep-alives acknowledged meanwhile, or none: a slot lost by its ttl): a slot granted,
        the node marked and drained, hooks that succeed, approvals and restores that work.
        Random steps between serves put faults in; this takes histories deep enough to
        approve."""
        for _ in range(count):
            if not self.pending:
                return
            if after:
                self.leap(after, kept=kept)
            if not self.pending:
                return
            effect = self.pending.pop(0)
            if isinstance(effect, AcquireSlot):
                self.feed(SlotGranted(effect.event.event_id, confirmed=self.now))
            elif isinstance(effect, DrainNode):
                self.feed(ClusterMarked(effect.event.event_id, ours=True, mark=self.drainer_mark))
                self.feed(ClusterDrained(effect.event.event_id))
            elif isinstance(effect, SpawnHooks) and effect.run in self.state.runs:
                self.apply(("finish", sorted(self.state.runs).index(effect.run), Outcome.SUCCEEDED))
            elif isinstance(effect, PostApproval) and effect.event.event_id in self.posting:
                self.posting.remove(effect.event.event_id)
                self.feed(ApprovalSent(effect.event.event_id))
            elif isinstance(effect, RestoreNode):
                self.feed(ClusterRestored(effect.event_id))

    def leap(self, seconds: float, *, kept: bool) -> None:
        """A long wait, woken at each timer the engine asked for (no IMDS answer meanwhile);
        `kept`: etcd acknowledges a keep-alive every third of the ttl, as the worker sends.
        It ends early where the engine asked for something (a slot, a drain, hooks)."""
        until = self.now + seconds
        self.asked = False
        for _ in range(60):
            if self.now >= until or self.asked:  # what was asked is answered by later steps
                return
            wake = min(until, engine.next_wakeup(self.state, self.now))
            if kept:
                wake = min(wake, self.now + KEPT_TTL / 3)
            self.now = max(wake, self.now + 0.01)
            if kept:
                for event_id in list(self.confirmed):
                    self.feed(SlotKept(event_id, self.now - 0.05))
            self.feed(Tick())

    def feed_answer(self, event_id: str, answer: str, lag: float) -> None:
        """One answer of etcd's slot worker or of the drainer, as the daemon would pass it on;
        `lag`: how long before now the acknowledged request was sent."""
        sent = self.now - lag
        message = {
            "kept": SlotKept(event_id, sent),
            "granted_confirmed": SlotGranted(event_id, confirmed=sent),
            "marked_ours": ClusterMarked(event_id, ours=True, mark=self.drainer_mark)
            if self.drainer_mark is not None
            else ClusterMarked(event_id, ours=False),
            "marked_other": ClusterMarked(event_id, ours=False),
            "draining": ClusterDraining(event_id, ("rsc-1",)),
            "drained": ClusterDrained(event_id),
            "held": ClusterHeld(event_id, "too_few_healthy", "1 of 3"),
            "restored": ClusterRestored(event_id),
            "restore_failed": ClusterRestored(event_id, "crm_attribute exited 102"),
            "restored_unwanted": ClusterRestored(""),
            "checked_ok": ClusterChecked(()),
            "checked_bad": ClusterChecked(("no quorum",)),
        }.get(answer)
        self.feed(self.slot_answer(event_id, answer) if message is None else message)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clock_and_windows, clustered_start, st.lists(clustered_kinds, min_size=5, max_size=40))
@example(  # found at random: drained, then a reboot onto slots queues it; cancelled, its
    # cancelled-hooks fail and run again while its slot is asked for (hold.keeps)
    clock_and_windows=(1805716800.0, CUT_WINDOWS[:1]),
    start=(700.0, config.DrainMethod.HEALTH),
    history=[
        ("pacemaker", None, "reboot"),
        ("remove", 0),
        ("add", "Freeze", (VM,), "Scheduled", None),
        ("finish", 0, Outcome.FAILED),
        ("leap", 60.0, False),
    ],
)
def test_no_history_of_keep_alives_and_cluster_answers_breaks_the_promises(
    clock_and_windows, start, history
):
    """Issue 26 "how to prove it stays fixed": keep-alives acknowledged or not (a slot lost by
    its ttl), slot and Pacemaker answers after restarts, reloads and restarts adding or
    removing cluster.pacemaker. No step raises, a poll is always ordered, no approval
    without a confirmed lease, and our mark on the cluster is kept until a restore succeeds."""
    h = ClusteredHistory(*clock_and_windows)
    due, method = start
    if method is not None:
        h.apply(("pacemaker", method, "reload"))
    h.apply(("add_due", "Reboot", (VM,), due))
    for step in history:
        h.apply(step)


# ---- the other parsers of untrusted input: the simulator's and etcd's ---------------------

start_requests_like = st.fixed_dictionaries(
    {},
    optional={
        "StartRequests": st.lists(
            json_values | st.fixed_dictionaries({}, optional={"EventId": json_values}), max_size=3
        )
        | json_values
    },
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256) | start_requests_like.map(lambda v: json.dumps(v).encode()))
def test_the_simulators_start_requests_parser_answers_ids_or_none(body):
    ids = _start_requests(body)
    assert ids is None or (ids and all(isinstance(i, str) and i for i in ids))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=1, max_value=20_000))
def test_deep_bodies_to_the_simulator_and_from_etcd_are_refused_not_crashed_on(depth):
    body = b"[" * depth + b"]" * depth
    assert _start_requests(body) is None
    assert etcd_decode(body) == {} or "message" in etcd_decode(body)
    assert state_of(b'{"state":' * depth) == ""


etcd_answers = st.fixed_dictionaries(
    {},
    optional={
        "header": st.fixed_dictionaries({}, optional={"revision": json_values}) | json_values,
        "kv": st.fixed_dictionaries({}, optional={"key": json_values, "value": json_values})
        | json_values,
        "type": st.sampled_from(["PUT", "DELETE"]) | json_values,
    },
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(etcd_answers, st.binary(max_size=64))
def test_any_etcd_answer_is_a_value_or_an_etcd_error(answer, value):
    revision: object
    try:
        revision = etcd_revision(answer)
    except EtcdError as e:
        revision = e.kind
    assert isinstance(revision, int) or revision == "bad_answer"
    change = etcd_change(answer)
    assert isinstance(change.key, str)
    assert change.value is None or isinstance(change.value, bytes)
    assert state_of(value) in ("", "ready", "failed")
