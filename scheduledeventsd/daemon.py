"""The daemon: owns the poll loop, the signals and systemd notification, and wires the parts.

One thread polls, applies the engine's decisions and talks HTTP; each event's hooks run in a
worker thread that reports back through a queue, which also wakes the loop at once, so an
approval goes out as soon as the last hook exits rather than at the next poll tick.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any, Optional, Union

from . import config as config_mod
from . import engine, log
from .config import Config
from .engine import Approve, Decision, Note, Phase, RunHooks
from .hooks import KILL_GRACE, CommandResult, ProcessRunner, run_hooks
from .identity import Identity, resolve
from .imds import ImdsClient, ImdsError
from .model import Event, iso_utc
from .notify import Notifier
from .state import StateError, StateStore

BACKOFF_CAP = 8.0  # seconds; Preempt gives 30 s of notice, so never back off further
APPROVAL_BACKOFF_CAP = 8.0
# While using the hostname, ask IMDS for the name again after 2 s, doubling up to 60 s: at boot
# IMDS is often not reachable yet for a few seconds.
NAME_RETRY_FIRST, NAME_RETRY_CAP = 2.0, 60.0
FAILURE_REMINDER = 300.0  # a persisting poll failure is logged again this often


@dataclass(frozen=True)
class HooksDone:
    event_id: str
    succeeded: bool
    cancelled: bool


@dataclass(frozen=True)
class Wake:
    """Sent by signal handlers so the loop notices a stop or reload without waiting."""


Message = Union[HooksDone, Wake]


def event_fields(event: Event) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "event_status": event.status,
        "not_before": iso_utc(event.not_before) or None,
        "resources": " ".join(event.resources),
    }


class Daemon:
    def __init__(
        self,
        config: Config,
        *,
        notifier: Optional[Notifier] = None,
    ) -> None:
        self.config = config
        self.notifier = notifier or Notifier()
        self.log = log.get()
        self.client = _client(config)
        self.runner = ProcessRunner()
        self.store = StateStore(config.state_dir)
        self.inbox: queue.Queue[Message] = queue.Queue()
        self.stop_requested = threading.Event()
        self._reload_requested = threading.Event()
        self.known: engine.Known = {}
        self.incarnation: Optional[int] = None
        self.identity = Identity("", "config")
        self._workers: dict[str, threading.Thread] = {}
        self._approval_due: dict[str, tuple[float, int]] = {}  # event id -> (when, attempts)
        self._failures = 0
        self._failure_kind = ""
        self._failure_since = 0.0
        self._failure_logged = 0.0
        self._next_poll = 0.0
        self._name_retry_at: Optional[float] = None
        self._name_retry_delay = NAME_RETRY_FIRST
        self._last_status = ""
        self._last_poll = "not yet"
        self._watchdog_extended = False

    # ---- public control -------------------------------------------------------------------

    def request_stop(self) -> None:
        self.stop_requested.set()
        self.inbox.put(Wake())

    def request_reload(self) -> None:
        self._reload_requested.set()
        self.inbox.put(Wake())

    def install_signal_handlers(self) -> None:
        def stop(_signo: int, _frame: Optional[FrameType]) -> None:
            self.request_stop()

        def reload(_signo: int, _frame: Optional[FrameType]) -> None:
            self.request_reload()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)

    def run(self) -> int:
        """Poll until asked to stop; returns the process exit status."""
        try:
            self.store.lock()
        except (StateError, OSError) as e:
            self.log.error("state_unavailable", error=str(e))
            return 1
        try:
            self._start()
            while not self.stop_requested.is_set():
                self._tick()
            self._shutdown()
        finally:
            self.client.close()
            self.store.unlock()
            self.notifier.close()
        return 0

    # ---- start and the loop ---------------------------------------------------------------

    def _start(self) -> None:
        md = self.config.metadata
        self.log.info(
            "daemon_starting",
            config=str(self.config.path) if self.config.path else None,
            url=md.url,
            api_version=md.api_version,
            poll_interval=md.poll_interval,
            approve=self.config.approve,
        )
        try:
            loaded = self.store.load()
        except StateError as e:
            self.log.error("state_unreadable", error=str(e))
            loaded = {}
        self._apply(engine.resume(loaded))
        if self.notifier.watchdog_interval is not None:
            # The first IMDS answer may take minutes; keep the watchdog from firing meanwhile.
            self._watchdog_extended = self.notifier.extend_watchdog(
                md.first_call_timeout * 2 + self.notifier.watchdog_interval
            )
        self._set_identity(resolve(self.config.vm_name, self.client))
        self.notifier.ready(self._status())
        self._next_poll = time.monotonic()

    def _tick(self) -> None:
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = self._schedule(now, self._poll())
            self.notifier.watchdog()
        if self._name_retry_at is not None and now >= self._name_retry_at:
            self._set_identity(resolve(None, self.client))
        self._retry_approvals(time.monotonic())
        self._send_status()
        wake_at = min([self._next_poll, *(due for due, _ in self._approval_due.values())])
        self._wait(max(0.0, wake_at - time.monotonic()))
        if self._reload_requested.is_set():
            self._reload_requested.clear()
            self._reload()

    def _schedule(self, started: float, ok: bool) -> float:
        """Start-to-start on the monotonic clock: late polls skip ticks instead of drifting."""
        interval = self.config.metadata.poll_interval
        now = time.monotonic()
        if not ok:
            return now + self._backoff()
        base = min(self._next_poll, started)
        missed = int((now - base) // interval)
        return base + interval * (missed + 1)

    def _wait(self, timeout: float) -> None:
        try:
            message = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            if isinstance(message, HooksDone):
                self._hooks_done(message)
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                return

    # ---- polling ----------------------------------------------------------------------------

    def _poll(self) -> bool:
        try:
            doc = self.client.fetch_document()
        except ImdsError as e:
            self._poll_failed(e)
            return False
        if self._failures:
            self.log.info(
                "poll_recovered",
                failures=self._failures,
                outage_s=round(time.monotonic() - self._failure_since, 1),
            )
        if self._watchdog_extended and self.notifier.watchdog_interval is not None:
            self.notifier.extend_watchdog(self.notifier.watchdog_interval)
            self._watchdog_extended = False
        self._failures = 0
        self._failure_kind = ""
        self._last_poll = "ok"
        if doc.incarnation == self.incarnation:
            return True
        self.log.info(
            "document_changed",
            incarnation=doc.incarnation,
            previous_incarnation=self.incarnation,
            events=len(doc.events),
        )
        for problem in doc.skipped:
            self.log.warning("event_skipped", incarnation=doc.incarnation, reason=problem)
        self.incarnation = doc.incarnation
        self._apply(engine.on_document(doc, self.known, self._policy()))
        return True

    def _poll_failed(self, error: ImdsError) -> None:
        """Log the first failure and every change of failure, not every attempt."""
        now = time.monotonic()
        self._failures += 1
        self._last_poll = f"{error.kind} ({self._failures} failures)"
        if self._failures == 1:
            self._failure_since = now
        if error.kind != self._failure_kind or now - self._failure_logged >= FAILURE_REMINDER:
            self.log.warning(
                "poll_failed",
                kind=error.kind,
                error=error.detail,
                failures=self._failures,
                retry_in_s=round(self._backoff(), 2),
            )
            self._failure_kind = error.kind
            self._failure_logged = now

    def _backoff(self) -> float:
        interval = self.config.metadata.poll_interval
        return min(interval * 2.0 ** min(self._failures - 1, 10), max(BACKOFF_CAP, interval))

    # ---- decisions and actions ---------------------------------------------------------------

    def _policy(self) -> engine.Policy:
        return engine.Policy(self.identity.name, self.config.approve, self.config.events)

    def _apply(self, decision: Decision) -> None:
        """Persist first, then act: a crash in between re-runs or re-approves, never loses."""
        if decision.known != self.known:
            self.known = decision.known
            self._save()
        for action in decision.actions:
            if isinstance(action, Note):
                self._note(action)
            elif isinstance(action, RunHooks):
                self._start_hooks(action)
            elif isinstance(action, Approve):
                self._approve(action.event)
        for gone in set(self._approval_due) - {
            e.event_id for e in engine.pending_approvals(self.known)
        }:
            del self._approval_due[gone]

    def _note(self, note: Note) -> None:
        method = getattr(self.log, note.level)
        method(note.name, **event_fields(note.event), **dict(note.fields))

    def _save(self) -> None:
        try:
            self.store.save(self.known)
        except OSError as e:
            self.log.error("state_write_failed", path=str(self.store.path), error=str(e))

    def _start_hooks(self, action: RunHooks) -> None:
        event = action.event
        hooks = tuple(self.config.hooks[name] for name in action.hooks)
        incarnation = self.incarnation or 0
        bound = self.log.bind(event_id=event.event_id, event_type=event.event_type)

        def started(hook: str, argv: tuple[str, ...]) -> None:
            bound.info("hook_started", hook=hook, command=" ".join(argv))

        def finished(hook: str, result: CommandResult) -> None:
            fields: dict[str, Any] = {
                "hook": hook,
                "exit_status": result.exit_status,
                "duration_s": round(result.duration_s, 3),
            }
            if result.succeeded:
                bound.info("hook_finished", **fields)
            elif result.timed_out:
                bound.error("hook_timed_out", **fields, error="killed with its process group")
            else:
                bound.error("hook_failed", **fields, error=result.error or None)

        def output(hook: str, stream: str, line: str) -> None:
            bound.info("hook_output", hook=hook, stream=stream, line=line)

        def work() -> None:
            failure = run_hooks(
                self.runner,
                hooks=hooks,
                event=event,
                incarnation=incarnation,
                vm_name=self.identity.name,
                extra_env=self.config.environment,
                on_started=started,
                on_finished=finished,
                on_output=output,
            )
            cancelled = failure is not None and failure.cancelled
            self.inbox.put(HooksDone(event.event_id, failure is None, cancelled))

        thread = threading.Thread(target=work, name=f"hooks-{event.event_id[:8]}", daemon=True)
        self._workers[event.event_id] = thread
        thread.start()

    def _hooks_done(self, done: HooksDone) -> None:
        self._workers.pop(done.event_id, None)
        if done.cancelled:
            return  # still RUNNING on disk, so a restart runs them again
        self._apply(
            engine.on_hooks_finished(done.event_id, done.succeeded, self.known, self._policy())
        )

    def _approve(self, event: Event) -> None:
        started = time.monotonic()
        try:
            self.client.approve([event.event_id])
        except ImdsError as e:
            _, attempts = self._approval_due.get(event.event_id, (0.0, 0))
            attempts += 1
            delay = min(0.5 * 2.0 ** min(attempts - 1, 10), APPROVAL_BACKOFF_CAP)
            self._approval_due[event.event_id] = (time.monotonic() + delay, attempts)
            self.log.warning(
                "approval_failed",
                **event_fields(event),
                error=e.detail,
                attempts=attempts,
                retry_in_s=delay,
            )
            return
        self._approval_due.pop(event.event_id, None)
        self.log.debug(
            "approval_sent",
            event_id=event.event_id,
            duration_s=round(time.monotonic() - started, 3),
        )
        self._apply(engine.on_approved(event.event_id, self.known))

    def _retry_approvals(self, now: float) -> None:
        for event in engine.pending_approvals(self.known):
            due = self._approval_due.get(event.event_id)
            if due is None or due[0] <= now:
                self._approve(event)

    # ---- identity, status, reload, shutdown -----------------------------------------------

    def _set_identity(self, identity: Identity) -> None:
        previous = self.identity
        self.identity = identity
        if identity.source == "hostname":
            self._name_retry_at = time.monotonic() + self._name_retry_delay
            self._name_retry_delay = min(self._name_retry_delay * 2, NAME_RETRY_CAP)
            if previous.source != "hostname":
                self.log.warning(
                    "vm_name_fallback",
                    vm_name=identity.name,
                    error=identity.problem,
                    reason="IMDS did not tell the VM name; using the hostname, which differs "
                    "from Resources on scale sets. Set vm_name in the config to be sure.",
                )
            return
        self._name_retry_at = None
        self._name_retry_delay = NAME_RETRY_FIRST
        if identity.name != previous.name:
            self.log.info("vm_name", vm_name=identity.name, source=identity.source)
        if previous.name and identity.name.casefold() != previous.name.casefold():
            # Events judged "not ours" under the old name are judged again.
            self.known = {k: t for k, t in self.known.items() if t.phase is not Phase.NOT_OURS}
            self.incarnation = None

    def _status(self) -> str:
        ours = sum(1 for t in self.known.values() if t.phase is not Phase.NOT_OURS)
        return (
            f"incarnation {self.incarnation if self.incarnation is not None else '-'}; "
            f"{ours} event(s) for {self.identity.name or '?'}; "
            f"{len(self._workers)} running hook(s); last poll {self._last_poll}"
        )

    def _send_status(self) -> None:
        status = self._status()
        if status != self._last_status:
            self._last_status = status
            self.notifier.status(status)

    def _reload(self) -> None:
        self.notifier.send(
            RELOADING="1", MONOTONIC_USEC=str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)
        )
        try:
            new = config_mod.load(self.config.path or config_mod.DEFAULT_PATH)
        except config_mod.ConfigError as e:
            for problem in e.problems:
                self.log.error("config_invalid", error=problem)
            self.log.error("config_reload_failed", reason="keeping the previous configuration")
            self.notifier.ready(self._status())
            return
        old = self.config
        self.config = new
        if new.metadata != old.metadata:
            self.client.close()
            self.client = _client(new)
        if new.state_dir != old.state_dir:
            self.store = StateStore(new.state_dir)
            self._save()
        if new.vm_name != old.vm_name or new.metadata != old.metadata:
            self._set_identity(resolve(new.vm_name, self.client))
        self.log.info(
            "config_reloaded", config=str(new.path) if new.path else None, approve=new.approve
        )
        self.notifier.ready(self._status())

    def _shutdown(self) -> None:
        """Let running hooks finish within the grace period; what is cut off runs again later."""
        grace = self.config.shutdown_grace
        self.notifier.stopping(
            f"stopping; waiting up to {grace:g}s for {len(self._workers)} hook run(s)"
        )
        self.log.info("daemon_stopping", hooks_running=len(self._workers), grace_s=grace)
        deadline = time.monotonic() + grace
        while self._workers and time.monotonic() < deadline:
            self._wait(min(0.5, max(0.0, deadline - time.monotonic())))
        if self._workers:
            self.log.warning(
                "hooks_cancelled",
                events=" ".join(sorted(self._workers)),
                reason="shutdown grace expired",
            )
            self.runner.cancel_all(signal.SIGTERM)
            kill_at = time.monotonic() + KILL_GRACE
            while self._workers and time.monotonic() < kill_at:
                self._wait(0.2)
            self.runner.cancel_all(signal.SIGKILL)
            for thread in list(self._workers.values()):
                thread.join(KILL_GRACE)
            self._wait(0)
        self._save()
        self.log.info("daemon_stopped")


def _client(config: Config) -> ImdsClient:
    md = config.metadata
    return ImdsClient(md.url, md.api_version, md.timeout, md.first_call_timeout)


def run_daemon(config: Config) -> int:
    daemon = Daemon(config)
    daemon.install_signal_handlers()
    return daemon.run()
