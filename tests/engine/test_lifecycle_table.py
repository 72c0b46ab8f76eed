"""The lifecycle table is the one place a phase changes, is itself well formed, and is what the
docs/reference/lifecycle.md, the man page and the diagram say."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from scheduledeventsd import engine
from scheduledeventsd.engine import lifecycle
from scheduledeventsd.engine.lifecycle import (
    DURABLE,
    ROWS,
    TABLE,
    IllegalTransitionError,
    On,
    Phase,
)
from scheduledeventsd.records import What

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / "scheduledeventsd" / "engine"


def _engine_source() -> str:
    """Every module of the engine package, as one text."""
    return "\n".join(p.read_text() for p in sorted(ENGINE.rglob("*.py")))


def test_the_readme_the_man_page_and_the_diagram_are_generated_from_the_table():
    """docs/lifecycle.py --check fails when any of them is stale."""
    done = subprocess.run(
        [sys.executable, "docs/lifecycle.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_readme_table_is_caught(tmp_path):
    """The check is not vacuous: one changed word in the docs page's table fails it."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import lifecycle as generator  # noqa: PLC0415 - docs/lifecycle.py, the generator
    finally:
        sys.path.pop(0)
    text = (ROOT / "docs/reference/lifecycle.md").read_text()
    assert generator.readme(text) == text
    stale = text.replace("| listed again |", "| listed anew |", 1)
    assert generator.readme(stale) != stale


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    yield node.name, call


def test_only_move_changes_a_phase_in_the_engine():
    """No `phase=` outside `_move`, and a Tracked is only ever created NEW (or by the store)."""
    tree = ast.parse(_engine_source())
    offenders = []
    for function, call in _calls(tree):
        name = getattr(call.func, "id", "")
        sets_phase = name == "replace" and any(k.arg == "phase" for k in call.keywords)
        if sets_phase and function != "_move":
            offenders.append(f"{function}: replace(..., phase=...)")
        if name == "Tracked":
            phase = call.args[1] if len(call.args) > 1 else None
            if not (isinstance(phase, ast.Attribute) and phase.attr == "NEW"):
                offenders.append(f"{function}: Tracked(...) not NEW")
    assert not offenders


def test_every_phase_but_the_pseudo_ones_is_reached_from_new_and_leads_on():
    reached, frontier = {Phase.NEW}, [Phase.NEW]
    while frontier:
        source = frontier.pop()
        for (phase, _), targets in TABLE.items():
            if phase is source:
                for target in targets - reached:
                    reached.add(target)
                    frontier.append(target)
    assert reached == set(Phase)
    sources = {phase for phase, _ in TABLE}
    assert set(Phase) - sources == {Phase.GONE}, "only gone is final"


@pytest.mark.parametrize("phase", sorted(DURABLE, key=lambda p: p.value))
def test_every_phase_a_state_file_can_hold_says_what_a_restart_and_a_reboot_do(phase):
    assert (phase, On.RESTARTED) in TABLE
    assert (phase, On.REBOOTED) in TABLE


def test_every_listed_phase_says_what_a_document_listing_it_again_and_its_departure_do():
    for phase in set(Phase) - {Phase.NEW, Phase.GONE}:
        for on in (On.LISTED, On.STARTED, On.LEFT):
            assert (phase, on) in TABLE, (phase, on)


def test_a_transition_the_table_does_not_declare_is_refused():
    with pytest.raises(IllegalTransitionError, match="only"):
        lifecycle.check(Phase.APPROVED, On.LISTED, Phase.RUNNING)
    with pytest.raises(IllegalTransitionError, match="nothing is declared"):
        lifecycle.check(Phase.OVER, On.HOOKS_OK, Phase.APPROVING)


def test_rows_document_each_pair_and_every_row_is_used():
    assert all(row.does for row in ROWS)
    assert {(r.source, r.on) for r in ROWS} == set(TABLE)


def test_every_record_the_engine_can_emit_is_named_in_the_engine():
    """No dead record names: each What is emitted by some rule."""
    text = _engine_source()
    unused = [w for w in What if f"What.{w.name}" not in text]
    assert not unused


def test_a_refused_transition_in_production_drops_the_message_and_says_so():
    """Not strict (the daemon): the events stay as they were, `transition_refused` is logged
    and counted as a fault."""
    from tests.engine.test_engine import config, doc, event  # noqa: PLC0415

    state = engine.initial(config())
    state, _ = engine.step(state, engine.Boot({}, "", "b"), 0.0)
    state, _ = engine.step(state, engine.DocumentFetched(doc(event())), 1.0)
    broken = dict(engine._HANDLERS)

    def approve_twice(state, msg, now, out):
        tracked = state.events["E1"]
        return engine._with(state, "E1", engine._move(tracked, On.ACCEPTED, Phase.APPROVED))

    engine._HANDLERS[engine.Tick] = approve_twice  # type: ignore[index]
    try:
        after, effects = engine.step(state, engine.Tick(), 2.0)
    finally:
        engine._HANDLERS.clear()  # type: ignore[attr-defined]
        engine._HANDLERS.update(broken)  # type: ignore[attr-defined]
    assert after.events is state.events, "the events stay as they were"
    assert after.faults == state.faults + 1, "counted as a defect: status says DEGRADED"
    refused = [e for e in effects if isinstance(e, engine.Record)]
    assert [r.name for r in refused] == ["transition_refused"]
    assert "running: nothing is declared for 'approval accepted'" in str(refused[0].fields["error"])


def test_a_document_refused_whole_is_said_once_and_refused_quietly_when_served_again():
    """The poll after a refusal (2 s) reads the same document: refused again, counted each
    time (faults), said once per incarnation; another document is said, and handled if it
    can be. Before: transition_refused at every poll for as long as IMDS served it."""
    from tests.engine.test_engine import config, doc, event  # noqa: PLC0415

    handled = engine._HANDLERS[engine.DocumentFetched]

    def approve_before_hooks(state, msg, now, out):
        state = handled(state, msg, now, out)
        if "BAD" not in {e.event_id for e in msg.document.events}:
            return state
        tracked = state.events["BAD"]
        return engine._with(state, "BAD", engine._move(tracked, On.ACCEPTED, Phase.APPROVED))

    def said(effects):
        return [e.fields for e in effects if isinstance(e, engine.Record)
                and e.name == "transition_refused"]  # fmt: skip

    state = engine.initial(config())
    state, _ = engine.step(state, engine.Boot({}, "", "b"), 0.0)
    engine._HANDLERS[engine.DocumentFetched] = approve_before_hooks  # type: ignore[index]
    try:
        bad = engine.DocumentFetched(doc(event("BAD"), incarnation=7))
        state, effects = engine.step(state, bad, 1.0)
        assert [f["incarnation"] for f in said(effects)] == [7]
        for at in (3.0, 5.0, 7.0):
            state, effects = engine.step(state, bad, at)
            assert not said(effects), "the same document: refused quietly"
        assert state.faults == 4, "each refusal counted: status says DEGRADED"
        assert "BAD" not in state.events
        other = engine.DocumentFetched(doc(event("BAD"), event("E2"), incarnation=8))
        state, effects = engine.step(state, other, 9.0)
        assert [f["incarnation"] for f in said(effects)] == [8], "another document: said"
        state, effects = engine.step(state, engine.DocumentFetched(doc(incarnation=9)), 11.0)
        assert not said(effects)
        assert state.incarnation == 9, "a document that can be handled is"
    finally:
        engine._HANDLERS[engine.DocumentFetched] = handled  # type: ignore[index]
