"""engine/frozen.replace, the engine's faster `dataclasses.replace`, makes what that one makes: an
equal object of the same class with the changes, frozen, the original untouched; an unknown
field raises as there; and a class whose `__init__` does more than set its fields (a
`__post_init__`, a field it does not set, `__slots__`) gets `dataclasses.replace` itself."""

from __future__ import annotations

import dataclasses

import pytest

from scheduledeventsd.engine import Phase, Tracked
from scheduledeventsd.engine.frozen import replace
from scheduledeventsd.engine.state import Poll, State
from scheduledeventsd.model import Event
from tests.engine.test_engine import Machine, doc, event


def _state() -> State:
    m = Machine()
    m.fetched(doc(event("E1"), event("E2", resources=("other",))), at=101.0)
    return m.state


def _same(a: object, b: object) -> None:
    assert type(a) is type(b)
    assert a == b
    assert vars(a) == vars(b)
    assert repr(a) == repr(b)


def test_a_state_copy_equals_what_dataclasses_replace_makes_and_leaves_the_original():
    state = _state()
    before = vars(state).copy()
    changes = {"incarnation": 9, "listed": frozenset({"E9"}), "events": {}, "status_sent": "x"}
    new = replace(state, **changes)
    _same(new, dataclasses.replace(state, **changes))
    assert vars(state) == before
    assert new.incarnation == 9
    assert state.incarnation == 2


@pytest.mark.parametrize(
    ("obj", "changes"),
    [
        (Tracked(event("E1"), Phase.NEW), {"phase": Phase.WAITING, "start_at": 3.0}),
        (Poll(), {"in_flight_since": 1.0, "scheduled_at": 1.0}),
        (Poll(), {}),
    ],
)
def test_a_copy_of_each_kind_equals_what_dataclasses_replace_makes(obj, changes):
    _same(replace(obj, **changes), dataclasses.replace(obj, **changes))


def test_the_copy_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        replace(_state(), incarnation=3).incarnation = 4  # type: ignore[misc]


def test_an_unknown_field_raises_as_dataclasses_replace_does():
    with pytest.raises(TypeError, match="nope"):
        replace(Poll(), nope=1)  # type: ignore[call-arg]


def test_a_class_with_a_post_init_gets_it_run():
    """Event's __post_init__ makes its text encodable: a copy of the fields would skip it."""
    bad = ("vm\udc80",)
    copied = replace(event("E1"), resources=bad)
    _same(copied, dataclasses.replace(event("E1"), resources=bad))
    assert copied.resources != bad
    assert isinstance(copied, Event)


@dataclasses.dataclass(frozen=True)
class _Derived:
    a: int
    b: int = dataclasses.field(init=False, default=0)


@dataclasses.dataclass(frozen=True)
class _Slotted:
    __slots__ = ("a",)
    a: int


def test_a_field_not_set_by_init_and_slots_get_dataclasses_replace():
    _same(replace(_Derived(1), a=2), dataclasses.replace(_Derived(1), a=2))
    assert replace(_Slotted(1), a=2) == _Slotted(2)
    with pytest.raises(ValueError, match="init=False"):
        replace(_Derived(1), b=3)  # type: ignore[call-arg]
