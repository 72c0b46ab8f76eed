"""The engine's shortcuts change nothing it does: `frozen.replace` (a copy of the fields, not
`__init__`), the timers and couplings scanning only this VM's events (`state.ours`, kept with its
`Events`) and the document's loop keeping another VM's event listed again unchanged at once
(events._on_document). Every step of random histories (test_promises' machines, plus renames of
this VM, other VMs' events by the handful, their Resources naming it then not, fields changed
beside them, documents reordered or only renumbered) is taken twice, with the shortcuts and
without them (`dataclasses.replace`, every event scanned, the fast path cut out), and must give
the same state (its events in the same order) and the same effects, next wake-up and status
line. Fake clock; PROMISES_GATED_RANDOM=1 draws new histories."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

import scheduledeventsd.engine.state as state_module
from scheduledeventsd import engine
from scheduledeventsd.engine import Exit, NameResolved, events, frozen, notes
from tests.engine import test_promises as promises

# The fast path's test, whatever it compares: its line is cut out by this start.
FAST_PATH = "if was is not None and was.phase is Phase.NOT_OURS"


def _without_the_fast_path() -> Any:
    """events._on_document with its fast path cut out: every event takes the general path."""
    lines = textwrap.dedent(inspect.getsource(events._on_document)).splitlines()
    fast = [i for i, line in enumerate(lines) if line.strip().startswith(FAST_PATH)]
    assert len(fast) == 1, "the fast path moved: say here how to cut it out"
    (at,) = fast
    lines[at] = lines[at][: lines[at].index("if ")] + "if False:"
    namespace = dict(vars(events))
    exec(compile("\n".join(lines), events.__file__, "exec"), namespace)  # noqa: S102
    return namespace["_on_document"]


def _every_event(known: Any) -> tuple[Any, ...]:
    return tuple(known.items())


def _not_others(known: Any) -> tuple[Any, ...]:
    """What `ours` means, said again here, derived each time (not state._ours: a defect there
    would be in both)."""
    return tuple((k, t) for k, t in known.items() if t.phase is not engine.Phase.NOT_OURS)


def _plain() -> list[tuple[object, str, object]]:
    """(module, name, value) that take each shortcut away."""
    plain: list[tuple[object, str, object]] = [(events, "_on_document", _without_the_fast_path())]
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("scheduledeventsd.engine") or module is None:
            continue
        if getattr(module, "replace", None) is frozen.replace:
            plain.append((module, "replace", dataclasses.replace))
        if getattr(module, "ours", None) is state_module.ours and module is not state_module:
            # The status line counts ours: there, derived again each time instead of kept.
            plain.append((module, "ours", _not_others if module is notes else _every_event))
    assert {name for _, name, _ in plain} == {"_on_document", "replace", "ours"}
    return plain


@contextmanager
def _shortcuts_off(plain: list[tuple[object, str, object]]) -> Iterator[None]:
    kept = [(module, name, getattr(module, name)) for module, name, _ in plain]
    for module, name, value in plain:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in kept:
            setattr(module, name, value)


def _taken(state: Any, message: object, now: float) -> Any:
    try:
        return engine.step(state, message, now)
    except Exception as e:  # noqa: BLE001 - compared with the other's
        return e


def _same(with_: Any, without: Any, message: object, now: float) -> None:
    what = type(message).__name__
    if isinstance(with_, Exception) or isinstance(without, Exception):
        assert repr(with_) == repr(without), f"{what}: {with_!r} / {without!r}"
        return
    (state, effects), (plain_state, plain_effects) = with_, without
    assert effects == plain_effects, f"{what}: the effects differ"
    for field in dataclasses.fields(state):
        mine, plain = getattr(state, field.name), getattr(plain_state, field.name)
        assert mine == plain, f"{what}: state.{field.name} differs:\n{mine}\n{plain}"
    assert list(state.events) == list(plain_state.events), f"{what}: the events' order differs"
    assert engine.status_text(state) == engine.status_text(plain_state), what


def lockstep(base: type[promises.Promises]) -> type[RuleBasedStateMachine]:
    """`base`'s histories and more, each step also taken without the shortcuts; the model's own
    promises are not checked (a rename makes another VM's events ours, which it does not
    follow): test_promises checks them."""

    class Lockstep(base):  # type: ignore[valid-type,misc]
        _plain_for: object = None
        plain = _plain()

        def owed_stages_run_once_nothing_blocks_them(self) -> None:
            pass

        def the_loop_never_stops_polling(self) -> None:
            pass

        def held_back_hooks_start_by_their_lead(self) -> None:
            pass

        def the_node_is_never_left_marked(self) -> None:
            pass

        def check(self, effect: object, message: object) -> None:
            with suppress(AssertionError):  # its bookkeeping runs (the world answers from it)
                super().check(effect, message)

        def feed(self, message: object) -> None:
            if self.exited:
                return
            if hasattr(self, "lease_sent"):  # GatedPromises' bookkeeping of etcd's answers
                if isinstance(message, engine.SlotGranted):
                    self.lease_sent[message.event_id] = message.confirmed or self.now
                elif isinstance(message, engine.SlotKept):
                    self.lease_sent[message.event_id] = message.confirmed
                elif isinstance(message, engine.SlotBusy):
                    self.lease_sent.pop(message.event_id, None)
            before = self.state
            plain_before = self.plain_state if self._plain_for is before else before
            with_ = _taken(before, message, self.now)
            with _shortcuts_off(self.plain):
                without = _taken(plain_before, message, self.now)
                plain_wake = None
                if not isinstance(without, Exception):
                    plain_wake = engine.next_wakeup(without[0], self.now)
            _same(with_, without, message, self.now)
            if isinstance(with_, Exception):
                return  # the daemon drops a step that raises
            self.state, effects = with_
            assert type(self.state.events) is state_module.Events, "a plain dict: no kept `ours`"
            assert engine.next_wakeup(self.state, self.now) == plain_wake
            self.plain_state, self._plain_for = without[0], self.state
            for effect in effects:
                self.check(effect, message)
                self.exited = self.exited or isinstance(effect, Exit)

        @precondition(lambda self: not self.exited)
        @rule(name=st.sampled_from(["vm-b", "VM-A", promises.VM, "vm-c"]))
        def renamed(self, name: str) -> None:
            """The VM's name changes (another VM's events become ours), or only its case."""
            self.feed(NameResolved(name, "imds"))
            if not self.exited and not self.stopping:
                self.fetched()

        @precondition(lambda self: not self.exited)
        @rule(
            resources=st.sampled_from([("vm-b",), ("vm-c",), ("vm-b", "vm-c"), ("VM-A",)]),
            status=st.sampled_from(["Scheduled", "Started"]),
            many=st.integers(1, 4),
        )
        def others(self, resources: tuple[str, ...], status: str, many: int) -> None:
            """Other VMs' events, by the handful (as under churn)."""
            for _ in range(many):
                self.add_event("Reboot", resources, status, 900.0)

        @precondition(lambda self: not self.exited and self.doc)
        @rule(
            index=st.integers(0, 9),
            field=st.sampled_from(["Description", "DurationInSeconds", "NotBefore", "EventType"]),
        )
        def changed_beside(self, index: int, field: str) -> None:
            """A field other than Resources changes, its Resources the same."""
            event_id = self._pick(index)
            value = {"Description": "moved", "DurationInSeconds": 7, "NotBefore": ""}
            self.doc[event_id] = dict(self.doc[event_id], **{field: value.get(field, "Freeze")})
            self.changed()

        @precondition(lambda self: not self.exited and self.doc)
        @rule(index=st.integers(0, 9))
        def reordered(self, index: int) -> None:
            listed = list(self.doc.items())
            cut = index % len(listed)
            self.doc = dict(listed[cut:] + listed[:cut])
            self.changed()

        @precondition(lambda self: not self.exited)
        @rule()
        def renumbered(self) -> None:
            """A new incarnation listing the same events: every other VM's kept at once."""
            self.changed()

    Lockstep.__name__ = f"Lockstep{base.__name__}"
    return Lockstep


LOCKSTEP = settings(
    max_examples=80,
    stateful_step_count=50,
    deadline=None,
    derandomize=not os.environ.get("PROMISES_GATED_RANDOM"),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("base", [promises.Promises, promises.GatedPromises])
def test_each_step_with_the_shortcuts_is_the_step_without_them(base):
    """Same state, events' order, effects, wake-up and status line at every step; a planted
    defect in each shortcut fails it (a fast path blind to Resources, `ours` leaving out a
    phase, a cache carried to the next Events, a copy made in place)."""
    run_state_machine_as_test(lockstep(base), settings=LOCKSTEP)
