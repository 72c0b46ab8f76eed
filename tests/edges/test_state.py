"""State on disk: atomic, survives restarts, corrupt files kept aside, one daemon per dir."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys

import pytest

from scheduledeventsd.engine import Phase, Stage, Tracked
from scheduledeventsd.engine.lifecycle import DURABLE
from scheduledeventsd.host.store import STATE_FILE, StateError, StateStore
from scheduledeventsd.model import Event

EVENT = Event(
    "E1",
    "Reboot",
    "Scheduled",
    "VirtualMachine",
    ("vm",),
    dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone.utc),
    "desc",
    "Platform",
    30,
)


def test_saved_state_loads_back_equal(tmp_path):
    store = StateStore(tmp_path / "state")
    known = {"E1": Tracked(EVENT, Phase.APPROVED)}
    store.save(known)
    assert StateStore(tmp_path / "state").load() == (known, "")


def test_an_event_queued_again_after_a_restart_stays_prepared_across_the_next(tmp_path):
    """Its before-hooks had started: it is owed its stage, also after another restart; a file
    without the key (an older release's) reads it from the phase."""
    store = StateStore(tmp_path)
    requeued = Tracked(EVENT, Phase.QUEUED, prepared=True)
    queued = Tracked(dataclasses.replace(EVENT, event_id="E2"), Phase.QUEUED)
    store.save({"E1": requeued, "E2": queued})
    assert StateStore(tmp_path).load()[0] == {"E1": requeued, "E2": queued}
    raw = json.loads(store.path.read_text())
    raw["events"] = [{k: v for k, v in e.items() if k != "prepared"} for e in raw["events"]]
    raw["events"][1]["phase"] = "interrupted"
    store.path.write_text(json.dumps(raw))
    loaded = StateStore(tmp_path).load()[0]
    assert (loaded["E1"].prepared, loaded["E2"].prepared) == (False, True)


def test_no_file_is_an_empty_first_start(tmp_path):
    assert StateStore(tmp_path).load() == ({}, "")


def test_saving_leaves_no_temporary_files_and_replaces_atomically(tmp_path):
    store = StateStore(tmp_path)
    store.save({"E1": Tracked(EVENT, Phase.RUNNING)})
    inode = os.stat(store.path).st_ino
    store.save({})
    assert os.stat(store.path).st_ino != inode, "written to a new file, then renamed over"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert json.loads(store.path.read_text())["events"] == []


def test_a_corrupt_file_is_moved_aside_not_deleted(tmp_path):
    store = StateStore(tmp_path)
    store.path.write_text("{not json")
    known, problem = store.load()
    assert known == {}
    assert "moved to" in problem
    (aside,) = tmp_path.glob("state.json.corrupt-*")
    assert aside.read_text() == "{not json"
    assert store.load() == ({}, "")


def test_a_state_file_that_is_a_directory_is_moved_aside_and_saving_works_again(tmp_path):
    store = StateStore(tmp_path)
    store.path.mkdir()
    known, problem = store.load()
    assert known == {}
    assert "is a directory" in problem
    assert "moved to" in problem
    store.save({"E1": Tracked(EVENT, Phase.APPROVED)})
    assert StateStore(tmp_path).load() == ({"E1": Tracked(EVENT, Phase.APPROVED)}, "")


def test_a_save_that_cannot_write_raises_oserror_for_the_caller_to_report(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = StateStore(blocker / "state")  # a path through a regular file: ENOTDIR
    with pytest.raises(NotADirectoryError):
        store.save({"E1": Tracked(EVENT, Phase.APPROVED)})
    known, problem = store.load()
    assert known == {}
    assert "cannot read" in problem


def test_a_second_lock_on_the_same_directory_is_refused(tmp_path):
    first, second = StateStore(tmp_path), StateStore(tmp_path)
    first.lock()
    with pytest.raises(StateError, match="in use"):
        second.lock()
    first.unlock()
    second.lock()
    second.unlock()


def test_unchanged_state_is_not_rewritten(tmp_path):
    """Which events are durable is the engine's choice (`durable_events`, tested there)."""
    store = StateStore(tmp_path)
    ours = Tracked(EVENT, Phase.APPROVED)
    store.save({"E1": ours})
    assert StateStore(tmp_path).load() == ({"E1": ours}, "")
    written = os.stat(store.path).st_mtime_ns
    inode = os.stat(store.path).st_ino
    store.save({"E1": ours})
    assert (os.stat(store.path).st_ino, os.stat(store.path).st_mtime_ns) == (inode, written)


def test_an_unreadable_state_file_is_moved_aside_not_overwritten_by_the_next_save(tmp_path):
    """Unreadable is not absent: it may hold what a restart needs, for a person to recover."""
    (tmp_path / STATE_FILE).symlink_to(tmp_path / STATE_FILE)  # ELOOP, even for root
    known, problem = StateStore(tmp_path).load()
    assert known == {}
    assert "cannot read" in problem
    assert "moved to" in problem
    StateStore(tmp_path).save({"E1": Tracked(EVENT, Phase.APPROVED)})
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(f"{STATE_FILE}.corrupt-")]
    assert len(aside) == 1
    assert aside[0].is_symlink(), "the unreadable file itself, kept"


def test_a_dry_run_reports_a_corrupt_state_file_and_leaves_it_where_it_is(tmp_path):
    (tmp_path / STATE_FILE).write_text("{not json")
    known, problem = StateStore(tmp_path, read_only=True).load()
    assert known == {}
    assert "left as it is (dry run)" in problem
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]


