"""The daemon: carries out the engine's effects and turns their results into messages.

Every decision and timer is in `engine.step`; this module owns the threads, the signals and the
one inbox. IMDS calls run on lanes (`lanes`: one thread per kind, each with its own connection),
hooks on a thread per run, so a poll hanging for its whole timeout never delays an approval, a hook
result, a signal or the watchdog. Signal handlers only put a message on a `SimpleQueue`, whose
`put` is reentrant (a `queue.Queue` there can deadlock the loop: CPython issue 59181).
"""

from __future__ import annotations

import functools
import queue
import signal
import threading
import time
import traceback
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, Callable, Optional, Union, get_args

from .. import engine
from ..config import Config, ConfigError, Hook, loader
from ..engine import (
    AcquireSlot,
    ApprovalFailed,
    ApprovalSent,
    AskCluster,
    AskGate,
    CancelFetch,
    CancelRuns,
    ClusterDrained,
    ClusterRestored,
    Coordinate,
    CoordinationFailed,
    DocumentFetched,
    DrainNode,
    Effect,
    Exit,
    Faulted,
    Fetch,
    ForgetShared,
    GateAnswered,
    GateEffect,
    HoldSlot,
    HooksFinished,
    Message,
    Notify,
    Outcome,
    PeersChanged,
    Persist,
    Persisted,
    PostApproval,
    Record,
    ReleaseSlot,
    ResolveName,
    RestoreNode,
    SharedForgotten,
    SpawnHooks,
    StopCoordinating,
    StopDraining,
    UseConfig,
    WakeAt,
    WithdrawApproval,
)
from ..host import boot
from ..host.hooks import CommandResult, ProcessRunner, run_hooks
from ..host.store import StateError, StateStore
from ..model import Event
from ..observe.telemetry import Telemetry
from . import log, wiring
from .executors import Context, Executors
from .lanes import (
    Inbound,
    Lane,
    PollLane,
    Signalled,
    Withdrawn,
    approve,
    fetch,
    name_error,
    poll_error,
    resolve_name,
)
from .notify import Notifier

if TYPE_CHECKING:
    pass

MAX_WAIT = 3600.0  # seconds; the engine asks for a Tick at least this often anyway


# What --dry-run skips. It takes no slot and marks no cluster node: it logs what it would do,
# stays QUEUED until the deadline, and takes a drain as done.
Pretended = Union[
    SpawnHooks,
    PostApproval,
    Persist,
    Coordinate,
    ForgetShared,
    AskGate,
    AskCluster,
    AcquireSlot,
    ReleaseSlot,
    DrainNode,
    StopDraining,
    RestoreNode,
]
_PRETENDED = get_args(Pretended)


