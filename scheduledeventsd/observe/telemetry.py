"""Everything the daemon shows outside besides its log: the status file, Prometheus metrics
(HTTP and textfile), /health and webhooks, each fed from the engine's steps and the hook results.

The daemon calls `step` after each engine step and `hook_finished` from hook threads; this
module decides nothing about events (the engine did), it only records and publishes. Metrics
are imported only when configured. Nothing here can stop the daemon: a file that cannot be
written or a port that cannot be bound is logged, and events are handled as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..config import Config
from ..engine import Message, Phase, State
from ..host.store import StateStore
from ..model import Event
from ..records import Record
from .observer import HookResult, Observer, unhealthy

if TYPE_CHECKING:  # imported when configured: a daemon without them pays nothing for them
    from .metrics import Metrics
    from .web import WebServer
    from .webhooks import Webhooks

STATUS_EVERY = 60.0  # seconds: the status file is rewritten at least this often (last poll)
TEXTFILE_EVERY = 30.0  # seconds: the metrics textfile, when only routine counters moved

Report = Callable[[str, str, Mapping[str, object]], None]  # (level, name, fields)


class Telemetry:
    def __init__(
        self,
        config: Config,
        store: StateStore,
        report: Report,
        *,
        publish: bool = True,  # False with --dry-run: no files, no socket, no webhooks
    ) -> None:
        self.config = config
        self.store = store
        self.report = report
        self.publish = publish
        self.observer = Observer(time.time())
        self._lock = threading.Lock()
        self._state: Optional[State] = None
        self._metrics: Optional[Metrics] = None
        self._web: Optional[WebServer] = None
        self._webhooks: Optional[Webhooks] = None
        self._status_key: object = None
        self._events_seen: object = None
        self._ours: tuple[object, ...] = ()
        self._status_at = 0.0
        self._textfile_changes = -1
        self._textfile_at = 0.0
        self._problems: set[str] = set()
        self._started = False  # no socket, no webhooks before `start`: the lock comes first
        self.use(config)

    def start(self) -> None:
        """Open the socket and start the webhooks: only once the daemon holds its state
        directory's lock, so a second daemon refused there never opens (or fights for) a port."""
        self._started = True
        self.use(self.config)

    # ---- wiring -------------------------------------------------------------------------

    def use(self, config: Config) -> None:
        """Apply a (re)loaded config: start, move or stop the socket, the webhooks, metrics."""
        old, self.config = self.config, config
        if (config.listen or config.metrics_textfile) and self._metrics is None:
            from .metrics import Metrics  # noqa: PLC0415 - prometheus_client only when used

            self._metrics = Metrics(config)
        elif self._metrics is not None:
            self._metrics.use(config)
        if not self.publish or not self._started:
            return
        if config.webhooks != old.webhooks or (config.webhooks and self._webhooks is None):
            if self._webhooks is not None:
                self._webhooks.stop()
                self._webhooks = None
            if config.webhooks:
                from .webhooks import Webhooks  # noqa: PLC0415

                self._webhooks = Webhooks(config.webhooks, self._webhook_report)
        if config.listen != old.listen or (config.listen and self._web is None):
            self._serve(config)

    def _serve(self, config: Config) -> None:
        if self._web is not None:
            self._web.stop()
            self._web = None
        if config.listen is None:
            return
        from .web import Answers, WebServer  # noqa: PLC0415

        metrics = self._metrics
        assert metrics is not None  # noqa: S101 - created above when listen is set
        answers = Answers(
            health=self.health,
            metrics=metrics.render,
            metrics_type="text/plain; version=0.0.4; charset=utf-8",
            status=self.status,
        )
        listen = config.listen
        try:
            self._web = WebServer(listen, answers)
        except OSError as e:
            self.report(
                "error",
                "http_unavailable",
                {"listen": f"{listen.host}:{listen.port}", "error": str(e)},
            )
            return
        self._web.start()
        self.report("info", "http_listening", {"listen": f"{listen.host}:{self._web.port}"})

    def stop(self) -> None:
        if self._web is not None:
            self._web.stop()
        if self._metrics is not None:
            self._metrics.close()
        if self._webhooks is not None:
            self._webhooks.stop()

    # ---- what happened --------------------------------------------------------------------

    def step(self, before: State, message: Message, after: State, now: float) -> None:
        wall = time.time()
        with self._lock:
            self._state = after
            self.observer.observe(before, message, after, wall)
        if self._metrics is not None:
            self._metrics.observe(before, message, after, now)
        if self.publish:
            self._write_status(after, wall)
            self._write_textfile()

    def record(self, effect: Record) -> None:
        if self._webhooks is not None and self._state is not None:
            self._webhooks.notice(effect, self._state.vm_name, time.time())
        elif not self.publish and self.config.webhooks:
            from .webhooks import kind_of, where  # noqa: PLC0415

            kind = kind_of(effect)
            for hook in self.config.webhooks:
                if kind is not None and kind in hook.on:
                    fields = {
                        "what": kind,
                        "url": where(hook.url),
                        "event_id": effect.fields.get("event_id"),
                    }
                    self.report("info", "would_send_webhook", fields)

    def hook_finished(
        self, event_id: str, hook: str, stage: str, result: str, duration_s: float
    ) -> None:
        """From a hook's thread."""
        with self._lock:
            self.observer.hook_finished(event_id, HookResult(hook, stage, result, duration_s))
        if self._metrics is not None:
            self._metrics.hook_finished(hook, stage, result, duration_s)

    # ---- answers (from the HTTP server's threads) -------------------------------------------

    def health(self) -> Optional[Event]:
        state = self._state
        return None if state is None else unhealthy(state, self.config.unhealthy_from)

    def status(self) -> dict[str, Any]:
        with self._lock:
            state = self._state
            if state is None:
                return {"starting": True}
            return self.observer.document(state, time.time(), self.config.unhealthy_from)

    @property
    def port(self) -> Optional[int]:
        return None if self._web is None else self._web.port

    # ---- files ------------------------------------------------------------------------------

    def _write_status(self, state: State, wall: float) -> None:
        if state.events is not self._events_seen:  # other VMs' events churn; ours are shown
            self._events_seen = state.events
            self._ours = tuple(
                (k, t.phase, t.event.status, t.event.not_before)
                for k, t in state.events.items()
                if t.phase is not Phase.NOT_OURS
            )
        cluster = (state.cluster_problems, state.cluster_mark, state.restore_error)
        key = (self._ours, state.poll.last, state.coordination.count, state.state_problem, cluster)
        if key == self._status_key and wall - self._status_at < STATUS_EVERY:
            return
        self._status_key, self._status_at = key, wall
        try:
            self.store.save_status(self.status())
        except OSError as e:
            self._problem("status_not_written", str(e))
        else:
            self._recovered("status_not_written")

    def _write_textfile(self) -> None:
        metrics, path = self._metrics, self.config.metrics_textfile
        if metrics is None or path is None:
            return
        now = time.monotonic()
        if metrics.changes == self._textfile_changes and now - self._textfile_at < TEXTFILE_EVERY:
            return
        self._textfile_changes, self._textfile_at = metrics.changes, now
        try:
            metrics.write_textfile(str(path))
        except OSError as e:
            self._problem("metrics_textfile_not_written", f"{path}: {e}")
        else:
            self._recovered("metrics_textfile_not_written")

    def _problem(self, name: str, error: str) -> None:
        if name not in self._problems:
            self._problems.add(name)
            self.report("warning", name, {"error": error})

    def _recovered(self, name: str) -> None:
        if name in self._problems:
            self._problems.discard(name)
            self.report("info", name.replace("_not_", "_"), {})

    def _webhook_report(self, name: str, fields: Mapping[str, object]) -> None:
        self.report("info" if name == "webhook_delivered" else "warning", name, fields)
