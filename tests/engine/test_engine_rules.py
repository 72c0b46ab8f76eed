"""The rules the engine package keeps (issue 27), each held by a test here: every per-event
machine changes only through its declared table; every message has one owner, every effect one
executor in the daemon and one failure message; every component's timers reach next_wakeup only
through its due(); no engine module is over 400 lines."""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
from pathlib import Path
from typing import get_args

import pytest

from scheduledeventsd.engine import (
    Drain,
    Hold,
    IllegalTransitionError,
    Phase,
    Slot,
    Tracked,
    compose,
    machine,
    runs,
)
from scheduledeventsd.engine.component import Gate, Timers, gate_move, gate_state
from scheduledeventsd.engine.gates import drain, onward, pipeline, slot, window
from scheduledeventsd.engine.vocabulary.effects import (
    FAILURE,
    Effect,
    GateEffect,
    Persist,
    SpawnHooks,
)
from scheduledeventsd.engine.vocabulary.messages import GateMessage, Message
from scheduledeventsd.host.hooks import ProcessRunner
from scheduledeventsd.runtime import executors
from tests.engine.test_engine import Machine, config, doc, event

ROOT = Path(__file__).parents[2]
ENGINE = ROOT / "scheduledeventsd" / "engine"
MAX_LINES = 400


def _modules():
    return sorted(ENGINE.rglob("*.py"))


# ---- (5) no engine module over 400 lines ---------------------------------------------------


def test_no_engine_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := _lines(p)) > MAX_LINES}
    assert not long


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


# ---- (2) every per-event machine changes only through its table ----------------------------

# The field each machine keeps in a Tracked -> the one function that may change it.
MOVES = {"phase": "_move", "slot": "move", "drain": "move", "window": "move", "gates": "gate_move"}
OWNERS = {
    "phase": "state.py",
    "slot": "slot.py",
    "drain": "drain.py",
    "window": "window.py",
    "gates": "component.py",  # every other gate's slice (Tracked.gates)
}
# What the state file keeps, and what decides whether it is written: a projection without the
# slices it does not keep (the window gate's), not a move of them.
VIEWS = {("notes.py", "_durable_view"), ("notes.py", "durable_events")}


def _bare_moves(source: str, filename: str) -> list[str]:
    """Each change of a machine's field outside its own move(): replace(..., slot=...) or a
    field passed through another machine's move (_move(..., drain=...))."""
    offenders = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef):
            continue
        for call in ast.walk(function):
            if not isinstance(call, ast.Call):
                continue
            name = getattr(call.func, "id", getattr(call.func, "attr", ""))
            for keyword in call.keywords:
                field = keyword.arg
                if field not in MOVES or name not in ("replace", "_move", "move"):
                    continue
                own = function.name == MOVES[field] and filename == OWNERS[field]
                view = (filename, function.name) in VIEWS and field == "window"
                if not ((own or view) and name == "replace"):
                    offenders.append(f"{filename}:{function.name}: {name}(..., {field}=...)")
    return offenders


def test_every_per_event_machine_changes_only_through_its_table():
    offenders = []
    for path in _modules():
        offenders += _bare_moves(path.read_text(), path.name)
    assert not offenders


def test_a_bare_move_planted_in_a_copy_is_caught():
    """The check is not vacuous: a slot set by hand, or passed through the phase's move, fails."""
    planted = "def f(t):\n    return replace(t, slot=Slot.HELD)\n"
    assert _bare_moves(planted, "slot.py") == ["slot.py:f: replace(..., slot=...)"]
    through = "def g(t):\n    return _move(t, On.SLOT, Phase.RUNNING, drain=Drain.NONE)\n"
    assert _bare_moves(through, "events.py") == ["events.py:g: _move(..., drain=...)"]


