"""The planner's executors: one per effect of the engine's vocabulary, as runtime/daemon.py's
`_do` has one, each carrying it out with the simulated parts (world.py) and sending back the
message the daemon's own executor sends. A test checks every effect has one here; a gate's
effect that has none is answered as it declares (`GateEffect.planned`), so a new gate adds none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Protocol, Union

from .. import engine
from ..engine import (
    AcquireSlot,
    ApprovalFailed,
    ApprovalSent,
    AskCluster,
    AskGate,
    CancelFetch,
    CancelRuns,
    CheckCluster,
    ClusterChecked,
    ClusterDrained,
    ClusterMarked,
    ClusterRestored,
    Coordinate,
    DrainNode,
    Effect,
    Exit,
    Fetch,
    ForgetShared,
    GateAnswered,
    GateEffect,
    HoldSlot,
    HooksFinished,
    Message,
    NameResolved,
    Notify,
    Outcome,
    Persist,
    Persisted,
    PostApproval,
    Record,
    ReleaseSlot,
    ResolveName,
    RestoreNode,
    SharedForgotten,
    SlotFailed,
    SpawnHooks,
    StopCoordinating,
    StopDraining,
    UseConfig,
    WakeAt,
    WithdrawApproval,
)
from .timeline import Seen
from .vm import FETCH, START, Guard, Run, Vm
from .world import Answer, Cloud, Peers, Slots, hook_run


class Loop(Protocol):
    """What of the plan's loop (run.Plan) the executors use."""

    cloud: Cloud
    slots: Slots
    peers: Peers
    seen: dict[tuple[str, str], Seen]

    def push(self, t: float, vm: Optional[Vm], kind: int, payload: Any) -> None: ...  # noqa: ANN401

    def send(self, vm: Vm, message: Message, t: float, guard: Guard = None) -> None: ...

    def answer(self, answers: list[Answer], t: float) -> None: ...

    def wake(self, vm: Vm, at: float) -> None: ...


def _fetch(plan: Loop, vm: Vm, e: Fetch, t: float) -> None:
    """The poll lane: carried out at its instant (or now, if that has passed)."""
    vm.fetch_at = max(e.at, t)
    vm.fetch_token += 1
    if not vm.quiet:
        plan.push(vm.fetch_at, vm, FETCH, vm.fetch_token)


def _cancel_fetch(plan: Loop, vm: Vm, e: CancelFetch, t: float) -> None:
    vm.fetch_at, vm.quiet = None, False
    vm.fetch_token += 1


def _resolve_name(plan: Loop, vm: Vm, e: ResolveName, t: float) -> None:
    plan.send(vm, NameResolved(vm.name, "imds"), t)


def _spawn(plan: Loop, vm: Vm, e: SpawnHooks, t: float) -> None:
    seconds, outcome, detail = hook_run(e.hooks, vm.spec.hooks, vm.config.hooks, vm.hook_runs)
    token = vm.token()
    vm.runs[e.run] = Run(e.event.event_id, e.stage, token)
    plan.send(vm, HooksFinished(e.run, outcome, detail), t + seconds, ("run", str(e.run), token))


def _cancel_runs(plan: Loop, vm: Vm, e: CancelRuns, t: float) -> None:
    for run in e.runs:
        found = vm.runs.get(run)
        if found is not None:
            found.token = vm.token()  # its own end is not sent any more
            plan.send(vm, HooksFinished(run, Outcome.CANCELLED), t, ("run", str(run), found.token))


def _post_approval(plan: Loop, vm: Vm, e: PostApproval, t: float) -> None:
    event_id = e.event.event_id
    if e.deadline is not None and t >= e.deadline:
        detail = "not sent: its slot's lease could expire before an answer"
        plan.send(vm, ApprovalFailed(event_id, "deadline", detail), t)
        return
    plan.send(vm, ApprovalSent(event_id, 0.0, t), t)
    if plan.cloud.approve(event_id, t):  # it starts now, for every VM it names
        posting = plan.cloud.by_id[event_id]
        for name in posting.vms:
            seen = plan.seen[(name, event_id)]
            seen.approved = t if seen.approved is None else seen.approved
        plan.push(t, None, START, posting)


def _persist(plan: Loop, vm: Vm, e: Persist, t: float) -> None:
    vm.persisted, vm.mark = e.events, e.mark
    plan.send(vm, Persisted(""), t)


def _nothing(plan: Loop, vm: Vm, e: Effect, t: float) -> None:
    """Record (read by `_observe`), Notify, UseConfig (no reload in a plan), WithdrawApproval
    (the plan answers a PostApproval at once: none waits in a queue to be withdrawn)."""


