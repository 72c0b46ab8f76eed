"""Review of fix/retyped (8686c51): an EventId listed twice for this VM with two EventTypes
(IMDS is untrusted input). engine/copies keeps the first copy naming this VM, so the other
type's hooks never run, and the one approval (StartRequests names only the EventId) is sent on
the first type's hooks: what the merge promises never happens. Fake clock, documents parsed
from their JSON. The copy of the heaviest type naming this VM is now the one judged."""

from __future__ import annotations

from scheduledeventsd.config import EventRule
from scheduledeventsd.engine import HooksFinished, Outcome, PostApproval, SpawnHooks
from tests.engine.test_engine import VM, Machine, config, logs, of
from tests.engine.test_engine_copies import fetched, raw

EVENTS = {
    "Freeze": EventRule(("checkpoint",)),
    "Reboot": EventRule(("drain",)),
}


def test_an_event_id_listed_for_this_vm_with_two_types_is_never_approved_on_one_of_them():
    m = Machine(config(events=EVENTS))
    runs = of(fetched(m, raw([VM], "Freeze"), raw([VM], "Reboot")), SpawnHooks)
    ran = {hook for run in runs for hook in run.hooks}
    approved: list[PostApproval] = []
    for run in runs:
        approved += of(
            m.send(HooksFinished(run.run, Outcome.SUCCEEDED), at=m.now + 1), PostApproval
        )
    assert not approved or "drain" in ran, (
        f"X approved as {approved[0].event.event_type} on {sorted(ran)}; it is also listed "
        "as a Reboot for this VM"
    )


def test_copies_of_two_types_listed_in_either_order_keep_one_preparation():
    """The heaviest type is judged whatever the copies' order: a document listing them the
    other way round changes nothing (before: the first copy naming this VM was judged, so a
    flip of the order was a change of type at every poll, prepared again, never approved)."""
    m = Machine(config(events=EVENTS))
    (drain,) = of(fetched(m, raw([VM], "Freeze"), raw([VM], "Reboot")), SpawnHooks)
    assert drain.hooks == ("drain",)
    effects = fetched(m, raw([VM], "Reboot"), raw([VM], "Freeze"), incarnation=3)
    assert not of(effects, SpawnHooks)
    assert not logs(effects, "event_type_changed")
    (approval,) = of(
        m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=m.now + 1), PostApproval
    )
    assert approval.event.event_type == "Reboot"
