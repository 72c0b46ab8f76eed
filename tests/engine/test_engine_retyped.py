"""An EventId listed again with another EventType (IMDS is untrusted input) is never approved on
the hooks of the type it had: the change is said (event_type_changed, both types), what was done
for the old type is undone as when an event leaves (its before-hooks stopped, its cancelled-
hooks of the old type), then it is judged anew for its new type. Fake clock."""

from __future__ import annotations

from scheduledeventsd.config import ApprovePolicy, EventRule
from scheduledeventsd.engine import (
    ApprovalFailed,
    ApprovalSent,
    CancelRuns,
    Coordinate,
    DocumentFetched,
    ForgetShared,
    HooksFinished,
    Outcome,
    Persist,
    Phase,
    PostApproval,
    SpawnHooks,
    WithdrawApproval,
)
from tests.engine.test_engine import VM, Machine, config, doc, event, logs, of
from tests.engine.test_engine_fleet import ETCD, SHARED

EVENTS = {
    "Freeze": EventRule(("checkpoint",), ("thaw",), ("thaw",)),
    "Reboot": EventRule(("drain",), ("undrain",), ("undrain",)),
}


def machine():
    return Machine(config(events=EVENTS))


def test_a_freeze_become_reboot_while_its_hooks_run_is_never_approved_on_them():
    """Before: checkpoint (the Freeze's hook) succeeded and approved the Reboot; drain never
    ran, and nothing said the type had changed."""
    m = machine()
    m.fetched(doc(event(event_type="Freeze")))
    (checkpoint,) = of(m.effects, SpawnHooks)
    assert checkpoint.hooks == ("checkpoint",)
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=101)
    (changed,) = logs(m.effects, "event_type_changed")
    assert (changed.fields["event_type"], changed.fields["previous_type"]) == ("Reboot", "Freeze")
    assert changed.level.value == "warning"
    assert of(m.effects, CancelRuns) == [CancelRuns((checkpoint.run,))]
    assert m.phase() is Phase.ENDING
    m.fetched(doc(event(event_type="Reboot"), incarnation=4), at=102)  # listed while stopping
    assert not of(m.effects, SpawnHooks)
    assert not logs(m.effects, "event_type_changed"), "said once"
    m.send(HooksFinished(checkpoint.run, Outcome.SUCCEEDED), at=103)
    assert not of(m.effects, PostApproval), "never approved on the Freeze's hook"
    (thaw,) = of(m.effects, SpawnHooks)
    assert (thaw.stage.value, thaw.hooks, thaw.event.event_type) == (
        "cancelled",
        ("thaw",),
        "Freeze",
    ), "the Freeze's cancelled-hooks, with the event as it was"
    m.send(HooksFinished(thaw.run, Outcome.SUCCEEDED), at=104)
    assert "E1" not in m.state.events, "forgotten: the next document's E1 is news"
    m.fetched(doc(event(event_type="Reboot"), incarnation=4), at=105)
    (drain,) = of(m.effects, SpawnHooks)
    assert (drain.stage.value, drain.hooks, drain.event.event_type) == (
        "before",
        ("drain",),
        "Reboot",
    )
    m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=106)
    (approval,) = of(m.effects, PostApproval)
    assert approval.event.event_type == "Reboot"


def test_an_unhandled_type_become_a_handled_one_is_prepared_at_once():
    """Before: it stayed `unhandled` (as Hibernate) for ever: no hooks, no approval."""
    m = machine()
    m.fetched(doc(event(event_type="Hibernate")))
    assert m.phase() is Phase.UNHANDLED
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=101)
    assert logs(m.effects, "event_type_changed")
    (drain,) = of(m.effects, SpawnHooks)
    assert (drain.hooks, drain.event.event_type) == (("drain",), "Reboot")
    assert m.state.events["E1"].event.event_type == "Reboot"
    m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=102)
    assert of(m.effects, PostApproval)


def test_an_approved_freeze_become_reboot_is_undone_then_prepared_for_the_reboot():
    """Approved on the Freeze's hooks, still Scheduled, then a Reboot: the Freeze's preparation
    is ended as when it leaves (approved: its after-hooks), then the Reboot's hooks run and
    only their success approves it. Before: `approved`, and the Reboot taken as approved."""
    m = machine()
    m.fetched(doc(event(event_type="Freeze")))
    m.send(HooksFinished(1, Outcome.SUCCEEDED), at=101)
    m.send(ApprovalSent("E1"))
    assert m.phase() is Phase.APPROVED
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=102)
    (thaw,) = of(m.effects, SpawnHooks)
    assert (thaw.hooks, thaw.event.event_type) == (("thaw",), "Freeze")
    m.send(HooksFinished(thaw.run, Outcome.SUCCEEDED), at=103)
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=104)
    (drain,) = of(m.effects, SpawnHooks)
    assert drain.hooks == ("drain",)
    assert not of(m.effects, PostApproval)
    m.send(HooksFinished(drain.run, Outcome.FAILED), at=105)
    assert not of(m.effects, PostApproval), "the Reboot's own hooks failed: not approved"
    assert m.phase() is Phase.HOOKS_FAILED