def test_a_gate_move_its_table_does_not_declare_raises_as_a_phase_move_does():
    tracked = Tracked(event(), Phase.QUEUED)
    with pytest.raises(IllegalTransitionError, match="slot none: nothing is declared"):
        slot.move(tracked, slot.SlotOn.GRANTED, Slot.HELD)
    with pytest.raises(IllegalTransitionError, match="only to"):
        slot.move(tracked, slot.SlotOn.ASK, Slot.HELD)
    with pytest.raises(IllegalTransitionError, match="drain none: nothing is declared"):
        drain.move(tracked, drain.DrainOn.RESTORED, Drain.NONE)
    with pytest.raises(IllegalTransitionError, match="window none: nothing is declared"):
        window.move(tracked, window.WindowOn.OPENED, Hold.OPEN)
    assert slot.move(tracked, slot.SlotOn.ASK, Slot.ASKED).slot is Slot.ASKED


GATES = ((window.TABLE, Hold.NONE), (slot.TABLE, Slot.NONE), (drain.TABLE, Drain.NONE))


def test_every_gate_with_a_table_is_in_the_pipeline_that_the_docs_draw():
    """A gate module declaring a TABLE or a GATE is in gates/pipeline.GATES, in the order an event
    passes them; compose and docs/lifecycle.py read the gates from that list, so none is left
    out."""
    modules = [_module_of(path) for path in sorted((ENGINE / "gates").glob("*.py"))]
    tables = {id(m.TABLE) for m in modules if "\nTABLE = " in inspect.getsource(m)}
    gates = [m.GATE for m in modules if "\nGATE = " in inspect.getsource(m)]
    assert {id(gate.table) for gate in pipeline.GATES} == tables
    assert set(map(id, pipeline.GATES)) == set(map(id, gates))
    assert [gate.table for gate in pipeline.GATES] == [table for table, _ in GATES]
    assert [gate.name for gate in pipeline.GATES] == [gate.table.name for gate in pipeline.GATES]


def test_every_state_of_a_gate_is_reached_from_none():
    for table, none in GATES:
        reached, frontier = {none}, [none]
        while frontier:
            source = frontier.pop()
            for (state, _), targets in table.moves.items():
                if state is source:
                    frontier += list(targets - reached)
                    reached |= targets
        assert reached == set(type(none)), table.name


def test_every_gate_row_is_on_the_lifecycle_page():
    """docs/lifecycle.py draws the gates' tables with the phase's (its --check is run in
    test_lifecycle_table): each row's words are on the lifecycle reference page."""
    readme = (ROOT / "docs" / "reference" / "lifecycle.md").read_text()
    for table, _ in GATES:
        for row in table.rows:
            assert f"| {row.on.value} |" in readme, (table.name, row)
            assert row.does in readme, (table.name, row)


# ---- (3) one owner per message, one executor and one failure message per effect ------------


def _ours(base: type) -> set[type]:
    """Every subclass of `base` the package declares (not this test's toy gate's)."""
    found, frontier = set(), [base]
    while frontier:
        for sub in frontier.pop().__subclasses__():
            frontier.append(sub)
            if sub.__module__.startswith("scheduledeventsd."):
                found.add(sub)
    return found


def test_every_message_has_one_owner_in_the_engine():
    """The components' own messages are `Message`'s members; each gate's (GateMessage) are
    handled by the one gate that declares a handler for it."""
    own = {m for m in get_args(Message) if m is not GateMessage}
    by_gates = [m for gate in pipeline.GATES for m in gate.handlers]
    assert sorted(m.__name__ for m in by_gates) == sorted(m.__name__ for m in _ours(GateMessage))
    assert set(compose._HANDLERS) == own | set(by_gates)
    assert not own & set(by_gates)
    for message, handler in compose._HANDLERS.items():
        assert handler.__module__.startswith("scheduledeventsd.engine."), message


def _daemon() -> ast.Module:
    (path,) = [p for p in (ROOT / "scheduledeventsd").rglob("daemon.py")]
    return ast.parse(path.read_text())


