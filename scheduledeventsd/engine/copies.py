"""An EventId listed more than once, its copies unlike (model.Copy: IMDS is untrusted input):
the copy naming this VM is the one judged, so another VM's copy listed first never hides this
VM's event (it would be ignored as not ours, and this VM never prepared). Here, not in the
parser: only the engine knows the names this VM's events were judged under."""

from __future__ import annotations

from ..model import Document, Event
from ..records import Level, Record, What
from .frozen import replace
from .state import State
from .vocabulary.effects import Effect

# Copies naming this VM with unlike types: the one approval (StartRequests names only the
# EventId) must not go out on a lighter type's hooks (a checkpoint for what is a reboot), and the
# choice must not flip with the copies' order (prepared again at every poll, never approved).
_WEIGHT = {"Freeze": 1, "Reboot": 2, "Redeploy": 3, "Preempt": 4, "Terminate": 5}


def chosen(state: State, doc: Document, out: list[Effect]) -> Document:
    """The document with, for each EventId listed more than once, its copy naming this VM of
    the heaviest type, the first of them (else its first copy); every copy left out is said
    (event_skipped, which one was kept and why)."""
    if not doc.copies:
        return doc
    events = list(doc.events)
    place = {e.event_id: i for i, e in enumerate(events)}
    groups: dict[str, list[tuple[int, Event]]] = {}
    for copy in doc.copies:
        event_id = copy.event.event_id
        first = (copy.first, events[place[event_id]])
        groups.setdefault(event_id, [first]).append((copy.index, copy.event))
    for event_id, group in groups.items():
        ours = [(i, e) for i, e in group if _names_this_vm(state, e)]
        heaviest = max(ours, key=lambda copy: _WEIGHT.get(copy[1].event_type, 0), default=None)
        index, kept = heaviest or group[0]
        events[place[event_id]] = kept
        if not ours:
            why = "the first (none names this VM)"
        elif len({e.event_type for _, e in ours}) > 1:
            why = "the heaviest type naming this VM (prepared for it, not for a lighter one)"
        else:
            why = "the first naming this VM"
        for i, _ in group:
            if i != index:
                reason = (
                    f"Events[{i}]: duplicate EventId {event_id}, unlike Events[{index}]: "
                    f"Events[{index}] is kept, {why}"
                )
                fields = {"incarnation": doc.incarnation, "event_id": event_id, "reason": reason}
                out.append(Record(Level.WARNING, What.EVENT_SKIPPED, fields))
    return replace(doc, events=tuple(events))


def _names_this_vm(state: State, event: Event) -> bool:
    """It names this VM, or the name the event was judged ours under (kept across a rename)."""
    known = state.events.get(event.event_id)
    name = known.vm_name if known is not None and known.vm_name else state.vm_name
    return event.names(name) or event.names(state.vm_name)
