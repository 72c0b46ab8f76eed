"""An EventId listed twice, one copy for another VM and one for this VM (IMDS is untrusted
input): the copy naming this VM is the one judged, whichever comes first, and the copy left out
is said (event_skipped: which was kept, and why). Fake clock, documents parsed from their JSON."""

from __future__ import annotations

import json

from scheduledeventsd.engine import DocumentFetched, Phase, SpawnHooks
from scheduledeventsd.model import parse_document
from tests.engine.test_engine import VM, Machine, logs, of


def raw(resources, event_type="Reboot"):
    return {
        "EventId": "X",
        "EventType": event_type,
        "EventStatus": "Scheduled",
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "NotBefore": "Mon, 01 Jan 2030 00:00:00 GMT",
    }


def fetched(m, *events, incarnation=2):
    body = json.dumps({"DocumentIncarnation": incarnation, "Events": list(events)}).encode()
    return m.send(DocumentFetched(parse_document(body)), at=m.now + 1)


def test_another_vms_copy_listed_first_does_not_hide_this_vms():
    """Before: the first copy won (event_skipped 'duplicate EventId', then event_ignored 'not
    for this VM'): this VM was never prepared."""
    m = Machine()
    fetched(m, raw(["other-vm"]), raw([VM]))
    assert m.phase("X") is Phase.RUNNING
    (run,) = of(m.effects, SpawnHooks)
    assert run.event.resources == (VM,)
    assert not logs(m.effects, "event_ignored")
    (skipped,) = logs(m.effects, "event_skipped")
    assert skipped.level.value == "warning"
    assert skipped.fields["reason"] == (
        "Events[0]: duplicate EventId X, unlike Events[1]: Events[1] is kept, the first naming "
        "this VM"
    )


def test_this_vms_copy_listed_first_is_kept_and_the_other_said():
    m = Machine()
    fetched(m, raw([VM]), raw(["other-vm"]))
    assert m.phase("X") is Phase.RUNNING
    (skipped,) = logs(m.effects, "event_skipped")
    assert skipped.fields["reason"].startswith("Events[1]: duplicate EventId X, unlike Events[0]")


def test_when_no_copy_names_this_vm_the_first_is_kept_and_identical_copies_are_skipped():
    m = Machine()
    fetched(m, raw(["a"]), raw(["a"]), raw(["b"]))
    assert m.phase("X") is Phase.NOT_OURS
    assert m.state.events["X"].event.resources == ("a",)
    reasons = [r.fields["reason"] for r in logs(m.effects, "event_skipped")]
    assert reasons == [
        "Events[1]: duplicate EventId X",
        "Events[2]: duplicate EventId X, unlike Events[0]: Events[0] is kept, the first (none "
        "names this VM)",
    ]


def test_the_choice_is_made_again_with_each_document():
    """Ours, then listed with another VM's copy first: still ours, not dropped as if its
    Resources no longer named this VM."""
    m = Machine()
    fetched(m, raw([VM]))
    fetched(m, raw(["other-vm"]), raw([VM]), incarnation=3)
    assert m.phase("X") is Phase.RUNNING
    assert not logs(m.effects, "event_ignored")