def _method(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _branches(function: ast.FunctionDef):
    """(the effect types an `isinstance(effect, ...)` test names, the branch's body)."""
    for node in ast.walk(function):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Call):
            call = node.test
            if getattr(call.func, "id", "") == "isinstance" and ast.unparse(call.args[0]) == (
                "effect"
            ):
                kinds = call.args[1]
                names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
                yield [ast.unparse(n) for n in names], node.body


def test_every_effect_has_one_executor_in_the_daemon():
    """Each effect in exactly one branch of Daemon._do, or carried out by the one executor wired
    in runtime/executors.WIRED that declares it; every gate's effects are an executor's."""
    named: list[str] = []
    for kinds, _ in _branches(_method(_daemon(), "_do")):
        named += kinds
    wired = [e.__name__ for kind in executors.WIRED for e in kind.EFFECTS]
    effects = {e.__name__ for e in get_args(Effect) if e is not GateEffect}
    gates = {e.__name__ for e in _ours(GateEffect)}
    assert sorted(named + wired) == sorted(effects | gates), "each effect carried out once"
    assert gates <= set(wired)
    declared = [e for gate in pipeline.GATES for e in gate.effects]
    assert sorted(e.__name__ for e in declared) == sorted(gates), "each gate effect, one gate"


def test_every_effect_has_one_failure_message_sent_when_carrying_it_out_raised():
    """Declared in FAILURE (None: nothing waits for its answer); Daemon._effect_failed sends
    exactly that message, from one branch. A gate's effects declare theirs (GateEffect.failed,
    sent by the daemon's one branch for them): a message their gate handles."""
    assert set(FAILURE) == {e for e in get_args(Effect) if e is not GateEffect}
    tree = _daemon()
    lanes = ast.parse((ROOT / "scheduledeventsd" / "runtime" / "lanes.py").read_text())
    helpers = {  # the daemon's own, and the lanes' (`lanes.poll_error(detail)`)
        **{n.name: n for n in lanes.body if isinstance(n, ast.FunctionDef)},
        **{n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)},
    }
    sent: dict[str, str] = {}
    for kinds, body in _branches(_method(tree, "_effect_failed")):
        if kinds == ["GateEffect"]:
            assert "effect.failed(detail)" in ast.unparse(body[0])
            continue
        (put,) = [c for c in ast.walk(body[0]) if isinstance(c, ast.Call)][:1]
        made = put.args[0]
        assert isinstance(made, ast.Call)
        name = ast.unparse(made.func).rpartition(".")[2]
        if name in helpers:  # _poll_error(detail): the message its return builds
            (ret,) = [r for r in ast.walk(helpers[name]) if isinstance(r, ast.Return)]
            name = ast.unparse(ret.value.func)  # type: ignore[union-attr]
        for kind in kinds:
            assert kind not in sent, f"{kind}: two failure branches"
            sent[kind] = name
    declared = {e.__name__: m.__name__ for e, m in FAILURE.items() if m is not None}
    assert sent == declared
    for gate in pipeline.GATES:
        for effect in gate.effects:
            if effect.failed is GateEffect.failed:
                continue  # nothing waits for its answer
            (ret,) = [
                r
                for r in ast.walk(ast.parse(inspect.getsource(effect)))
                if isinstance(r, ast.Return)
            ]
            message = ast.unparse(ret.value.func)  # type: ignore[union-attr]
            assert message in {m.__name__ for m in gate.handlers}, (gate.name, effect, message)


# ---- (3) every component's timers reach next_wakeup through its due() -----------------------


def test_every_component_that_fires_timers_declares_when_they_are_due():
    fires = {t.fire for t in compose.TIMERS if t.fire is not None}
    for path in _modules():
        source = path.read_text()
        if "\ndef fire(" in source:
            module = _module_of(path)
            assert module.fire in fires, f"{path.name}: fire() is not in compose.TIMERS"
            row = next(t for t in compose.TIMERS if t.fire is module.fire)
            assert row.due is not None or row.due_for is not None, path.name
            if row.due_for is not None:
                assert row.phases == module.DUE_PHASES, path.name


def _module_of(path: Path):
    import importlib  # noqa: PLC0415

    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return importlib.import_module(dotted)


