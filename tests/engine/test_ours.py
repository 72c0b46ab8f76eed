"""The timers and couplings scan only this VM's events (`state.ours`): the other VMs' events,
most of a document under churn, are left out of every scan. Proven here: for each timer and
coupling, scanning every event does exactly what scanning ours does, even with other VMs'
events carrying every slot and drain a scan looks for; a timer declared for their phase is
refused. And `Events`, which keeps `ours` once derived, can never change under it. Fake clock."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import pytest

import scheduledeventsd.engine.state as state_module
from scheduledeventsd.config import Concurrency, Coordination, Etcd
from scheduledeventsd.engine import Notify, Phase, Slot, SlotGranted, Tick, Tracked, step
from scheduledeventsd.engine.component import Timers
from scheduledeventsd.engine.compose import composed
from scheduledeventsd.engine.gates import pipeline
from scheduledeventsd.engine.lifecycle import Drain, Stage
from scheduledeventsd.engine.state import Events, ours
from tests.engine.test_engine import VM, Machine, doc, event, logs
from tests.engine.test_engine_cluster import MONO0, _over_holding_a_slot, due_in, machine, seen

SLOTS = {
    "coordination": Coordination(etcd=Etcd(endpoints=("http://127.0.0.1:2379",))),
    "concurrency": Concurrency("web", 1),
}


def _others() -> dict[str, Tracked]:
    """Other VMs' events with every slot and drain, due long ago, as no table makes them."""
    found = {}
    for i, (slot, drain) in enumerate(itertools.product(Slot, Drain)):
        other = event(f"O{i}", resources=("other-vm",))
        found[other.event_id] = Tracked(
            other, Phase.NOT_OURS, slot=slot, drain=drain, stage=Stage.AFTER, prepared=True
        )
    return found


def _waiting() -> Machine:
    m = machine(config=SLOTS)
    seen(m, due_in(3 * 86400))  # queued for its slot
    return m


def _draining() -> Machine:
    m = _waiting()
    m.send(SlotGranted("E1"), at=MONO0 + 1)
    return m


def _lead_time() -> Machine:
    m = machine()
    seen(m, due_in(3 * 86400))
    return m


def _ticks(m: Machine) -> list[object]:
    """What Ticks through every deadline do, from `m` with the other VMs' events added."""
    state = m.state
    state = dataclasses.replace(state, events={**state.events, **_others()})
    seen_ = []
    for later in (1.0, 61.0, 700.0, 4000.0, 3 * 86400.0):
        state, effects = step(state, Tick(), m.now + later)
        # Not the status line: it counts ours, so all events there are more.
        seen_.append((dict(state.events), [e for e in effects if not isinstance(e, Notify)]))
    return seen_


@pytest.mark.parametrize("history", [_lead_time, _waiting, _draining, _over_holding_a_slot])
def test_scanning_every_event_does_what_scanning_ours_does(history, monkeypatch):
    ours_only = _ticks(history())
    monkeypatch.setattr(state_module, "_ours", lambda events: tuple(events.items()))
    assert _ticks(history()) == ours_only


def test_ours_are_the_events_not_ours_in_their_order_derived_once():
    mine = Tracked(event("E1"), Phase.WAITING)
    later = Tracked(event("E2"), Phase.AFTER)
    events = Events({**_others(), "E1": mine, "O": Tracked(event("O"), Phase.NOT_OURS)})
    events = Events({**events, "E2": later})
    assert events.ours() == (("E1", mine), ("E2", later))
    assert events.ours() is events.ours()
    assert ours(dict(events)) == events.ours()


@pytest.mark.parametrize(
    "change",
    [
        lambda e: e.__setitem__("E9", None),
        lambda e: e.__delitem__("E1"),
        lambda e: e.update({}),
        lambda e: e.pop("E1"),
        lambda e: e.popitem(),
        lambda e: e.setdefault("E9", None),
        lambda e: e.clear(),
        lambda e: e.__ior__({}),
    ],
)
def test_events_never_change_once_built(change):
    events = Events({"E1": Tracked(event("E1"), Phase.WAITING)})
    with pytest.raises(TypeError, match="never changed"):
        change(events)
    assert list(events) == ["E1"]


def test_a_timer_for_another_vms_event_is_refused_at_composition():
    """next_wakeup reads only ours: a timer declared for NOT_OURS events would never be waited
    for, so the composition refuses it."""
    window = pipeline.GATES[0]
    timers = (Timers("others", None, None, lambda *_: 0.0, frozenset({Phase.NOT_OURS})),)
    with pytest.raises(ValueError, match="another VM's event"):
        composed((dataclasses.replace(window, timers=timers),))
    composed((window,))


def test_events_copy_whole():
    """copy and deepcopy (and pickle) rebuild them whole, not item by item, which they refuse."""
    events = Events({"E1": Tracked(event("E1"), Phase.WAITING)})
    for again in (copy.copy(events), copy.deepcopy(events)):
        assert type(again) is Events
        assert again == events
        assert again.ours() == events.ours()


def test_another_vms_event_listed_again_as_it_was_is_kept_and_a_change_is_still_judged():
    """The document's loop keeps another VM's event listed again unchanged as it was, at once
    (events._on_document); a new status is taken, and Resources now naming this VM judge it
    anew, as at first sight."""
    m = Machine()
    m.fetched(doc(event("E1", resources=("other-vm",))), at=101.0)
    kept = m.state.events["E1"]
    assert kept.phase is Phase.NOT_OURS
    m.fetched(doc(event("E1", resources=("other-vm",)), incarnation=3), at=102.0)
    assert m.state.events["E1"] is kept
    started = event("E1", status="Started", resources=("other-vm",))
    m.fetched(doc(started, incarnation=4), at=103.0)
    assert m.state.events["E1"].event == started
    assert m.state.events["E1"].phase is Phase.NOT_OURS
    m.fetched(doc(event("E1", resources=("other-vm", VM)), incarnation=5), at=104.0)
    assert m.state.events["E1"].phase is not Phase.NOT_OURS
    assert "event_detected" in logs(m.effects)
