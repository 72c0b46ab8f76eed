"""The VM's name: asked of IMDS, the hostname meanwhile, asked again with backoff."""

from __future__ import annotations

from ...records import Level, Record, What
from ...retry import Failures
from ..frozen import replace
from ..lifecycle import On, Phase
from ..notes import status_text
from ..state import Events, State, _move
from ..vocabulary.constants import NAME_BACKOFF
from ..vocabulary.effects import Effect, Notify, ResolveName
from ..vocabulary.messages import NameResolved
from . import rate


def _name_resolved(state: State, msg: NameResolved, now: float, out: list[Effect]) -> State:
    state = replace(state, resolving=False)
    if state.stopping is not None:
        return state
    return _name_known(state, msg, now, out)


def _name_known(state: State, msg: NameResolved, now: float, out: list[Effect]) -> State:
    previous = state.vm_name
    if msg.source == "hostname":
        failures, _ = state.name_failures.failed("hostname", now, NAME_BACKOFF)
        if state.name_source != "hostname":
            out.append(
                Record(
                    Level.WARNING,
                    What.VM_NAME_FALLBACK,
                    {
                        "vm_name": msg.name,
                        "error": msg.problem,
                        "retry_in_s": round(failures.retry_at - now, 2),
                        "reason": "IMDS did not tell the VM name; using the hostname, which "
                        "differs from Resources on scale sets. Set vm_name in the config to be "
                        "sure.",
                    },
                )
            )
    else:
        failures = Failures()
        if msg.name != previous or state.name_source == "hostname":
            out.append(
                Record(Level.INFO, What.VM_NAME, {"vm_name": msg.name, "source": msg.source})
            )
    state = replace(state, vm_name=msg.name, name_source=msg.source, name_failures=failures)
    if previous and previous.casefold() != msg.name.casefold():
        # Events judged "not ours" under the old name are judged again at the next poll.
        for t in state.events.values():
            if t.phase is Phase.NOT_OURS:
                _move(t, On.RENAMED, Phase.GONE)
        kept = Events({k: t for k, t in state.events.items() if t.phase is not Phase.NOT_OURS})
        state = replace(state, events=kept, incarnation=None)
    if not state.ready:
        state = replace(state, ready=True, poll=replace(state.poll, next_at=now))
        out.append(Notify({"READY": "1", "STATUS": status_text(state)}))
        state = replace(state, status_sent=status_text(state))
    return state


def _name_pending(state: State) -> bool:
    """The hostname stands in for the name, and no lookup is under way."""
    return state.name_source == "hostname" and not state.resolving


def _name_due(state: State, now: float) -> bool:
    return _name_pending(state) and now >= state.name_failures.retry_at


# ---- the name lookup's timer: asked again while the hostname stands in


def due(state: State, now: float, allowed: float) -> tuple[float, ...]:
    if state.stopping is None and _name_pending(state):
        return (max(state.name_failures.retry_at, allowed),)
    return ()


def fire(state: State, now: float, out: list[Effect]) -> State:
    if _name_due(state, now) and rate._allowed_at(state, now) <= now:
        out.append(ResolveName())
        state = replace(rate._spend(state, now), resolving=True)
    return state