def _coordinate(plan: Loop, vm: Vm, e: Coordinate, t: float) -> None:
    plan.answer(plan.peers.write(e.event.event_id, vm.name, e.ready, e.event.resources), t)


def _stop_coordinating(plan: Loop, vm: Vm, e: StopCoordinating, t: float) -> None:
    plan.peers.stop(vm.name, e.event_ids)


def _forget_shared(plan: Loop, vm: Vm, e: ForgetShared, t: float) -> None:
    """Deleted at once, and said so, as the daemon's thread does (a put-back's undo waits)."""
    plan.peers.forget(vm.name, e.event_id)
    plan.send(vm, SharedForgotten(e.event_id), t)


def _ask(plan: Loop, vm: Vm, e: Union[AskGate, AskCluster], t: float) -> None:
    """The gate (or the cluster) says yes at once: the plan runs no gate command."""
    plan.send(vm, GateAnswered(e.run, 0), t)


def _acquire(plan: Loop, vm: Vm, e: AcquireSlot, t: float) -> None:
    concurrency = vm.config.concurrency
    if concurrency is None:  # as the daemon: no keeper without concurrency and etcd
        plan.send(vm, SlotFailed(e.event.event_id, "internal", "no etcd configured"), t)
        return
    plan.answer(plan.slots.acquire(concurrency.limits, vm.name, e.event.event_id, t), t)


def _release(plan: Loop, vm: Vm, e: ReleaseSlot, t: float) -> None:
    vm.slot_events.discard(e.event_id)
    if not vm.slot_events:
        vm.kept_from = None
    plan.answer(plan.slots.release(vm.name, e.event_id, t), t)


def _check_cluster(plan: Loop, vm: Vm, e: CheckCluster, t: float) -> None:
    plan.send(vm, ClusterChecked(()), t)


def _drain(plan: Loop, vm: Vm, e: DrainNode, t: float) -> None:
    """Marked at once; drained after the set's `cluster_drain`."""
    settings = vm.config.cluster
    event_id = e.event.event_id
    mark = engine.mark_of(settings) if settings is not None else None
    plan.send(vm, ClusterMarked(event_id, True, mark), t)
    token = vm.token()
    vm.drains[event_id] = token
    plan.send(vm, ClusterDrained(event_id), t + vm.spec.cluster_drain, ("drain", event_id, token))


def _stop_draining(plan: Loop, vm: Vm, e: StopDraining, t: float) -> None:
    vm.drains.pop(e.event_id, None)


def _restore(plan: Loop, vm: Vm, e: RestoreNode, t: float) -> None:
    if e.mark is not None:  # as the daemon: nothing to take off without a mark of its own
        plan.send(vm, ClusterRestored(e.event_id), t)


def _wake_at(plan: Loop, vm: Vm, e: WakeAt, t: float) -> None:
    plan.wake(vm, e.at)


def _exit(plan: Loop, vm: Vm, e: Exit, t: float) -> None:
    vm.alive = False
    vm.gen += 1


EXECUTORS: Mapping[type, Callable[[Loop, Vm, Any, float], None]] = {
    Fetch: _fetch,
    CancelFetch: _cancel_fetch,
    ResolveName: _resolve_name,
    SpawnHooks: _spawn,
    CancelRuns: _cancel_runs,
    PostApproval: _post_approval,
    WithdrawApproval: _nothing,
    Persist: _persist,
    Record: _nothing,
    Notify: _nothing,
    UseConfig: _nothing,
    Coordinate: _coordinate,
    StopCoordinating: _stop_coordinating,
    ForgetShared: _forget_shared,
    AskGate: _ask,
    AskCluster: _ask,
    AcquireSlot: _acquire,
    ReleaseSlot: _release,
    HoldSlot: _nothing,  # a planned VM goes down without a stop: run._down holds its slot
    CheckCluster: _check_cluster,
    DrainNode: _drain,
    StopDraining: _stop_draining,
    RestoreNode: _restore,
    WakeAt: _wake_at,
    Exit: _exit,
}


def _planned(plan: Loop, vm: Vm, e: GateEffect, t: float) -> None:
    """A gate's effect with no executor here: the answer its gate declares, at once."""
    answer = e.planned()
    if answer is not None:
        plan.send(vm, answer, t)


Executor = Callable[[Loop, Vm, Any, float], None]


def executor_of(effect: Effect) -> Optional[Executor]:
    """The planner's executor of `effect` (None: one the planner cannot carry out)."""
    found = EXECUTORS.get(type(effect))
    if found is None and isinstance(effect, GateEffect):
        return _planned
    return found
