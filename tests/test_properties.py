"""Property tests (hypothesis): untrusted input is typed data or a clear error, never a crash."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from pathlib import Path
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduledeventsd import config, engine
from scheduledeventsd.config import schema
from scheduledeventsd.coordination.etcd import EtcdError
from scheduledeventsd.coordination.etcd import _change as etcd_change
from scheduledeventsd.coordination.etcd import _decode as etcd_decode
from scheduledeventsd.coordination.etcd import _revision as etcd_revision
from scheduledeventsd.coordination.peers import state_of
from scheduledeventsd.engine import (
    ApprovalFailed,
    ApprovalSent,
    Boot,
    CoordinationFailed,
    DocumentFetched,
    Exit,
    HooksFinished,
    Outcome,
    PeersChanged,
    Persist,
    PollFailed,
    PostApproval,
    Reloaded,
    ReloadRequested,
    SlotBusy,
    SlotFailed,
    SlotGranted,
    SpawnHooks,
    StopRequested,
    Tick,
    Tracked,
)
from scheduledeventsd.lifecycle import Phase, Slot
from scheduledeventsd.model import Document, DocumentError, Event, parse_document
from scheduledeventsd.simulators.azure import _start_requests
from scheduledeventsd.when import lead
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
        parsed = config.parse(raw, "fuzz.yaml", check_files=False)
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
                assert n == 1, "after- or cancelled-hooks twice for one event"
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
        elif kind == "finish" and self.state.runs:
            runs = sorted(self.state.runs)
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


# 500: tests/test_promises.py holds the engine to the same promises and more, with a model.
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
        is now (#15: a step left it where the old clock put it)."""
        if self.state.stopping is not None or self.state.wall_offset is None:
            return
        for event_id, t in self.state.events.items():
            if t.phase is Phase.QUEUED and math.isfinite(t.start_at) and event_id in self.doc:
                not_before = self.doc[event_id].not_before
                assert not_before is not None
                wall_deadline = not_before.timestamp() - lead(self.cfg.events["Reboot"])
                assert abs(t.start_at + self.offset - wall_deadline) < 1.0, "deadline off"

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
