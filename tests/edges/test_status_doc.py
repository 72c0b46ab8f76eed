"""`scheduledeventsd status` reads the status document back through one check of its shape
(observe/status_doc.py): a status.json of another shape is "not a status document", never a
traceback in the printer; every document the observer writes passes the check."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import get_type_hints
from zoneinfo import ZoneInfo

import pytest

from scheduledeventsd.config import Concurrency, DrainMethod, HealthFrom, Limit, Pacemaker
from scheduledeventsd.engine import ClusterMark, Phase, Slot, Tracked
from scheduledeventsd.observe import report, status_doc
from scheduledeventsd.observe.observer import HookResult, Observer, Timeline, problems
from scheduledeventsd.observe.status_doc import checked
from scheduledeventsd.windows import Window
from tests.conftest import VM, cli
from tests.edges.test_observer import state_with
from tests.engine.test_engine import event


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ('{"events": [1]}', "written_at_unix: missing"),
        ('{"poll": 5}', "written_at_unix: missing"),
        ('{"written_at_unix": 1, "events": [1]}', "events[0]: a mapping expected, got int 1"),
        ('{"written_at_unix": 1, "poll": 5}', "poll: a mapping expected, got int 5"),
        (
            '{"written_at_unix": 1, "events": [{"hooks": [{"duration_s": "x"}]}]}',
            "events[0].hooks[0].duration_s: float expected, got a string",
        ),
        ('{"written_at_unix": 1e999}', "written_at_unix: float expected, got float inf"),
        (
            '{"written_at_unix": 1, "concurrency": {"held_for": "E1"}}',
            "concurrency.held_for: a list expected, got a string",
        ),
    ],
)
def test_a_status_file_of_another_shape_is_not_a_status_document_not_a_traceback(
    daemons, written, why
):
    """On the old code `{"events": [1]}` and `{"poll": 5}` raised AttributeError in the
    printer, a string duration ValueError; an infinite written_at_unix was shown as a status
    (an event's countdown from it raises OverflowError) and a string of events holding the
    slot was printed letter by letter ("held for E, 1"). The file is now checked where it is
    read, and the first key of another shape named."""
    path = daemons.write_config(daemons.config(vm_name=VM))
    daemons.state_dir.mkdir(mode=0o700)
    status_file = daemons.state_dir / "status.json"
    status_file.write_text(written)
    for args in ((), ("--json",)):
        shown = cli("status", "--config", str(path), *args)
        assert shown.returncode == 1, shown
        assert "Traceback" not in shown.stderr, shown.stderr
        assert shown.stdout == ""
        assert (
            f"error: no status: {status_file}: not a status document ({why}); "
            "is the daemon running?"
        ) in shown.stderr


def _everything() -> tuple[dict[str, object], float]:
    """A document with every part the observer writes: windows, two slot groups, a cluster
    with a mark, and an event in each phase with a hook result."""
    wall = 1_900_000_000.0
    tracked = [
        Tracked(event(f"E{k}"), phase, slot=Slot.HELD if k == 0 else Slot.NONE)
        for k, phase in enumerate(Phase)
    ]
    state = state_with(*tracked)
    config = dataclasses.replace(
        state.config,
        windows=(Window(frozenset({5}), dt.time(2), dt.time(5), ZoneInfo("Europe/Berlin")),),
        concurrency=Concurrency("web", 1, more=(Limit("zone-a", 2),)),
        cluster=Pacemaker(),
    )
    mark = ClusterMark(DrainMethod.HEALTH, "#health-scheduledevents")
    state = dataclasses.replace(state, config=config, slot_holders=("vm-b",), cluster_mark=mark)
    observer = Observer(wall - 60)
    observer.timelines["E0"] = Timeline(detected=wall - 10, approved=wall - 5)
    observer.hook_finished("E0", HookResult("drain", "before", "ok", 1.5))
    return observer.document(state, wall, HealthFrom.DETECTED), wall


def test_every_part_of_a_document_the_observer_writes_passes_the_check_and_prints():
    """The declared shape is the observer's: a document with every part, through JSON as
    status.json holds it, is let through whole and printed."""
    written, wall = _everything()
    read = checked(json.loads(json.dumps(written)))
    assert read == written
    for shape, part in (
        (status_doc.StatusDocument, read),
        (status_doc.EventStatus, read["events"][0]),
        (status_doc.Hook, read["events"][0]["hooks"][0]),
        (status_doc.Concurrency, read["concurrency"]),
        (status_doc.Pacemaker, read["pacemaker"]),
        (status_doc.Mark, read["pacemaker"]["marked"]),
    ):
        assert set(get_type_hints(shape)) == set(part), shape  # declared as written
    assert "drain: ok in 1.5s" in report.status(read, wall, problems(read, wall))