@pytest.mark.parametrize(("owner", "mode"), [(65534, 0o700), (0, 0o777)])
def test_a_state_directory_others_can_write_is_refused(tmp_path, owner, mode):
    """Whoever can write the state can make the daemon skip an event's hooks."""
    directory = tmp_path / "state"
    directory.mkdir()
    os.chown(directory, owner, -1)
    directory.chmod(mode)
    with pytest.raises(StateError, match="only the daemon's own user may write its state"):
        StateStore(directory).lock()


def test_the_cluster_mark_is_saved_and_loaded_back_until_it_is_taken_off(tmp_path):
    """Issue 26 #8: what the daemon set on its Pacemaker node outlives a restart."""
    from scheduledeventsd.config import DrainMethod  # noqa: PLC0415
    from scheduledeventsd.engine import ClusterMark  # noqa: PLC0415

    mark = ClusterMark(DrainMethod.STANDBY, "#health-scheduledevents")
    StateStore(tmp_path).save({}, mark)
    again = StateStore(tmp_path)
    assert again.load() == ({}, "")
    assert (again.cluster_mark, again.mark_unrecorded) == (mark, False)
    again.save({}, None)
    assert json.loads(again.path.read_text())["cluster_mark"] is None
    last = StateStore(tmp_path)
    last.load()
    assert last.cluster_mark is None


def test_a_file_from_before_marks_were_kept_with_a_drained_event_says_so(tmp_path):
    """Upgraded mid-drain: the old daemon marked the node (it took off whatever it found)."""
    from scheduledeventsd.engine.lifecycle import Drain  # noqa: PLC0415

    store = StateStore(tmp_path)
    store.save({"E1": Tracked(EVENT, Phase.APPROVED, drain=Drain.DONE)})
    raw = json.loads(store.path.read_text())
    del raw["cluster_mark"]
    store.path.write_text(json.dumps(raw))
    old = StateStore(tmp_path)
    old.load()
    assert (old.cluster_mark, old.mark_unrecorded) == (None, True)


# What the previous release reads of this one's file (a rollback): it runs from its own tree.
READ_BY_PREVIOUS = """
import json, sys
from pathlib import Path
from scheduledeventsd.state import StateStore
known, problem = StateStore(Path(sys.argv[1]), read_only=True).load()
print(json.dumps({
    "problem": problem,
    "phases": {k: t.phase.value for k, t in known.items()},
    "drains": {k: t.drain.value for k, t in known.items()},
}))
"""


def read_by_previous(previous_release, directory):
    """`load` of the previous release's code on `directory` (cwd elsewhere, its tree first)."""
    out = subprocess.run(
        [sys.executable, "-c", READ_BY_PREVIOUS, str(directory)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(previous_release)},
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def test_every_phase_this_release_saves_is_read_by_the_previous_release(tmp_path, previous_release):
    """Review of issue 26: after a rollback the previous release moved the state file aside
    (state_degraded: 'rebooted' is not a valid Phase) and ran before-hooks again. Every phase
    is written in a form it reads (`rebooted` as `interrupted`: prepared on an older boot, so
    it takes that boot as the maintenance, its own rule; `gated`, held at a gate it may not
    have, as `waiting`: placed again by the next document, then into the gates it knows), and
    this release reads it back."""
    known = {
        phase.value: Tracked(dataclasses.replace(EVENT, event_id=phase.value), phase, boot_id="b")
        for phase in DURABLE
    }
    StateStore(tmp_path).save(known)
    read = read_by_previous(previous_release, tmp_path)
    assert read["problem"] == ""
    written_as = {"rebooted": "interrupted", "gated": "waiting"}
    assert read["phases"] == {p: written_as.get(p, p) for p in known}
    assert StateStore(tmp_path).load() == (known, ""), "read back as it was"


def test_a_newer_phase_this_release_does_not_know_is_read_as_the_phase_written_beside_it(
    tmp_path,
):
    store = StateStore(tmp_path)
    store.save({"E1": Tracked(EVENT, Phase.REBOOTED, boot_id="boot-1")})
    raw = json.loads(store.path.read_text())
    assert (raw["events"][0]["phase"], raw["events"][0]["newer_phase"]) == (
        "interrupted",
        "rebooted",
    )
    raw["events"][0]["newer_phase"] = "some_later_phase"
    store.path.write_text(json.dumps(raw))
    known, problem = StateStore(tmp_path).load()
    assert (problem, known["E1"].phase) == ("", Phase.INTERRUPTED)


def test_a_state_file_of_a_newer_version_is_moved_aside_saying_so(tmp_path):
    store = StateStore(tmp_path)
    store.path.write_text(json.dumps({"version": 3, "events": []}))
    known, problem = StateStore(tmp_path).load()
    assert known == {}
    assert "a version 3 state file, written by a newer scheduledeventsd" in problem
    assert "moved to" in problem
    assert list(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))


