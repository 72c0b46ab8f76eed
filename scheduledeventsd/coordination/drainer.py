"""Carries out the engine's cluster effects on a Pacemaker node (`cluster.pacemaker`).

The engine decides when a node is drained and restored, and how long a drain may take
(DrainNode, StopDraining, RestoreNode, CheckCluster); this module does it through `pacemaker.Cli`,
one worker thread per drain, and tells the engine what the cluster says (ClusterDraining on
change, ClusterDrained, ClusterHeld, ClusterRestored, ClusterChecked). The mark it sets is
reported (ClusterMarked) so the engine keeps it in the state file; a mark found already set by
someone else is reported too, and never taken off. A restore takes off the mark the engine
names, the way it was set, and is retried with backoff until it works (after a restart or a
reload the engine asks again) or a new drain wants the node marked (its event's end restores
it): a node is never left drained once its event is over, nor restored under a drain.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from ..config import Pacemaker
from ..engine import (
    GATE_LATER,
    AskCluster,
    ClusterChecked,
    ClusterDrained,
    ClusterDraining,
    ClusterHeld,
    ClusterMark,
    ClusterMarked,
    ClusterRestored,
    DrainNode,
    GateAnswered,
    Message,
    mark_of,
)
from ..host.hooks import ProcessRunner
from ..model import Event
from ..retry import Backoff
from .pacemaker import Cli, ClusterError, is_ready, problems, still_here, why_not_drain

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
        self._runner = runner
        self.cli = Cli(settings, runner)
        self._send = send
        self._lock = threading.Lock()
        self._watching: dict[str, threading.Event] = {}
        self._restoring = threading.Lock()  # one restore at a time, in order
        self._retrying: set[threading.Event] = set()  # failed restores tried again, by backoff
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
            # The node is wanted marked again: a failed restore of an event over is not tried
            # again (it would take the mark off under this drain); the engine asks for the
            # restore once this event is over too.
            retrying, self._retrying = self._retrying, set()
        for retry in retrying:
            retry.set()
        self._thread(
            f"drain-{event_id[:8]}",
            lambda: self._drain(event_id, effect.going, effect.ours, stop),
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
            stops, self._watching = [*self._watching.values(), *self._retrying], {}
            self._retrying = set()
        for stop in stops:
            stop.set()

    def restore_later(self, event_id: str, mark: ClusterMark) -> None:
        """On a thread: ClusterRestored comes back after the first try (an event's after-hooks
        wait for it), and after each retry of a failure, until one works."""
        self.stop(event_id)
        self._restore_in_background(event_id, mark)

    def ask(self, effect: AskCluster) -> None:
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

    def _drain(
        self, event_id: str, going: tuple[str, ...], ours: bool, stop: threading.Event
    ) -> None:
        """`ours`: the engine holds this daemon's mark (after a restart): found set, it is
        watched on, never judged twice. Found set otherwise, someone else set it."""
        try:
            me = self.me()
            if self.cli.marked(me):
                if not ours:
                    self._send(ClusterMarked(event_id, ours=False))
            else:
                reason = why_not_drain(self.cli.status(), me, going, self.settings.min_healthy)
                if reason is not None:
                    self._send(ClusterHeld(event_id, reason))
                    return
                with self._restoring:  # a restore racing this mark comes after it, or stops it
                    if stop.is_set():
                        return
                    # Reported first, so the state file has it (nearly always) before the
                    # cluster does; a command that failed (timed out) may be applied all the same.
                    self._send(ClusterMarked(event_id, ours=True, mark=mark_of(self.settings)))
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

    def _cli_for(self, mark: ClusterMark) -> Cli:
        """The mark is taken off the way it was set, whatever the configuration says now."""
        if mark == mark_of(self.settings):
            return self.cli
        return Cli(Pacemaker(method=mark.method, attribute=mark.attribute), self._runner)

    def _restore_once(self, event_id: str, mark: ClusterMark) -> str:
        """ "" when the node is back (or no longer marked); else the error, reported."""
        cli = self._cli_for(mark)
        with self._restoring:
            try:
                me = self.me()
                if event_id == "" and not cli.marked(me):
                    self._send(ClusterRestored(event_id))  # someone took it off already
                    return ""
                cli.mark(me, away=False)
            except ClusterError as e:
                self._send(ClusterRestored(event_id, str(e)))
                return str(e)
        self._send(ClusterRestored(event_id))
        return ""

    def _restore_in_background(self, event_id: str, mark: ClusterMark, failures: int = 0) -> None:
        """Tried (again) after the backoff of `failures`, until it works or the daemon stops
        (or reloads: the engine then asks again), or a drain wants the node marked again."""

        def retry(failures: int = failures) -> None:
            # The first try is made even once the daemon stopped this drainer (a reload right
            # after the effect): the engine waits for its answer.
            stop = threading.Event()
            with self._lock:
                if self._closed.is_set():
                    stop.set()
                self._retrying.add(stop)
            try:
                while not failures or not stop.wait(RESTORE_BACKOFF.delay(failures)):
                    if not self._restore_once(event_id, mark):
                        return
                    failures += 1
            finally:
                with self._lock:
                    self._retrying.discard(stop)

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