def test_next_wakeup_and_the_timers_read_no_timer_but_through_the_components():
    """No parallel list of timers: next_wakeup reads the state only to walk its events, and
    _timers fires only what compose.TIMERS lists (after the watchdog and the stop)."""
    wakeup = ast.parse(inspect.getsource(compose.next_wakeup))
    read = {
        n.attr
        for n in ast.walk(wakeup)
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "state"
    }
    assert read == {"events"}
    timers = ast.parse(inspect.getsource(compose._timers))
    called = {ast.unparse(c.func) for c in ast.walk(timers) if isinstance(c, ast.Call)}
    assert called == {"lifetime._watchdog", "lifetime._shutdown", "timers.fire"}


# ---- a gate is one declaration: the composition reads it through pipeline.GATES -------------


def test_every_gate_declares_handlers_timers_reaching_next_wakeup_and_couplings_in_compose():
    """What compose runs of the gates is exactly what they declare: each gate's handlers are
    the dispatch's, its timers fire in the order of GATES and reach next_wakeup, its couplings
    run after every message."""
    for gate in pipeline.GATES:
        for message, handler in gate.handlers.items():
            assert compose._HANDLERS[message] is handler, (gate.name, message)
        for timers in gate.timers:
            assert timers in compose.TIMERS, (gate.name, timers.name)
            assert timers.due is not None or timers.due_for is not None, timers.name
            for phase in timers.phases:
                assert timers.due_for in compose._DUE_BY_PHASE[phase], timers.name
        assert set(gate.couplings) <= set(compose.COUPLINGS), gate.name
    gates = [t for gate in pipeline.GATES for t in gate.timers]
    assert [t for t in compose.TIMERS if t in gates] == gates, "fired in the order of GATES"
    declared = tuple(c for gate in pipeline.GATES for c in gate.couplings)
    assert (*compose._OWN_COUPLINGS, *declared) == compose.COUPLINGS
    # Each gate hands an event on to the next in GATES, the last to the before-hooks.
    nexts = [gate.enter for gate in pipeline.GATES[1:]] + [runs._before_hooks]
    assert [onward._NEXT[gate.name] for gate in pipeline.GATES] == nexts


class ToyOn(str, enum.Enum):
    PASSED = "its toy check passed"


class Toy(str, enum.Enum):
    NONE = ""
    PASSED = "passed"


@dataclasses.dataclass(frozen=True)
class ToyAnswered(GateMessage):
    """A toy gate's own message: its owner is the gate that declares it, nothing else."""

    event_id: str
    error: str = ""


@dataclasses.dataclass(frozen=True)
class AskToy(GateEffect):
    """A toy gate's own effect, and the message that reports its failure."""

    event_id: str

    def failed(self, detail: str) -> GateMessage:
        return ToyAnswered(self.event_id, detail)


TOY_TABLE = machine.Table(
    "toy", "a gate declared in a test", (machine.row([Toy.NONE], ToyOn.PASSED, Toy.PASSED, "on"),)
)


def _toy_gate(seen: list[str]) -> Gate:
    """A gate built here, in the test, as a new gate module would declare it: nothing else of
    the engine is edited for the composition to run it."""

    def enter(state, tracked, on, now, out):
        seen.append(f"enter {tracked.event.event_id}")
        out.append(AskToy(tracked.event.event_id))
        tracked = gate_move(tracked, TOY_TABLE, ToyOn.PASSED, Toy.PASSED)  # its own slice
        return onward.after("toy", state, tracked, on, now, out)  # then the drain's gate

    def answered(state, msg, now, out):
        seen.append(f"answered {msg.event_id}")
        return state

    def due(state, now, allowed):
        return (now + 0.25,)  # sooner than any other timer of the engine

    def fire(state, now, out):
        seen.append("fired")
        return state

    def coupling(state, out):
        seen.append("coupled")
        return state

    return Gate(
        "toy",
        TOY_TABLE,
        enter,
        handlers={ToyAnswered: answered},
        effects=(AskToy,),
        timers=(Timers("toy", fire, due),),
        couplings=(coupling,),
    )