def test_a_restore_in_flight_is_written_as_drained_so_a_restart_asks_for_it_again(tmp_path):
    """`restoring` (the after-hooks wait for RestoreNode's answer) means after a restart what
    `drained` means for an event that is over: the node is restored then. Written so, the
    previous release reads it too (it knows no `restoring`)."""
    from scheduledeventsd.engine.lifecycle import Drain  # noqa: PLC0415

    store = StateStore(tmp_path)
    store.save({"E1": Tracked(EVENT, Phase.AFTER, drain=Drain.RESTORING)})
    assert json.loads(store.path.read_text())["events"][0]["drain"] == "drained"
    known, problem = StateStore(tmp_path).load()
    assert (problem, known["E1"].drain) == ("", Drain.DONE)


def test_every_drain_this_release_saves_is_read_by_the_previous_release(tmp_path, previous_release):
    """Review of issue 27: `restoring` (a restore asked, the after-hooks waiting for its answer)
    is new; written as `drained`, the previous release reads the file (it would have moved it
    aside, 'restoring' is not a valid Drain) and restores the node after its restart, as for
    any event over with the node drained."""
    from scheduledeventsd.engine.lifecycle import Drain  # noqa: PLC0415

    known = {
        d.name: Tracked(dataclasses.replace(EVENT, event_id=d.name), Phase.AFTER, drain=d)
        for d in Drain
    }
    StateStore(tmp_path).save(known)
    read = read_by_previous(previous_release, tmp_path)
    assert read["problem"] == ""
    assert read["drains"] == {d.name: "drained" if d is Drain.RESTORING else d.value for d in Drain}


def test_a_gates_own_slice_is_saved_and_loaded_back_and_read_by_the_previous_release(
    tmp_path, previous_release
):
    """A gate without a field of its own in Tracked keeps its slice in `Tracked.gates`, which
    the store saves for every gate as it is (no edit of the store per gate); the previous
    release, which knows no `gates`, reads the file all the same, and a file without them (every
    older one) loads with none."""
    known = {"E1": Tracked(EVENT, Phase.RUNNING, gates=(("cordon", "done"), ("toy", "passed")))}
    StateStore(tmp_path).save(known)
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    assert raw["events"][0]["gates"] == {"cordon": "done", "toy": "passed"}
    assert StateStore(tmp_path).load() == (known, "")
    read = read_by_previous(previous_release, tmp_path)
    assert (read["problem"], read["phases"]) == ("", {"E1": "running"})
    del raw["events"][0]["gates"]
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    assert StateStore(tmp_path).load() == ({"E1": Tracked(EVENT, Phase.RUNNING)}, "")


def test_a_gates_slice_that_is_not_names_to_states_moves_the_file_aside(tmp_path):
    StateStore(tmp_path).save({"E1": Tracked(EVENT, Phase.RUNNING, gates=(("toy", "x"),))})
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    raw["events"][0]["gates"] = {"toy": 1}
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    known, problem = StateStore(tmp_path).load()
    assert known == {}
    assert "gates must map each gate's name to its state" in problem


def test_an_event_that_left_is_saved_as_such_and_read_by_the_previous_release(
    tmp_path, previous_release
):
    """`left` (engine/returned.py): a restart while its stage is owed still takes its coming
    back as a new maintenance; the previous release reads the file all the same, and older
    files (without the key) load it as not left."""
    known = {"E1": Tracked(EVENT, Phase.AFTER, prepared=True, left=True)}
    StateStore(tmp_path).save(known)
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    assert raw["events"][0]["left"] is True
    assert StateStore(tmp_path).load() == (known, "")
    read = read_by_previous(previous_release, tmp_path)
    assert (read["problem"], read["phases"]) == ("", {"E1": "after"})
    del raw["events"][0]["left"]
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    assert StateStore(tmp_path).load()[0]["E1"].left is False
    raw["events"][0]["left"] = "yes"
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    assert "left must be true or false" in StateStore(tmp_path).load()[1]