def test_a_waiting_event_whose_type_changes_is_placed_again_for_its_new_type():
    """Never prepared (held by the Freeze's start_before): judged at once as first seen, so
    the Reboot's own rule holds it or runs its hooks."""
    events = {**EVENTS, "Freeze": EventRule(("checkpoint",), start_before=60.0)}
    m = Machine(config(events=events))
    wall = 1_800_000_000.0  # 2027: its NotBefore (2030) is years away
    m.send(DocumentFetched(doc(event(event_type="Freeze")), wall))
    assert m.phase() is Phase.WAITING
    m.send(DocumentFetched(doc(event(event_type="Reboot"), incarnation=3), wall + 1), at=101)
    assert logs(m.effects, "event_type_changed")
    (drain,) = of(m.effects, SpawnHooks)
    assert drain.hooks == ("drain",)


def test_a_shared_events_ready_is_deleted_at_the_change_not_once_its_stage_has_run():
    """Another VM coordinating the event under its new type must not count this VM's `ready`,
    written for the old type, while the old type's cancelled-hooks still run (as for an event
    back under its EventId: engine/returned). Before: the type change was not seen at all."""
    m = Machine(config(approve=ApprovePolicy.ALL, coordination=ETCD, events=EVENTS))
    m.fetched(doc(event(event_type="Freeze", resources=SHARED)))
    m.send(HooksFinished(1, Outcome.SUCCEEDED), at=101)
    assert m.phase() is Phase.COORDINATING
    m.fetched(doc(event(event_type="Reboot", resources=SHARED), incarnation=3), at=102)
    assert of(m.effects, ForgetShared) == [ForgetShared("E1", VM)]
    (thaw,) = of(m.effects, SpawnHooks)
    assert thaw.hooks == ("thaw",)
    m.send(HooksFinished(thaw.run, Outcome.SUCCEEDED), at=103)
    m.fetched(doc(event(event_type="Reboot", resources=SHARED), incarnation=3), at=104)
    (drain,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=105)
    assert of(m.effects, Coordinate), "ready again, for the Reboot"
    assert not of(m.effects, PostApproval)


def test_after_a_new_boot_a_change_of_type_proves_nothing_of_that_boot():
    """Prepared as a Freeze, the VM booted, and the first document lists a Reboot: as when its
    Resources drop this VM, its cancelled-hooks run (not its after-hooks: the boot may have been
    a crash), then the Reboot is judged anew."""
    m = machine()
    m.fetched(doc(event(event_type="Freeze")))  # the VM goes down while checkpoint runs
    saved = of(m.effects, Persist)[-1].events
    again = Machine(config(events=EVENTS), loaded=saved, boot="boot-2")
    assert again.phase() is Phase.REBOOTED
    again.fetched(doc(event(event_type="Reboot"), incarnation=3), at=101)
    assert not logs(again.effects, "reboot_detected")
    (cancelled,) = logs(again.effects, "event_cancelled")
    assert cancelled.fields["event_type"] == "Freeze"
    (thaw,) = of(again.effects, SpawnHooks)
    assert (thaw.stage.value, thaw.hooks) == ("cancelled", ("thaw",))
    again.send(HooksFinished(thaw.run, Outcome.SUCCEEDED), at=102)
    again.fetched(doc(event(event_type="Reboot"), incarnation=3), at=103)
    (drain,) = of(again.effects, SpawnHooks)
    assert drain.hooks == ("drain",)


def test_a_restart_while_the_old_types_stage_runs_still_prepares_the_new_type():
    """The old type's cancelled-hooks cut off by a restart (never run again) leave it `over`
    while listed; marked as left (engine/returned), it is judged anew at the first document,
    never kept over while the Reboot is listed Scheduled."""
    m = machine()
    m.fetched(doc(event(event_type="Freeze")))
    m.send(HooksFinished(1, Outcome.FAILED), at=101)  # hooks_failed: prepared, not approved
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=102)
    (thaw,) = of(m.effects, SpawnHooks)
    assert thaw.hooks == ("thaw",)
    saved = of(m.effects, Persist)[-1].events
    again = Machine(config(events=EVENTS), loaded=saved, now=200.0)  # the same boot
    assert again.phase() is Phase.OVER
    again.fetched(doc(event(event_type="Reboot"), incarnation=3), at=201)
    (drain,) = of(again.effects, SpawnHooks)
    assert (drain.stage.value, drain.hooks) == ("before", ("drain",))


