"""Review of the put-back of a shared event waiting for its peers (engine/postponed.py,
merge 0549f7d): histories that broke its promise (prepared again at the new lead, no VM
approved early, no VM drained for nothing), each fixed since. Fake clock."""

from __future__ import annotations

import json

from scheduledeventsd.engine import (
    Coordinate,
    HooksFinished,
    Outcome,
    Phase,
    SharedForgotten,
    SpawnHooks,
)
from scheduledeventsd.host import store
from tests.engine.test_engine import Machine, of
from tests.engine.test_engine_fleet import fleet
from tests.engine.test_engine_postponed import (
    EVENTS,
    LEAD,
    MONO0,
    UPCOMING_ID,
    Provider,
    config,
    window_at,
)
from tests.engine.test_engine_postponed import prepared as window_prepared
from tests.engine.test_engine_postponed import seen as seen_at
from tests.engine.test_engine_postponed_shared import RULE, coordinating, shared
from tests.engine.test_engine_when import seen


def test_a_restart_during_the_put_back_still_prepares_the_event_again_at_its_new_lead():
    """The daemon restarts (or is killed, or the VM reboots) while the cancelled-hooks of a
    shared event put back by a 3-day move run (state file: after, stage cancelled). Boot marks
    them cut off (after_hooks_interrupted, OVER), and OVER listed stays OVER: at the new lead
    this VM never runs its before-hooks and never writes `ready`, so vm-b and vm-c, drained
    again at that lead, wait for it until NotBefore, nobody approves, and the maintenance hits
    this VM's node undrained. Without the restart it is forgotten when its cancelled-hooks
    end (returned.came_back) and judged anew."""
    m = Machine(fleet(events={"Reboot": RULE}), now=MONO0)
    coordinating(m, shared(30 * 60))
    moved = shared(3 * 86400)
    seen(m, moved, incarnation=3, at=MONO0 + 60)
    (undrain,) = of(m.send(SharedForgotten("E1"), at=MONO0 + 61), SpawnHooks)  # etcd confirmed
    assert undrain.stage.value == "cancelled"
    loaded = store._decode(json.loads(json.dumps(store._encode(m.state.events))))
    again = Machine(fleet(events={"Reboot": RULE}), loaded=loaded, now=MONO0 + 70)
    seen(again, moved, incarnation=3, at=MONO0 + 71)
    lead_at = MONO0 + 3 * 86400 - LEAD
    seen(again, moved, incarnation=3, at=lead_at - 60)
    before = of(again.tick(lead_at), SpawnHooks)
    assert [s.stage.value for s in before] == ["before"], "drained again at its new lead"
    (drain,) = before
    effects = again.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=lead_at + 1)
    assert of(effects, Coordinate), "its ready written again for the new round"
    assert again.phase() is Phase.COORDINATING


def test_a_restart_during_a_windows_put_back_still_prepares_it_again_at_its_new_lead():
    """Google Cloud's upcoming window prepared, moved 3 days later (put back), the daemon
    restarted while its cancelled-hooks run: at the new lead it must be drained again."""
    cfg = config(events=EVENTS, provider=Provider.GCP)
    m = Machine(cfg, now=MONO0)
    window_prepared(m, window_at(30 * 60))
    moved = window_at(3 * 86400)
    seen_at(m, moved, incarnation=3, at=MONO0 + 60)
    loaded = store._decode(json.loads(json.dumps(store._encode(m.state.events))))
    again = Machine(cfg, loaded=loaded, now=MONO0 + 70)
    seen_at(again, moved, incarnation=3, at=MONO0 + 71)
    lead_at = MONO0 + 3 * 86400 - LEAD
    seen_at(again, moved, incarnation=3, at=lead_at - 60)
    assert [s.stage.value for s in of(again.tick(lead_at), SpawnHooks)] == ["before"]
    assert again.phase(UPCOMING_ID) is Phase.RUNNING