def test_an_event_whose_undo_waits_for_etcd_is_saved_as_such_and_older_files_load_it(
    tmp_path, previous_release
):
    """`unmarking` (engine/postponed.py): a restart while a put-back shared event waits for
    etcd to confirm its ready deleted still waits (and asks again); the previous release reads
    the file all the same, and files without the key load it as not waiting."""
    known = {
        "E1": Tracked(EVENT, Phase.AFTER, stage=Stage.CANCELLED, prepared=True, unmarking=True)
    }
    StateStore(tmp_path).save(known)
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    assert raw["events"][0]["unmarking"] is True
    assert StateStore(tmp_path).load() == (known, "")
    read = read_by_previous(previous_release, tmp_path)
    assert (read["problem"], read["phases"]) == ("", {"E1": "after"})
    del raw["events"][0]["unmarking"]
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    assert StateStore(tmp_path).load()[0]["E1"].unmarking is False
    raw["events"][0]["unmarking"] = 1
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    assert "unmarking must be true or false" in StateStore(tmp_path).load()[1]


@pytest.fixture
def toy_gate(monkeypatch):
    """The pipeline with tests/engine's holding gate, which keeps its slice in Tracked.gates."""
    from scheduledeventsd.engine.gates import onward, pipeline  # noqa: PLC0415
    from tests.engine.test_engine_gated import composed_with, holding_gate  # noqa: PLC0415

    composed_with(monkeypatch, holding_gate([]))
    try:
        yield
    finally:
        onward.link(pipeline.GATES)


def test_a_gate_slice_in_a_state_its_gate_does_not_have_is_dropped_at_load_not_raised_in_a_step(
    tmp_path, toy_gate
):
    """A hand-edited state file: the event held by a known gate, its slice in a state that gate
    has not. Before: loaded as it was, and the first step (the gate asks again at the boot)
    raised ValueError. Now: dropped at load and said (state_repaired); the event waits again,
    placed by the next document, and no step raises (a strict engine would)."""
    from scheduledeventsd.engine import Boot, DocumentFetched, initial, step  # noqa: PLC0415
    from scheduledeventsd.records import Record  # noqa: PLC0415
    from tests.engine.test_engine import config, doc  # noqa: PLC0415
    from tests.engine.test_engine_gated import NAME  # noqa: PLC0415

    entry = {"phase": "waiting", "newer_phase": "gated", "event": EVENT.to_json(),
             "boot_id": "boot-1", "rule": "", "stage": "before", "slot": "", "drain": "",
             "vm_name": "vm", "incarnation": 2, "prepared": False, "gated": NAME,
             "gates": {NAME: "bogus", "other": "kept"}}  # fmt: skip
    (tmp_path / STATE_FILE).write_text(json.dumps({"version": 2, "events": [entry]}))
    store = StateStore(tmp_path)
    known, problem = store.load()
    assert problem == ""
    tracked = known["E1"]
    assert tracked.gates == (("other", "kept"),), "an unknown gate's slice is kept as it is"
    assert (tracked.phase, tracked.gated) == (Phase.WAITING, "")
    (repair,) = store.repaired
    assert "gates.toyhold: 'bogus' is not a state of that gate ('asked', 'passed')" in repair
    state = initial(config(vm_name="vm"), strict=True)
    state, effects = step(state, Boot(known, problem, "boot-1", repaired=store.repaired), 100.0)
    (said,) = [e for e in effects if isinstance(e, Record) and e.name == "state_repaired"]
    assert said.fields["error"] == repair
    fetched = DocumentFetched(doc(EVENT, incarnation=3), EVENT.not_before.timestamp() - 3600)
    state, _ = step(state, fetched, 101.0)
    assert state.events["E1"].gated == NAME, "the gate holds it again, asked anew"


def test_a_known_gates_slice_in_an_unknown_state_is_dropped_for_an_event_it_does_not_hold(
    tmp_path,
):
    """The pipeline's own gates (window, queued, drain) are known too: a slice under one of
    their names in a state it has not is dropped; the event is otherwise read as it was."""
    StateStore(tmp_path).save({"E1": Tracked(EVENT, Phase.RUNNING)})
    raw = json.loads((tmp_path / STATE_FILE).read_text())
    raw["events"][0]["gates"] = {"drain": "sideways"}
    (tmp_path / STATE_FILE).write_text(json.dumps(raw))
    store = StateStore(tmp_path)
    assert store.load() == ({"E1": Tracked(EVENT, Phase.RUNNING)}, "")
    (repair,) = store.repaired
    assert repair.startswith("E1: gates.drain: 'sideways' is not a state of that gate (")