class Daemon:
    def __init__(
        self, config: Config, *, notifier: Optional[Notifier] = None, dry_run: bool = False
    ) -> None:
        self.config = config
        self.dry_run = dry_run
        self.notifier = notifier or Notifier()
        self.log = log.get().bind(dry_run=True) if dry_run else log.get()
        self.inbox: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        self.runner = ProcessRunner()
        self.store = StateStore(config.state_dir, read_only=dry_run)
        self.telemetry = Telemetry(config, self.store, self._report, publish=not dry_run)
        interval = self.notifier.watchdog_interval
        self.state = engine.initial(config, None if interval is None else int(interval * 1e6))
        self._polling = wiring.client_for(config)  # told what was saved, before its first poll
        self._poller = PollLane("imds-poll", self.inbox, self._polling)
        self._approver = Lane("imds-approve", self.inbox, wiring.client_for(config))
        self._withdrawn = Withdrawn()  # approvals queued on it that are not to be sent
        self._namer = Lane("imds-name", self.inbox, wiring.client_for(config))
        self._coordinator = wiring.coordinator(config, self.inbox.put)
        self._executors = Executors(self._context(config))  # the gates' effects
        self._wake_at = 0.0
        self._exit: Optional[int] = None
        self._faults_seen: set[tuple[str, str, str]] = set()
        # The incarnation of the last document whose step raised, said once: served again
        # at every poll, it is refused quietly (counted: internal_errors).
        self._refused_document: Optional[int] = None

    # ---- control from outside -------------------------------------------------------------

    def request_stop(self) -> None:
        self.inbox.put(Signalled(signal.SIGTERM))

    def install_signal_handlers(self) -> None:
        def handler(signo: int, _frame: Optional[FrameType]) -> None:
            self.inbox.put(Signalled(signo))

        for signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signo, handler)

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> int:
        """Run until the engine says exit; returns the process exit status."""
        problem = ""
        try:
            try:
                if not self.dry_run:  # beside the service, on its state directory
                    problem = self.store.lock()
            except StateError as e:
                self.log.error("state_unavailable", error=str(e))
                return 1
            except OSError as e:  # nothing to lock at all: run, degraded
                problem = f"{self.store.path.parent}: cannot lock or create: {e}"
            self.telemetry.start()  # the port only once the state directory is ours
            loaded, load_problem = self.store.load()
            self._polling.recall(tracked.event for tracked in loaded.values())
            store = self.store
            self._feed(
                engine.Boot(
                    loaded,
                    problem or load_problem,
                    boot.boot_id(),
                    store.cluster_mark,
                    mark_unrecorded=store.mark_unrecorded,
                    repaired=store.repaired,
                )
            )
            while self._exit is None:
                for message in self._receive():
                    self._feed(message)
                    if self._exit is not None:
                        break
        finally:
            for lane in (self._poller, self._approver, self._namer):
                lane.stop()
            if self._coordinator is not None:
                self._coordinator.stop_all()
            self._executors.stop_all()
            self.telemetry.stop()
            self.store.unlock()
            self.notifier.close()
        return self._exit if self._exit is not None else 1

    def _receive(self) -> list[Message]:
        """Wait for messages until the engine's next timer; a burst of signals counts once."""
        timeout = min(max(0.0, self._wake_at - time.monotonic()), MAX_WAIT)
        try:
            first = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return [engine.Tick()]
        batch = [first]
        while not self.inbox.empty():  # the one reader: what it says is there stays there
            batch.append(self.inbox.get_nowait())
        messages: list[Message] = []
        reload = stop = False
        for item in batch:
            if not isinstance(item, Signalled):
                messages.append(item)
            elif item.signo == signal.SIGHUP:
                reload = True
            elif not stop:
                stop = True
                messages.append(engine.StopRequested(signal.Signals(item.signo).name))
        if reload:
            messages.append(engine.ReloadRequested())
            messages.append(self._load_config())
        return messages

    def _load_config(self) -> Message:
        try:
            return engine.Reloaded(loader.load(self.config.path or loader.DEFAULT_PATH))
        except ConfigError as e:
            return engine.ReloadFailed(tuple(e.problems))

    def _feed(self, message: Message) -> None:
        """One step and its effects. Nothing raised here may end the daemon: an IMDS answer
        or a defect that breaks one message must not stop the next one being handled."""
        before, now = self.state, time.monotonic()
        try:
            self.state, effects = engine.step(before, message, now)
        except Exception as e:  # noqa: BLE001 - logged with its traceback; the loop goes on
            self._fault(f"step {type(message).__name__}", e, message)
            return
        try:
            self.telemetry.step(before, message, self.state, now)
        except Exception as e:  # noqa: BLE001
            self._fault("telemetry", e, message)
        for effect in effects:
            try:
                self._do(effect)
            except Exception as e:  # noqa: BLE001
                self._fault(f"effect {type(effect).__name__}", e, None)
                self._effect_failed(effect, f"internal error: {e!r}"[:500])

    def _effect_failed(self, effect: Effect, detail: str) -> None:
        """An effect that raised still ends in the message its failure sends, so the engine's
        own rules (backoff, retry, a failed run) take it from there."""
        if isinstance(effect, Fetch):
            self.inbox.put(poll_error(detail))
        elif isinstance(effect, PostApproval):
            self.inbox.put(ApprovalFailed(effect.event.event_id, "internal", detail))
        elif isinstance(effect, ResolveName):
            self.inbox.put(name_error(detail))
        elif isinstance(effect, SpawnHooks):
            self.inbox.put(HooksFinished(effect.run, Outcome.FAILED, detail))
        elif isinstance(effect, (AskGate, AskCluster)):
            self.inbox.put(GateAnswered(effect.run, None, detail=detail))
        elif isinstance(effect, Coordinate):
            self.inbox.put(CoordinationFailed(effect.event.event_id, "internal", detail))
        elif isinstance(effect, GateEffect):  # a gate's: its own failure message, if any
            failure = effect.failed(detail)
            if failure is not None:
                self.inbox.put(failure)
        elif isinstance(effect, Persist):
            self.inbox.put(Persisted(detail))

    def _fault(self, where: str, error: Exception, message: Optional[Message]) -> None:
        """Logged with its traceback once per distinct failure (a document once per document:
        served again, it is dropped quietly), counted, shown as degraded; `message`: the one a
        step dropped (what it held is released), None for an effect."""
        key = (where, type(error).__name__, str(error)[:200])
        first = key not in self._faults_seen
        if first and len(self._faults_seen) < 100:
            self._faults_seen.add(key)
        document = message.document.incarnation if isinstance(message, DocumentFetched) else None
        said = document is not None and document == self._refused_document
        if document is not None:  # served again at every poll: said once, refused quietly
            self._refused_document = document
        if not said:
            self.log.error(
                "internal_error",
                where=where,
                error=repr(error)[:2000],
                dropped=type(message).__name__ if message is not None else None,
                traceback=_traceback(error) if first else None,
                reason="a defect: the message was dropped and the daemon carries on"
                if document is None
                else _DOCUMENT_DROPPED,
                **({} if document is None else {"incarnation": document}),
            )
        if isinstance(message, Faulted):
            return  # the report of a fault failed itself: never recurse
        self._feed(Faulted(where, repr(error)[:500], message))

    # ---- effects --------------------------------------------------------------------------

    def _do(self, effect: Effect) -> None:  # noqa: PLR0912 - one branch per kind of effect
        if self.dry_run and isinstance(effect, _PRETENDED):
            self._pretend(effect)
            return
        if self._executors.carries(effect):  # the gates' (and the cluster's answer to AskCluster)
            self._executors.do(effect)
        elif isinstance(effect, Record):
            log.emit(self.log, effect.level.value, effect.name, effect.fields)
            self.telemetry.record(effect)
        elif isinstance(effect, (Fetch, PostApproval, ResolveName)):
            self._ask_imds(effect)
        elif isinstance(effect, CancelFetch):
            self._poller.cancel()
        elif isinstance(effect, WithdrawApproval):
            self._withdrawn.add(effect.event_id)
        elif isinstance(effect, SpawnHooks):
            self._spawn(effect)
        elif isinstance(effect, (Coordinate, StopCoordinating, ForgetShared, AskGate)):
            self._coordinate(effect)
        elif isinstance(effect, Persist):
            self._persist(effect)
        elif isinstance(effect, Notify):
            self.notifier.send(**effect.fields)
        elif isinstance(effect, WakeAt):
            self._wake_at = effect.at
        elif isinstance(effect, CancelRuns):
            self.runner.cancel(*effect.runs)
        elif isinstance(effect, UseConfig):
            self._use_config(effect.config)
        elif isinstance(effect, Exit):
            self._exit = effect.status

    def _ask_imds(self, effect: Union[Fetch, PostApproval, ResolveName]) -> None:
        """Each on its own lane, so a GET hanging for its timeout delays no approval."""
        if isinstance(effect, Fetch):
            self._poller.order(effect.at, fetch, poll_error)
        elif isinstance(effect, ResolveName):
            self._namer.submit(resolve_name, name_error)
        else:
            event_id = effect.event.event_id
            self._withdrawn.discard(event_id)  # asked for again: wanted
            self._approver.submit(
                functools.partial(
                    approve,
                    event_id=event_id,
                    deadline=effect.deadline,
                    withdrawn=self._withdrawn,
                ),
                lambda detail: ApprovalFailed(event_id, "internal", detail),
            )

    def _coordinate(
        self, effect: Union[Coordinate, StopCoordinating, ForgetShared, AskGate]
    ) -> None:
        if isinstance(effect, AskGate):
            self._ask_gate(effect)
        elif self._coordinator is None:
            if isinstance(effect, Coordinate):
                event_id = effect.event.event_id
                self.inbox.put(CoordinationFailed(event_id, "internal", "no etcd configured"))
        elif isinstance(effect, Coordinate):
            self._coordinator.start(effect)
        elif isinstance(effect, ForgetShared):
            self._coordinator.forget(effect.event_id, effect.vm_name)
        else:
            self._coordinator.stop(*effect.event_ids, withdraw=True)

    def _pretend(self, effect: Pretended) -> None:
        """--dry-run: say what would be done and report it done, so every later decision
        (approval after hooks, after-hooks once it is over) shows in the log too. The other
        VMs of a shared event are taken as ready."""
        if isinstance(effect, AcquireSlot):
            self.log.info("would_take_slot", **engine.event_fields(effect.event))
        elif isinstance(effect, DrainNode):
            self.log.info("would_drain_node", **engine.event_fields(effect.event))
            self.inbox.put(ClusterDrained(effect.event.event_id))
        elif isinstance(effect, RestoreNode):
            if effect.event_id:  # its after-hooks wait for the answer
                self.log.info("would_restore_node", event_id=effect.event_id)
                self.inbox.put(ClusterRestored(effect.event_id))
        elif isinstance(effect, ForgetShared):  # a put-back's undo waits for it (postponed)
            self.inbox.put(SharedForgotten(effect.event_id))
        elif isinstance(effect, (ReleaseSlot, HoldSlot, StopDraining)):
            pass
        elif isinstance(effect, Coordinate):
            self.log.info(
                "would_coordinate", **engine.event_fields(effect.event), ready=effect.ready
            )
            if effect.ready:
                names = {r.casefold(): "ready" for r in effect.event.resources}
                self.inbox.put(PeersChanged(effect.event.event_id, names))
        elif isinstance(effect, (AskGate, AskCluster)):
            self.log.info("would_ask_gate", **engine.event_fields(effect.event))
            self.inbox.put(GateAnswered(effect.run, 0))
        elif isinstance(effect, SpawnHooks):
            self.log.info(
                "would_run_hooks",
                **engine.event_fields(effect.event),
                hooks=" ".join(effect.hooks),
                stage=effect.stage.value,
            )
            self.inbox.put(HooksFinished(effect.run, Outcome.SUCCEEDED))
        elif isinstance(effect, PostApproval):
            self.log.info("would_approve", **engine.event_fields(effect.event))
            self.inbox.put(ApprovalSent(effect.event.event_id))
        else:
            self.inbox.put(Persisted(""))

    def _persist(self, effect: Persist) -> None:
        try:
            self.store.save(effect.events, effect.mark)
        except OSError as e:
            self.inbox.put(Persisted(f"{self.store.path}: {e}"))
        else:
            self.inbox.put(Persisted(""))

    def _report(self, level: str, name: str, fields: Mapping[str, object]) -> None:
        log.emit(self.log, level, name, fields)

    def _use_config(self, new: Config) -> None:
        old, self.config = self.config, new
        self.telemetry.use(new)
        if (new.metadata, new.provider) != (old.metadata, old.provider):
            self._polling = wiring.client_for(new)
            self._polling.recall(tracked.event for tracked in self.state.events.values())
            self._poller.use(self._polling)
            for lane in (self._approver, self._namer):
                lane.use(wiring.client_for(new))
        replaced = None
        if new.coordination != old.coordination:
            if self._coordinator is not None:
                self._coordinator.stop_all()
            replaced, self._coordinator = self._coordinator, wiring.coordinator(new, self.inbox.put)
        self._executors.reload(old, self._context(new))
        if replaced is not None:  # its lease revoked once the new keeper has the slot's keys
            replaced.lease.retire()

    def _context(self, config: Config) -> Context:
        return Context(config, self.inbox.put, self.runner, self._coordinator, self._do)

    def _spawn(self, effect: SpawnHooks) -> None:
        def finish(failure: Optional[CommandResult], detail: str) -> Message:
            if detail:
                return HooksFinished(effect.run, Outcome.FAILED, detail)
            if failure is None:
                return HooksFinished(effect.run, Outcome.SUCCEEDED)
            return HooksFinished(effect.run, failure.outcome)

        missing = [name for name in effect.hooks if name not in self.config.hooks]
        if missing:  # the validator refuses such a config; never a KeyError in the loop
            detail = f"hook(s) {', '.join(missing)} not defined under hooks"
            self.inbox.put(HooksFinished(effect.run, Outcome.FAILED, detail))
            return
        hooks = tuple(self.config.hooks[name] for name in effect.hooks)
        self._run_commands(
            effect.run,
            effect.event,
            effect.stage.value,
            hooks,
            effect.incarnation,
            effect.vm_name,
            finish,
            rebooted=effect.rebooted,
        )

    def _ask_gate(self, effect: AskGate) -> None:
        gate = self.config.coordination.gate if self.config.coordination else None
        if gate is None:
            self.inbox.put(GateAnswered(effect.run, None, detail="no gate configured"))
            return

        def finish(failure: Optional[CommandResult], detail: str) -> Message:
            if detail:
                return GateAnswered(effect.run, None, detail=detail)
            if failure is None:
                return GateAnswered(effect.run, 0)
            return GateAnswered(
                effect.run,
                failure.exit_status,
                timed_out=failure.timed_out,
                cancelled=failure.cancelled,
                detail=failure.error,
            )

        hook = Hook("gate", (gate.command,))
        self._run_commands(
            effect.run, effect.event, "gate", (hook,), effect.incarnation, effect.vm_name, finish
        )

    def _run_commands(  # noqa: PLR0917 - one call site per kind of run
        self,
        run: int,
        event: Event,
        stage: str,
        hooks: tuple[Hook, ...],
        incarnation: int,
        vm_name: str,
        finish: Callable[[Optional[CommandResult], str], Message],
        *,
        rebooted: bool = False,
    ) -> None:
        """Hooks (or the gate) on a thread of their own; exactly one message when they end."""
        extra_env = self.config.environment
        bound = self.log.bind(event_id=event.event_id, event_type=event.event_type, stage=stage)

        def started(hook: str, argv: tuple[str, ...]) -> None:
            bound.info("hook_started", hook=hook, command=" ".join(argv), run=run)

        def finished(hook: str, result: CommandResult) -> None:
            self.telemetry.hook_finished(
                event.event_id, hook, stage, result.label(stage), result.duration_s
            )
            log.hook_result(bound, hook, stage, run, result)

        def output(hook: str, stream: str, line: str) -> None:
            bound.info("hook_output", hook=hook, stream=stream, line=line)

        def work() -> None:
            message: Optional[Message] = None
            try:
                failure = run_hooks(
                    self.runner,
                    run=run,
                    stage=stage,
                    rebooted=rebooted,
                    hooks=hooks,
                    event=event,
                    incarnation=incarnation,
                    vm_name=vm_name,
                    extra_env=extra_env,
                    on_started=started,
                    on_finished=finished,
                    on_output=output,
                )
                message = finish(failure, "")
            except Exception as e:  # noqa: BLE001 - the run must end in exactly one result
                message = finish(None, f"internal error: {e!r}")
            finally:
                self.runner.forget(run)
                self.inbox.put(message or finish(None, "internal error"))

        try:
            threading.Thread(target=work, name=f"hooks-{run}", daemon=True).start()
        except RuntimeError as e:  # "can't start new thread"
            self.inbox.put(finish(None, f"cannot start a thread: {e}"))


_DOCUMENT_DROPPED = (
    "a defect: this document was dropped and the daemon carries on; served again, it is dropped "
    "quietly (scheduledeventsd_internal_errors_total counts each time)"
)


def _traceback(error: Exception) -> str:
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    return "".join(lines)[-8000:]


def run_daemon(config: Config, *, dry_run: bool = False) -> int:
    daemon = Daemon(config, dry_run=dry_run)
    daemon.install_signal_handlers()
    return daemon.run()
