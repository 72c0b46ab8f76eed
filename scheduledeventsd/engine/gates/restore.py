"""The restore's deadline: after- or cancelled-hooks that wait for their node's restore (the drain
gate's coupling `_restore_first` asks for it) do not wait for ever for an answer that never
comes (the drainer's thread hangs). The drain gate itself: gates/drain."""

from __future__ import annotations

import math
from typing import Optional

from .. import runs
from ..frozen import replace
from ..lifecycle import Drain, Phase
from ..state import State, Tracked, _with, ours
from ..vocabulary.constants import RESTORE_TIMEOUT
from ..vocabulary.effects import Effect, RestoreNode
from ..vocabulary.messages import ClusterRestored
from . import drain

DUE_PHASES = frozenset({Phase.AFTER})


def _asked(t: Tracked) -> bool:
    """Its hooks wait for the answer to a restore asked for (`start_at`: by when; inf: the
    deadline not placed yet)."""
    return t.drain is Drain.RESTORING and runs._awaiting_restore(t)


def due_for(state: State, event_id: str, t: Tracked, now: float, allowed: float) -> Optional[float]:
    if state.stopping is not None or not _asked(t):
        return None
    return now if math.isinf(t.start_at) else t.start_at  # unplaced: placed now, by `fire`


def fire(state: State, now: float, out: list[Effect]) -> State:
    """Places the deadline of a restore asked for; one not answered by then counts as failed:
    asked again (tried until it works), and its hooks start as on a failed answer, or, holding
    a slot, wait for the next deadline. Before, they waited for ever."""
    if state.stopping is not None:
        return state
    for event_id, t in ours(state.events):
        if not _asked(t):
            continue
        if t.start_at <= now:
            if state.cluster_mark is not None:
                out.append(RestoreNode(event_id, state.cluster_mark))
            unanswered = ClusterRestored(event_id, f"no answer in {RESTORE_TIMEOUT:g} s")
            state = drain._cluster_restored(state, unanswered, now, out)
        waits = state.events.get(event_id, t)  # holding a slot: for the next answer
        if _asked(waits) and (math.isinf(waits.start_at) or waits.start_at <= now):
            state = _with(state, event_id, replace(waits, start_at=now + RESTORE_TIMEOUT))
    return state