@pytest.fixture
def with_toy_gate(monkeypatch):
    """pipeline.GATES with a toy gate between the slot's and the drain's, composed as compose
    composes the gates it imports."""
    seen: list[str] = []
    gates = (*pipeline.GATES[:2], _toy_gate(seen), *pipeline.GATES[2:])
    names = ("_HANDLERS", "TIMERS", "COUPLINGS", "_DUE", "_DUE_BY_PHASE")
    for name, value in zip(names, compose.composed(gates)):
        monkeypatch.setattr(compose, name, value)
    onward.link(gates)
    try:
        yield seen
    finally:
        onward.link(pipeline.GATES)


def test_a_gate_declared_elsewhere_is_composed_from_its_declaration_alone(with_toy_gate):
    """The proof that adding a gate edits no other place of the engine: a gate declared in this
    test is entered in its turn (after the window and the slot, before the drain and the
    before-hooks), its effect comes out, its message reaches its handler, its timer fires and
    sets the wake-up, and its coupling runs. On the old code compose listed each gate's handlers,
    timers and couplings by hand, and each gate named the next: there was nothing to build."""
    seen = with_toy_gate
    m = Machine()
    assert "fired" in seen
    assert "coupled" in seen
    assert m.wake() == pytest.approx(m.now + 0.25), "its timer reaches next_wakeup"
    m.fetched(doc(event()), at=100.1)
    kinds = [type(e) for e in m.effects]
    assert kinds.index(AskToy) < kinds.index(SpawnHooks), "entered before the before-hooks"
    assert "enter E1" in seen
    assert m.phase() is Phase.RUNNING, "handed on: the drain's gate, then the before-hooks"
    tracked = m.state.events["E1"]
    assert gate_state(tracked, TOY_TABLE) is Toy.PASSED
    (persist,) = [e for e in m.effects if isinstance(e, Persist)]
    assert persist.events["E1"].gates == (("toy", "passed"),), "kept in the state file"
    with pytest.raises(IllegalTransitionError, match="toy passed: nothing is declared"):
        gate_move(tracked, TOY_TABLE, ToyOn.PASSED, Toy.PASSED)
    m.send(ToyAnswered("E1"), at=100.2)
    assert "answered E1" in seen


def test_two_gates_claiming_one_message_are_refused_when_composed():
    toy = _toy_gate([])
    with pytest.raises(ValueError, match="ToyAnswered: handled twice"):
        compose.composed((*pipeline.GATES, toy, dataclasses.replace(toy, name="toy2")))


class ToyExecutor:
    """A toy gate's executor, as a new one under coordination/ would be."""

    EFFECTS = (AskToy,)

    def __init__(self, context: executors.Context) -> None:
        self.context = context

    @staticmethod
    def settings(config) -> object:
        return config.vm_name

    def do(self, effect: AskToy) -> None:
        self.context.send(ToyAnswered(effect.event_id))

    def stop_all(self) -> None:
        pass


def test_a_gates_executor_is_wired_by_one_entry_and_remade_when_its_settings_change():
    """The daemon's executors are found by the effects they declare (runtime/executors.WIRED):
    one more entry carries out a new gate's effects, a reload that changes its settings makes
    it anew (and no other), and its effect says what reports its failure."""
    sent: list[object] = []
    context = executors.Context(config(), sent.append, ProcessRunner())
    wired = executors.Executors(context, (*executors.WIRED, ToyExecutor))
    assert wired.carries(AskToy("E1"))
    wired.do(AskToy("E1"))
    assert sent == [ToyAnswered("E1")]
    before = list(wired.running)
    wired.reload(context.config, dataclasses.replace(context, config=config(vm_name="vm-b")))
    assert [a is b for a, b in zip(before, wired.running)] == [True] * len(executors.WIRED) + [
        False
    ]
    assert AskToy("E1").failed("boom") == ToyAnswered("E1", "boom")