def _approving_then_restarted():
    """A Freeze prepared and its approval on its way when the daemon is killed: the restarted
    daemon has it `approving` from its state file."""
    m = machine()
    m.fetched(doc(event(event_type="Freeze")))
    (checkpoint,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(checkpoint.run, Outcome.SUCCEEDED), at=101)
    assert of(m.effects, PostApproval)
    again = Machine(config(events=EVENTS), loaded=dict(m.state.events), now=110)
    assert again.phase() is Phase.APPROVING
    return again


def test_after_a_restart_no_approval_goes_out_before_a_document_lists_the_event_as_it_was():
    """Before: the restarted daemon posted the approval its state file had pending before any
    document: an event become a Reboot while it was down was approved on the Freeze's hooks."""
    m = _approving_then_restarted()
    posted = [*of(m.effects, PostApproval), *of(m.tick(111), PostApproval)]
    posted += of(m.tick(120), PostApproval)
    assert not posted, "not before a document says what the event is now"
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=121)
    assert logs(m.effects, "event_type_changed")
    assert not of(m.effects, PostApproval)
    assert not of(m.tick(122), PostApproval), "never on the Freeze's hooks"


def test_after_a_restart_the_pending_approval_goes_out_once_a_document_lists_it_unchanged():
    """The approval the state file had pending is not lost: posted once the first document
    after the restart lists the event as it was."""
    m = _approving_then_restarted()
    m.fetched(doc(event(event_type="Freeze"), incarnation=3), at=111)
    posted = [*of(m.effects, PostApproval), *of(m.tick(112), PostApproval)]
    assert [p.event.event_type for p in posted] == ["Freeze"]


def _freeze_posting():
    """A Freeze prepared on its own hooks, its approval asked for and not answered yet (on the
    daemon's lane it may wait behind another event's slow POST)."""
    m = machine()
    m.fetched(doc(event(event_type="Freeze")))
    (checkpoint,) = of(m.effects, SpawnHooks)
    m.send(HooksFinished(checkpoint.run, Outcome.SUCCEEDED), at=101)
    (posted,) = of(m.effects, PostApproval)
    assert posted.event.event_type == "Freeze"
    return m


def test_an_approval_asked_for_is_withdrawn_when_the_type_changes_before_its_answer():
    """The Freeze become a Reboot while its approval is on its way: the engine withdraws it, so
    one still queued is never sent for the Reboot, whose hooks did not run (review5). Its
    answer, "withdrawn", is no failure (nothing said, no backoff), and the Reboot's own approval
    goes out once its hooks succeed. Before: no withdrawal, the queued POST approved the Reboot."""
    m = _freeze_posting()
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=102)
    assert logs(m.effects, "event_type_changed")
    assert of(m.effects, WithdrawApproval) == [WithdrawApproval("E1")]
    (thaw,) = of(m.effects, SpawnHooks)
    assert thaw.hooks == ("thaw",)
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=103)
    assert not of(m.effects, WithdrawApproval), "said once"
    m.send(ApprovalFailed("E1", "withdrawn", "not sent: no longer wanted"), at=104)
    assert not logs(m.effects, "approval_failed"), "not sent is not a failure"
    assert m.state.approvals.posting == frozenset() == m.state.approvals.withdrawn
    assert "E1" not in m.state.approvals.failures
    m.send(HooksFinished(thaw.run, Outcome.SUCCEEDED), at=105)
    m.fetched(doc(event(event_type="Reboot"), incarnation=3), at=106)
    (drain,) = of(m.effects, SpawnHooks)
    assert drain.hooks == ("drain",)
    m.send(HooksFinished(drain.run, Outcome.SUCCEEDED), at=107)
    (approval,) = of(m.effects, PostApproval)
    assert approval.event.event_type == "Reboot", "judged anew, its own approval is sent"
    assert not of(m.effects, WithdrawApproval)


def test_an_approval_asked_for_is_withdrawn_when_its_event_leaves_the_document():
    """Gone (cancelled by Azure) before its approval's answer: nothing to approve any more."""
    m = _freeze_posting()
    m.fetched(doc(incarnation=3), at=102)
    assert of(m.effects, WithdrawApproval) == [WithdrawApproval("E1")]


def test_an_approval_answered_is_never_withdrawn():
    """The ordinary path: approved by its answer, nothing is withdrawn then or after it is over."""
    m = _freeze_posting()
    m.send(ApprovalSent("E1"), at=102)
    assert m.phase() is Phase.APPROVED
    m.fetched(doc(incarnation=3), at=103)  # over: its after-hooks
    assert not of(m.effects, WithdrawApproval)
    assert m.state.approvals.withdrawn == frozenset()
