"""Carries out the engine's cluster effects on a Pacemaker node (`coordination.pacemaker`).

The engine decides when a node is drained and restored, and how long a drain may take
(DrainNode, StopDraining, RestoreNode, CheckCluster); this module does it through `pacemaker.Cli`,
one worker thread per drain, and tells the engine what the cluster says (ClusterDraining on
change, ClusterDrained, ClusterHeld, ClusterRestored, ClusterChecked). A restore is retried with
backoff until it works: a node is never left drained once its event is over.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from .config import Pacemaker
from .engine import (
    AskGate,
    ClusterChecked,
    ClusterDrained,
    ClusterDraining,
    ClusterHeld,
    ClusterRestored,
    DrainNode,
    GateAnswered,
    Message,
)
from .hooks import GATE_LATER, ProcessRunner
from .model import Event
from .pacemaker import Cli, ClusterError, is_ready, problems, still_here, why_not_drain
from .retry import Backoff

WATCH_EVERY = 0.5  # seconds between readings while resources leave
# Settled only when two readings in a row say so: crm_mon shows a short gap after a stop
# and before the start elsewhere is recorded, crm_simulate an empty plan while a start runs.
SETTLED_READINGS = 2
RESTORE_BACKOFF = Backoff(1.0, 30.0)


class Drainer:
    """This node's drains, by EventId."""

    def __init__(
        self, settings: Pacemaker, runner: ProcessRunner, send: Callable[[Message], None]
    ) -> None:
        self.settings = settings
        self.cli = Cli(settings, runner)
        self._send = send
        self._lock = threading.Lock()
        self._watching: dict[str, threading.Event] = {}
        self._restoring = threading.Lock()  # one restore at a time, in order
        self._closed = threading.Event()
        self._me = ""
        self._announced: set[str] = set()  # events whose READY this node has written

    # ---- what the engine asks ----------------------------------------------------------

    def check(self) -> None:
        self._thread(
            "cluster-check",
            lambda: self._send(ClusterChecked(tuple(problems(self.cli)))),
            lambda detail: ClusterChecked((detail,)),
        )

    def drain(self, effect: DrainNode) -> None:
        event_id = effect.event.event_id
        with self._lock:
            if event_id in self._watching:
                return
            stop = self._watching[event_id] = threading.Event()
        self._thread(
            f"drain-{event_id[:8]}",
            lambda: self._drain(event_id, effect.going, stop),
            lambda detail: ClusterHeld(event_id, "tool_failed", detail),
        )

    def stop(self, event_id: str) -> None:
        with self._lock:
            stop = self._watching.pop(event_id, None)
        if stop is not None:
            stop.set()

    def stop_all(self) -> None:
        self._closed.set()
        with self._lock:
            stops, self._watching = list(self._watching.values()), {}
        for stop in stops:
            stop.set()

    def restore(self, event_id: str) -> None:
        """Now, on the caller's thread (an after-stage run, before its hooks); a failure is
        reported and retried in the background."""
        self.stop(event_id)
        if self._restore_once(event_id):
            self._restore_in_background(event_id, failures=1)

    def restore_later(self, event_id: str) -> None:
        self.stop(event_id)
        self._restore_in_background(event_id)

    def ask(self, effect: AskGate) -> None:
        """A shared event's gate, on a thread: GateAnswered(run) comes back, also when the
        asking itself broke (then as a coordination failure, asked again with backoff)."""

        def work() -> None:
            status, detail = self._answer(effect.event)
            self._send(GateAnswered(effect.run, status, detail=detail))

        self._thread(
            f"cluster-ask-{effect.run}",
            work,
            lambda detail: GateAnswered(effect.run, None, detail=detail),
        )

    def _answer(self, event: Event) -> tuple[Optional[int], str]:
        """Asked once this node's before-hooks are done: it says so in the cluster, then 0 when
        every node the event names is drained and done too, else GATE_LATER; (None, why) when
        the cluster cannot be read."""
        try:
            if event.event_id not in self._announced:
                self.cli.ready(self.me(), event.event_id)
                self._announced.add(event.event_id)
            view = self.cli.status()
        except ClusterError as e:
            return None, str(e)
        nodes = [self.settings.node_of(r) for r in event.resources]
        waiting = [n for n in nodes if not is_ready(view, n, self.settings, event.event_id)]
        return (GATE_LATER if waiting else 0), ""

    # ---- the work ----------------------------------------------------------------------

    def me(self) -> str:
        if not self._me:
            self._me = self.cli.me()
        return self._me

    def _drain(self, event_id: str, going: tuple[str, ...], stop: threading.Event) -> None:
        try:
            me = self.me()
            if not self.cli.marked(me):  # after a restart it is already: never judged twice
                reason = why_not_drain(self.cli.status(), me, going, self.settings.min_healthy)
                if reason is not None:
                    self._send(ClusterHeld(event_id, reason))
                    return
                with self._restoring:  # a restore racing this mark comes after it, or stops it
                    if stop.is_set():
                        return
                    self.cli.mark(me, away=True)
        except ClusterError as e:
            self._send(ClusterHeld(event_id, "tool_failed", str(e)))
            return
        last: Optional[tuple[str, ...]] = None
        settled = 0
        while not stop.is_set():
            try:
                here = still_here(self.cli.status(), me) or self.cli.planned()
            except ClusterError as e:
                here = (f"(cluster not readable: {e})",)
            settled = 0 if here else settled + 1
            if settled >= SETTLED_READINGS:
                self._send(ClusterDrained(event_id))
                return
            if here and here != last:
                self._send(ClusterDraining(event_id, here))
                last = here
            stop.wait(WATCH_EVERY)

    def _restore_once(self, event_id: str) -> str:
        """ "" when the node is back (or was never marked); else the error, reported."""
        with self._restoring:
            try:
                me = self.me()
                if event_id == "" and not self.cli.marked(me):
                    return ""  # nothing left behind by an earlier run
                self.cli.mark(me, away=False)
            except ClusterError as e:
                self._send(ClusterRestored(event_id, str(e)))
                return str(e)
        self._send(ClusterRestored(event_id))
        return ""

    def _restore_in_background(self, event_id: str, failures: int = 0) -> None:
        """Tried (again) after the backoff of `failures`, until it works or the daemon stops."""

        def retry(failures: int = failures) -> None:
            while not self._closed.wait(RESTORE_BACKOFF.delay(failures)):
                if not self._restore_once(event_id):
                    return
                failures += 1

        self._thread("cluster-restore", retry, lambda detail: ClusterRestored(event_id, detail))

    def _thread(
        self, name: str, work: Callable[[], None], failed: Callable[[str], Message]
    ) -> None:
        """`work` on a thread of its own; a defect in it still ends in the message `failed`
        makes of it, so the engine's own rules take it from there."""

        def guarded() -> None:
            try:
                work()
            except Exception as e:  # noqa: BLE001 - a defect here must not end silently
                self._send(failed(f"internal error in {name}: {e!r}"[:500]))

        threading.Thread(target=guarded, name=name, daemon=True).start()
