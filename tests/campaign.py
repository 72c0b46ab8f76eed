"""Crash campaign: the real daemon, the simulator and real hooks, killed again and again.

Each round starts the daemon (in a PID and mount namespace of its own: a kill -9 of the daemon
takes its hooks with it, as systemd's cgroup does, and a file bind-mounted over
/proc/sys/kernel/random/boot_id models reboots), injects events of every kind (ours, others',
shared, Started-first, short Freeze, failing, cancelled), and kills it with SIGKILL (sometimes
SIGTERM) at a random instant or right after a chosen moment (a hook started or ended, an
approval, an after-hook). Between rounds the state file must load. At the end a clean run lets
everything settle and the invariants are checked against what the simulator received and what
the hooks themselves logged. Needs root (namespaces, bind mounts).

    python -m tests.campaign --kills 500              # `make crash-campaign`
    python -m tests.campaign --kills 200 --fleet      # and three VMs through etcd
    python -m tests.campaign --group --seconds 600 --vms 5   # a concurrency group under faults
    python -m tests.campaign --group --hold --seconds 600 --vms 5   # and the hold (issue 28)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from scheduledeventsd.engine.gates.lead import WINDOW_LEAD
from scheduledeventsd.engine.lifecycle import PREPARED, Rule
from scheduledeventsd.host.store import StateStore
from scheduledeventsd.simulators.azure import SCHEDULED_EVENTS_PATH, Simulator, rfc1123
from scheduledeventsd.simulators.scenario import Scenario

VM = "campaign-vm"
ROOT = Path(__file__).resolve().parents[1]
HOOK = """#!/bin/sh
# $1: hook name. Logs its start and end with the event, stage and daemon instance.
what="$SCHEDULED_EVENT_ID $SCHEDULED_EVENT_STAGE $1 $CAMPAIGN_RUN"
echo "start $what $(date +%s.%N)" >> "$CAMPAIGN_LOG"
sleep "0.$(shuf -i 0-40 -n 1)"
code=0
case "$SCHEDULED_EVENT_DESCRIPTION" in
    *FAIL*) [ "$SCHEDULED_EVENT_STAGE" = before ] && code=1 ;;
esac
echo "end $what $(date +%s.%N) $code" >> "$CAMPAIGN_LOG"
exit $code
"""
TRIGGERS = ("hook_started", "hook_finished", "event_approved", "after_hooks_finished", None)


@dataclass
class Injected:
    event_id: str
    kind: str  # ours | others | shared | started | short | failing | cancelled
    event_type: str
    added: float


@dataclass
class Report:
    kills: int = 0
    terms: int = 0
    reboots: int = 0
    rounds: int = 0
    killed_after: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    approvals: int = 0
    before_runs: int = 0
    after_runs: int = 0
    cancelled_runs: int = 0
    interrupted_after: int = 0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "kills (SIGKILL)": self.kills,
            "stops (SIGTERM)": self.terms,
            "reboots modelled": self.reboots,
            "killed right after": dict(self.killed_after),
            "events injected": dict(self.events),
            "approvals": self.approvals,
            "before-hook runs started": self.before_runs,
            "after-hook runs": self.after_runs,
            "cancelled-hook runs": self.cancelled_runs,
            "after-hooks cut off by a kill": self.interrupted_after,
            "violations": self.violations,
        }


class Daemon:
    """One instance, its JSON log read as it comes."""

    def __init__(self, config: Path, boot_file: Path, root: Path = ROOT) -> None:
        """`root`: where the daemon's package is imported from (a mutant's copy, in tests)."""
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        argv = [
            "unshare", "-m", "-p", "-f", "--mount-proc", "--kill-child",
            "sh", "-c", 'mount --bind "$0" /proc/sys/kernel/random/boot_id && exec "$@"',
            str(boot_file),
            sys.executable, "-m", "scheduledeventsd", "run", "--config", str(config),
            "--log-format", "json", "--log-target", "console",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(root)},
            cwd=root,  # `python -m` imports from its cwd first
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with contextlib.suppress(ValueError), self._lock:
                self.records.append(json.loads(raw))

    def seen(self, name: str) -> int:
        with self._lock:
            return sum(1 for r in self.records if r.get("event") == name)

    def names(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.records if r.get("event") == name]

    def daemon_pid(self) -> Optional[int]:
        """The daemon's own pid (the child of `unshare`, PID 1 of its namespace)."""
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return None
        return int(children.split()[0]) if children.split() else None

    def kill(self, signo: int) -> None:
        pid = self.daemon_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signo)
        try:
            self.proc.wait(30 if signo == signal.SIGTERM else 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


class Campaign:
    def __init__(self, work: Path, seed: int) -> None:
        self.work = work
        self.rng = random.Random(seed)  # noqa: S311 - a replayable campaign, not a secret
        self.sim = Simulator(
            Scenario(vm_name=VM, start_after_approval=0.3, started_for=0.6), rate_limit=False
        )
        self.sim.start()
        self.log = work / "hooks.log"
        self.boot = work / "boot_id"
        self.boot.write_text(str(uuid.uuid4()) + "\n")
        self.state_dir = work / "state"
        hook = work / "hook"
        hook.write_text(HOOK)
        hook.chmod(0o755)
        self.hook = str(hook)
        self.injected: dict[str, Injected] = {}
        self.rebooted: set[str] = set()  # events whose maintenance a modelled reboot was
        self.report = Report()
        self.all_records: list[dict[str, Any]] = []

    def config(self, run: int) -> Path:
        path = self.work / "config.json"
        cmd = lambda name: [{"command": [self.hook, name], "timeout": 30}]  # noqa: E731
        path.write_text(
            json.dumps(
                {
                    "metadata": {
                        "url": self.sim.url,
                        "poll_interval": 0.25,
                        "timeout": 2,
                        "first_call_timeout": 5,
                    },
                    "vm_name": VM,
                    "state_dir": str(self.state_dir),
                    "approve": "sole",
                    "hooks": {n: cmd(n) for n in ("prep", "post", "undo")},
                    "events": {
                        "Reboot": {"before": ["prep"], "after": ["post"], "cancelled": ["undo"]},
                        "Redeploy": {"before": ["prep"], "after": ["post"]},
                        "Freeze": {"before": ["prep"], "short_seconds": 5},
                        "Preempt": ["prep"],
                        "Terminate": ["prep"],
                    },
                    "environment": {"CAMPAIGN_LOG": str(self.log), "CAMPAIGN_RUN": str(run)},
                    "shutdown_grace": 5,
                }
            )
        )
        return path

    def inject(self) -> None:
        kind = self.rng.choice(
            ["ours", "ours", "ours", "others", "shared", "started", "short", "failing", "cancelled"]
        )
        event_type = self.rng.choice(["Reboot", "Redeploy", "Preempt", "Terminate", "Freeze"])
        if kind == "cancelled":  # shared, so never approved under `sole`: it leaves Scheduled
            event_type = "Reboot"
        shared = [VM, "other-vm"]
        resources = {"others": ["other-vm"], "shared": shared, "cancelled": shared}.get(kind, [VM])
        spec: dict[str, Any] = {
            "EventType": "Freeze" if kind == "short" else event_type,
            "Resources": resources,
            "not_before_in": 600,
            "Description": "FAIL please" if kind == "failing" else "maintenance",
            "DurationInSeconds": 3 if kind == "short" else -1,
        }
        if kind == "started":
            spec["EventStatus"] = "Started"
        event_id = self.sim.add_from_spec(spec)
        self.injected[event_id] = Injected(event_id, kind, spec["EventType"], time.time())
        self.report.events[kind] += 1

    def cancel_some(self) -> None:
        for event_id, e in list(self.injected.items()):
            due = time.time() - e.added > self.rng.uniform(0.2, 3)
            if e.kind == "cancelled" and due and event_id in self.sim.event_ids():
                self.sim.remove_event(event_id)

    def round(self, run: int, signo: int) -> None:
        if self.rng.random() < 0.15:
            self.reboot()
        daemon = Daemon(self.config(run), self.boot)
        try:
            _wait(lambda: daemon.seen("document_changed") or daemon.proc.poll() is not None, 20)
            for _ in range(self.rng.randint(0, 3)):
                self.inject()
            trigger = self.rng.choice(TRIGGERS)
            deadline = time.monotonic() + self.rng.uniform(0.2, 2.5)
            start_count = daemon.seen(trigger) if trigger else 0
            while time.monotonic() < deadline:
                self.cancel_some()
                if trigger and daemon.seen(trigger) > start_count:
                    time.sleep(self.rng.uniform(0, 0.02))
                    self.report.killed_after[trigger] += 1
                    break
                time.sleep(0.005)
            else:
                self.report.killed_after["random instant"] += 1
        finally:
            daemon.kill(signo)
            self.all_records += daemon.records
        if signo == signal.SIGKILL:
            self.report.kills += 1
        else:
            self.report.terms += 1
        self.report.rounds += 1
        _, problem = StateStore(self.state_dir).load()
        if problem:
            self.report.violations.append(f"round {run}: the state file did not load: {problem}")

    def reboot(self) -> None:
        """A new boot id, and what a reboot means: the maintenance of every event whose hooks
        had begun happened (IMDS shows it Started, then drops it)."""
        self.boot.write_text(str(uuid.uuid4()) + "\n")
        self.report.reboots += 1
        known, _ = StateStore(self.state_dir).load()
        present = set(self.sim.event_ids())
        for event_id, tracked in known.items():
            if tracked.phase in PREPARED and tracked.rule is Rule.HOOKS and event_id in present:
                self.sim.update_event(event_id, EventStatus="Started")
                self.rebooted.add(event_id)

    def settle(self, run: int) -> None:
        """A last run without kills: everything pending is decided, then a clean stop."""
        daemon = Daemon(self.config(run), self.boot)
        try:
            _wait(lambda: daemon.seen("document_changed"), 20)
            end = time.monotonic() + 5
            while time.monotonic() < end:
                self.cancel_some()
                time.sleep(0.05)
            decided = {"ours", "cancelled", "short"}
            _wait(
                lambda: not [e for e in self.sim.event_ids() if self.injected[e].kind in decided],
                30,
            )
            time.sleep(2)  # the last after-hooks
        finally:
            daemon.kill(signal.SIGTERM)
            self.all_records += daemon.records

    def run(self, kills: int) -> Report:
        run = 0
        while self.report.kills < kills:
            run += 1
            signo = signal.SIGTERM if self.rng.random() < 0.15 else signal.SIGKILL
            self.round(run, signo)
        self.settle(run + 1)
        self.sim.stop()
        self.check()
        return self.report

    # ---- the invariants ---------------------------------------------------------------------

    def check(self) -> None:
        r = self.report
        fields = _hook_log(self.log)
        starts = [(f[1], f[2], float(f[5])) for f in fields if f[0] == "start"]
        ends = [(f[1], f[2], float(f[5]), f[6]) for f in fields if f[0] == "end"]
        approvals = _first_approvals(self.sim)
        r.approvals = len(approvals)
        r.before_runs = sum(1 for _, stage, _ in starts if stage == "before")
        r.after_runs = sum(1 for _, stage, _ in starts if stage == "after")
        r.cancelled_runs = sum(1 for _, stage, _ in starts if stage == "cancelled")
        interrupted = {
            rec.get("event_id")
            for rec in self.all_records
            if rec.get("event") == "after_hooks_interrupted"
        }
        r.interrupted_after = len(interrupted)
        self._check_approvals(approvals, ends)
        removed = {e: t for t, e, what in self.sim.history if what == "removed"}
        for event_id, e in self.injected.items():
            self._check_event(e, starts, approvals, interrupted, removed.get(event_id))
        left = subprocess.run(
            ["pgrep", "-f", self.hook], capture_output=True, text=True, check=False
        ).stdout.split()
        if left:
            r.violations.append(f"4: hook processes left behind: {left}")

    def _check_approvals(
        self, approvals: dict[str, float], ends: list[tuple[str, str, float, str]]
    ) -> None:
        """1: nothing approved that is not ours, or before a successful run of its hooks."""
        bad = self.report.violations
        for event_id, at in approvals.items():
            e = self.injected.get(event_id)
            if e is None or e.kind in ("others", "shared", "failing", "started", "cancelled"):
                bad.append(f"1: approved {event_id} ({e.kind if e else 'unknown'})")
                continue
            if e.kind == "short":
                continue  # a short Freeze is approved without hooks, by rule
            ok = [t for i, stage, t, code in ends if (i, stage, code) == (event_id, "before", "0")]
            if not ok or min(ok) > at:
                bad.append(f"1: approved {event_id} before a successful run of its before-hooks")

    def _check_event(
        self,
        e: Injected,
        starts: list[tuple[str, str, float]],
        approvals: dict[str, float],
        interrupted: set[Any],
        gone: Optional[float],
    ) -> None:
        """2: ours approved; 3: after/cancelled at most once (once if up); 4: none late."""
        bad = self.report.violations
        event_id = e.event_id
        runs = Counter(stage for i, stage, _ in starts if i == event_id)
        if e.kind in ("others", "started", "short") and runs["before"]:
            bad.append(f"hooks ran for {event_id} ({e.kind}), which gets none")
        if (
            e.kind in ("ours", "short")
            and event_id not in approvals
            and event_id not in self.rebooted
        ):
            bad.append(f"2: {event_id} ({e.kind} {e.event_type}) was never approved")
        for stage in ("after", "cancelled"):
            if runs[stage] > 1:
                bad.append(f"3: {stage}-hooks ran {runs[stage]} times for {event_id}")
        wants_after = e.kind == "ours" and e.event_type in ("Reboot", "Redeploy")
        if wants_after and runs["after"] == 0 and event_id not in interrupted:
            bad.append(f"3: no after-hooks for {event_id} although the daemon was up")
        late = [
            t - gone
            for i, stage, t in starts
            if i == event_id and stage == "before" and gone is not None and t > gone + 1.0
        ]
        if late:
            bad.append(f"4: before-hooks of {event_id} started {late[0]:.2f} s after it was over")


FLEET_VMS = ("vm-a", "vm-b", "vm-c")
FLEET_HOOK = """#!/bin/sh
what="$SCHEDULED_EVENT_ID $SCHEDULED_EVENT_STAGE $SCHEDULED_EVENT_VM_NAME"
echo "start $what $(date +%s.%N)" >> "$CAMPAIGN_LOG"
sleep "0.$(shuf -i 0-60 -n 1)"
code=0
case "$SCHEDULED_EVENT_DESCRIPTION" in
    *"FAIL-$SCHEDULED_EVENT_VM_NAME"*) [ "$SCHEDULED_EVENT_STAGE" = before ] && code=1 ;;
esac
echo "end $what $(date +%s.%N) $code" >> "$CAMPAIGN_LOG"
exit $code
"""


class FleetCampaign:
    """Three daemons sharing events through a real 3-member etcd cluster (`approve: all`);
    each round kills one of them. A shared event may be approved only once every VM it names
    has finished its before-hooks successfully, and never when one of them failed."""

    def __init__(self, work: Path, seed: int, cluster: Any) -> None:
        self.work = work
        self.rng = random.Random(seed)  # noqa: S311 - a replayable campaign, not a secret
        self.cluster = cluster
        self.sim = Simulator(
            Scenario(vm_name="vm-a", start_after_approval=0.3, started_for=0.6), rate_limit=False
        )
        self.sim.start()
        self.log = work / "hooks.log"
        hook = work / "hook"
        hook.write_text(FLEET_HOOK)
        hook.chmod(0o755)
        self.hook = str(hook)
        self.boot = work / "boot_id"
        self.boot.write_text(str(uuid.uuid4()) + "\n")
        self.injected: dict[str, Injected] = {}
        self.report = Report()
        self.daemons: dict[str, Daemon] = {}

    def config(self, vm: str) -> Path:
        path = self.work / f"{vm}.json"
        path.write_text(
            json.dumps(
                {
                    "metadata": {"url": self.sim.url, "poll_interval": 0.25, "timeout": 2},
                    "vm_name": vm,
                    "state_dir": str(self.work / vm),
                    "approve": "all",
                    "coordination": {
                        "etcd": {"endpoints": self.cluster.endpoints, "prefix": "/campaign"}
                    },
                    "hooks": {n: [{"command": [self.hook], "timeout": 30}] for n in ("p", "q")},
                    "events": {"Reboot": {"before": ["p"], "after": ["q"]}},
                    "environment": {"CAMPAIGN_LOG": str(self.log)},
                    "shutdown_grace": 5,
                }
            )
        )
        return path

    def start(self, vm: str) -> None:
        self.daemons[vm] = Daemon(self.config(vm), self.boot)
        _wait(lambda: self.daemons[vm].seen("document_changed"), 20)

    def inject(self) -> None:
        kind = self.rng.choice(["shared", "shared", "shared", "failing", "pair"])
        resources = list(FLEET_VMS) if kind != "pair" else ["vm-a", "vm-b"]
        failing = self.rng.choice(FLEET_VMS)
        spec = {
            "EventType": "Reboot",
            "Resources": resources,
            "not_before_in": 600,
            "Description": f"FAIL-{failing}" if kind == "failing" else "maintenance",
        }
        event_id = self.sim.add_from_spec(spec)
        self.injected[event_id] = Injected(event_id, kind, "Reboot", time.time())
        self.report.events[kind] += 1

    def run(self, kills: int) -> Report:
        for vm in FLEET_VMS:
            self.start(vm)
        try:
            while self.report.kills + self.report.terms < kills:
                for _ in range(self.rng.randint(0, 2)):
                    self.inject()
                vm = self.rng.choice(FLEET_VMS)
                time.sleep(self.rng.uniform(0.1, 2.0))
                signo = signal.SIGTERM if self.rng.random() < 0.15 else signal.SIGKILL
                self.daemons[vm].kill(signo)
                if signo == signal.SIGKILL:
                    self.report.kills += 1
                else:
                    self.report.terms += 1
                _, problem = StateStore(self.work / vm).load()
                if problem:
                    self.report.violations.append(f"{vm}: the state file did not load: {problem}")
                self.start(vm)
            pending = {e for e, i in self.injected.items() if i.kind != "failing"}
            _wait(lambda: not pending & set(self.sim.event_ids()), 60)
            time.sleep(2)
        finally:
            for daemon in self.daemons.values():
                daemon.kill(signal.SIGTERM)
            self.sim.stop()
        self.check()
        return self.report

    def check(self) -> None:
        r = self.report
        fields = _hook_log(self.log)
        ends = [(f[1], f[2], f[3], float(f[4]), f[5]) for f in fields if f[0] == "end"]
        starts = [(f[1], f[2], f[3]) for f in fields if f[0] == "start"]
        approvals = _first_approvals(self.sim)
        r.approvals = len(approvals)
        r.before_runs = sum(1 for _, stage, _ in starts if stage == "before")
        r.after_runs = sum(1 for _, stage, _ in starts if stage == "after")
        for event_id, e in self.injected.items():
            names = FLEET_VMS if e.kind != "pair" else ("vm-a", "vm-b")
            at = approvals.get(event_id)
            if e.kind == "failing" and at is not None:
                r.violations.append(f"1: {event_id} approved although a VM's hooks failed")
            if e.kind != "failing" and at is None:
                r.violations.append(f"2: shared {event_id} ({e.kind}) was never approved")
            if at is not None:
                for vm in names:
                    ok = [
                        t
                        for i, stage, v, t, code in ends
                        if (i, stage, v, code) == (event_id, "before", vm, "0")
                    ]
                    if not ok or min(ok) > at:
                        r.violations.append(f"1: {event_id} approved before {vm}'s hooks succeeded")
            for vm in names:
                after = sum(1 for i, stage, v in starts if (i, stage, v) == (event_id, "after", vm))
                if after > 1:
                    r.violations.append(f"3: after-hooks ran {after} times on {vm} for {event_id}")


# ---- A group under faults: one concurrency group, partitions from etcd, member and daemon kills --


class Proxy:
    """A TCP proxy of one daemon's own, one listening port per target: it forwards, holds
    (stops forwarding: connections stay open, bytes wait in the kernel's buffers and flow
    again when healed, as across a partition that heals before TCP gives up) or resets (every
    connection, and each new one, ends with a RST). One selector thread; `last_request` is
    when a client last sent anything (time.time()), which tells a daemon that still polls."""

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.mode = "forward"
        self.last_request = 0.0
        self._want = "forward"
        self._selector = selectors.DefaultSelector()
        self._ports: list[int] = []
        self._pairs: dict[socket.socket, socket.socket] = {}  # each end -> the other end
        self._clients: set[socket.socket] = set()  # the ends that face the daemon
        self._pending: list[tuple[socket.socket, tuple[str, int]]] = []  # accepted while held
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        for target in targets:
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            self._selector.register(listener, selectors.EVENT_READ, ("accept", target))
            self._ports.append(listener.getsockname()[1])
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="proxy", daemon=True)
        self._thread.start()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self._ports]

    def set(self, mode: str) -> None:
        """forward | hold | reset; applied by the proxy's thread within a moment."""
        self._want = mode
        self._wake_w.send(b".")

    def stop(self) -> None:
        self._stopped = True
        self._wake_w.send(b".")
        self._thread.join(5)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        for sock in [*self._pairs, *(client for client, _ in self._pending)]:
            sock.close()
        self._selector.close()
        self._wake_w.close()

    def _loop(self) -> None:
        while not self._stopped:
            for key, _ in self._selector.select(0.5):
                kind, data = key.data
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if kind == "wake":
                    sock.recv(4096)
                    self._apply()
                elif kind == "accept":
                    self._accept(sock, data)
                elif sock in self._pairs:
                    self._relay(sock, client=kind == "client")

    def _apply(self) -> None:
        want = self._want
        if want == self.mode:
            return
        if want in ("reset", "hold") or self.mode == "reset":
            for sock in list(self._pairs):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
        if want == "reset":
            for sock in list(self._pairs):
                _reset(sock)
            self._pairs.clear()
            self._clients.clear()
            for client, _ in self._pending:
                _reset(client)
            self._pending.clear()
        if want == "forward":
            for sock in self._pairs:
                self._selector.register(sock, selectors.EVENT_READ, self._role(sock))
            pending, self._pending = self._pending, []
            for client, target in pending:
                self._connect(client, target)
        self.mode = want

    def _role(self, sock: socket.socket) -> tuple[str, None]:
        return ("client" if sock in self._clients else "upstream", None)

    def _accept(self, listener: socket.socket, target: tuple[str, int]) -> None:
        client, _ = listener.accept()
        if self.mode == "reset":
            _reset(client)
        elif self.mode == "hold":
            self._pending.append((client, target))
        else:
            self._connect(client, target)

    def _connect(self, client: socket.socket, target: tuple[str, int]) -> None:
        try:
            upstream = socket.create_connection(target, timeout=1)
        except OSError:  # a member that is down: the client sees its connection reset
            _reset(client)
            return
        client.settimeout(5)
        upstream.settimeout(5)
        self._clients.add(client)
        self._pairs[client], self._pairs[upstream] = upstream, client
        self._selector.register(client, selectors.EVENT_READ, ("client", None))
        self._selector.register(upstream, selectors.EVENT_READ, ("upstream", None))

    def _relay(self, sock: socket.socket, *, client: bool) -> None:
        other = self._pairs[sock]
        try:
            data = sock.recv(65536)
            if data:
                other.sendall(data)
                if client:
                    self.last_request = time.time()
                return
        except OSError:
            pass
        for end in (sock, other):  # one side closed or failed: so does the other
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(end)
            self._pairs.pop(end, None)
            self._clients.discard(end)
            end.close()


def _reset(sock: socket.socket) -> None:
    """Close with a RST (SO_LINGER 0), as a dropped path or a restarted middlebox does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


GROUP_HOOK = """#!/bin/sh
# $1: drain | undrain. Logs its start and end (as FLEET_HOOK); a drain takes the seconds its
# event's Description names (drain=S), so the seed decides every drain's length. A drain also
# logs, read from etcd itself (not through its daemon's proxy) as it starts, the groups whose
# slot its VM holds then: `held ... TIME GROUP,GROUP` ("-": none; "?": etcd did not answer);
# the keys it read go to hooks.log.etcd, for whoever reads a failure.
what="$SCHEDULED_EVENT_ID $SCHEDULED_EVENT_STAGE $SCHEDULED_EVENT_VM_NAME"
echo "start $what $(date +%s.%N)" >> "$CAMPAIGN_LOG"
if [ "$1" = drain ]; then
    if slots=$(etcdctl --endpoints="$CAMPAIGN_ETCD" --command-timeout=2s \\
            get --prefix "$CAMPAIGN_SLOTS" 2>/dev/null); then
        groups=$(printf '%s\\n' "$slots" \\
            | awk -v me="\\"vm\\": \\"$SCHEDULED_EVENT_VM_NAME\\"" 'NR % 2 == 1 { key = $0 }
                NR % 2 == 0 && index($0, me) { split(key, p, "/"); print p[4] }' \\
            | sort -u | paste -sd, -)
    else
        groups="?"
    fi
    echo "held $what $(date +%s.%N) ${groups:--}" >> "$CAMPAIGN_LOG"
    echo "$what $(printf '%s' "$slots" | paste -sd' ' -)" >> "$CAMPAIGN_LOG.etcd"
    sleep "${SCHEDULED_EVENT_DESCRIPTION##*drain=}"
fi
echo "end $what $(date +%s.%N) 0" >> "$CAMPAIGN_LOG"
"""
GROUP_MAX = 1
GROUP_TTL = 5  # concurrency.ttl's least: a lost lease expires soon after a partition begins


@dataclass
class GroupEvent:
    event_id: str
    vm: str
    added: float
    not_before: float  # wall clock; moved when the campaign brings NotBefore nearer
    drain: float
    warped: Optional[float] = None  # when NotBefore was brought to now (see bring_not_before)


@dataclass
class GroupReport:
    seed: int
    vms: int
    partitions: Counter[str] = field(default_factory=Counter)
    member_kills: int = 0
    quorum_losses: int = 0
    daemon_kills: int = 0
    events: int = 0
    early: int = 0  # approved before NotBefore (with the slot)
    at_not_before: int = 0  # prepared, not approved, started by the platform at NotBefore
    most_at_once: int = 0
    violations: list[str] = field(default_factory=list)
    history: list[str] = field(default_factory=list)  # around each overlap: what happened

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "daemons": self.vms,
            "partitions from etcd": dict(self.partitions),
            "etcd member kills": self.member_kills,
            "of them quorum losses": self.quorum_losses,
            "daemon kill -9s": self.daemon_kills,
            "events": self.events,
            "approved early": self.early,
            "proceeded at NotBefore": self.at_not_before,
            "most VMs at once between before-hooks and early approval": self.most_at_once,
            "violations": self.violations,
            "history": self.history,
        }


class GroupCampaign:
    """`vms` daemons of one concurrency group (`max: 1`, ttl 5) against a real 3-member etcd,
    each through a proxy of its own, so that one can be cut off from etcd alone; every VM gets
    a Reboot of its own again and again (NotBefore a little over the 10-minute lead away, so a
    slot is asked for at once), drains for seconds; meanwhile, at seeded random instants (and
    half the time right after a drain started), one daemon is partitioned from etcd (held or
    reset) and healed, etcd members (one, or two: the quorum) are killed and started again,
    daemons are killed -9 and started again. Checked from the simulator's approvals and the
    hooks' log: at no instant are more than `max` VMs between the start of their before-hooks
    and an early approval; every event is approved early or prepared and started by the
    platform at its NotBefore; every daemon up keeps polling; state files load; no daemon
    reports a defect.

    Time is compressed once: an event that got no slot by its lead prepares without one and
    waits for NotBefore, ten minutes on; once its drain has ended, the campaign brings its
    NotBefore to now (Azure's clock, fast-forwarded) and the simulator starts it."""

    LIVENESS = 10.0  # seconds without a request to IMDS that count as "stopped polling"

    def __init__(
        self, work: Path, seed: int, cluster: Any, vms: int = 3, root: Path = ROOT
    ) -> None:
        """`root`: the daemons' package (a mutant's copy, to see the campaign catch it)."""
        self.work = work
        self.root = root
        self.seed = seed
        self.rng = random.Random(seed)  # noqa: S311 - a replayable campaign, not a secret
        self.cluster = cluster
        self.vms = [f"vm-{chr(ord('a') + i)}" for i in range(vms)]
        self.sim = Simulator(
            Scenario(vm_name=self.vms[0], start_after_approval=0.3, started_for=0.6),
            rate_limit=False,
        )
        self.sim.start()
        self.log = work / "hooks.log"
        hook = work / "hook"
        hook.write_text(GROUP_HOOK)
        hook.chmod(0o755)
        self.hook = str(hook)
        self.boots = {vm: work / f"{vm}.boot_id" for vm in self.vms}  # a VM's boot: its own
        for boot in self.boots.values():
            boot.write_text(str(uuid.uuid4()) + "\n")
        members = [("127.0.0.1", port) for port in cluster.client_ports]
        sim_port = int(self.sim.url.split(":")[2].split("/")[0])
        self.etcd_proxies = {vm: Proxy(members) for vm in self.vms}
        self.imds_proxies = {vm: Proxy([("127.0.0.1", sim_port)]) for vm in self.vms}
        self.daemons: dict[str, Optional[Daemon]] = {}
        self.started_at: dict[str, float] = {}
        self.records: list[tuple[str, dict[str, Any]]] = []  # (vm, log record), every run
        self.events: dict[str, GroupEvent] = {}
        self.free_at = {vm: 0.0 for vm in self.vms}  # when a VM may get its next event
        self.current: dict[str, str] = {}  # each VM's latest event
        self.faults: list[tuple[float, str]] = []  # (time.time(), what): the fault timeline
        self.pending: list[tuple[float, str, Any]] = []  # (monotonic, heal|member|daemon, who)
        # Per VM, what may cost it its slot by design, (kind, from, to) in time.time(): a
        # partition from etcd (to: healed; inf while cut off), a kill -9 (from = to).
        self.outages: dict[str, list[list[Any]]] = {vm: [] for vm in self.vms}
        self.cut_short = False
        self.fault_every = 5.0  # s, the mean between faults at random instants
        self.partition_drains = 0.5  # the share of drains followed at once by a partition
        self.report = GroupReport(seed, vms)

    # ---- the fleet ----------------------------------------------------------------------

    def config(self, vm: str) -> Path:
        path = self.work / f"{vm}.json"
        cmd = lambda name: [{"command": [self.hook, name], "timeout": 60}]  # noqa: E731
        path.write_text(
            json.dumps(
                {
                    "metadata": {
                        "url": self.imds_proxies[vm].urls[0] + SCHEDULED_EVENTS_PATH,
                        "poll_interval": 0.25,
                        "timeout": 2,
                    },
                    "vm_name": vm,
                    "state_dir": str(self.work / vm),
                    "approve": "always",
                    "coordination": {
                        "etcd": {
                            "endpoints": self.etcd_proxies[vm].urls,
                            "prefix": "/campaign",
                            "timeout": 2,
                        }
                    },
                    "concurrency": self.concurrency(vm),
                    "hooks": {"drain": cmd("drain"), "undrain": cmd("undrain")},
                    "events": {"Reboot": {"before": ["drain"], "after": ["undrain"]}},
                    "environment": {
                        "CAMPAIGN_LOG": str(self.log),
                        "CAMPAIGN_ETCD": ",".join(self.cluster.endpoints),
                        "CAMPAIGN_SLOTS": "/campaign/slots/",
                    },
                    "shutdown_grace": 5,
                }
            )
        )
        return path

    def concurrency(self, vm: str) -> Any:
        """The `concurrency` of `vm`'s config: one group (the mapping form)."""
        return {"group": "tier", "max": GROUP_MAX, "ttl": GROUP_TTL}

    def start(self, vm: str) -> None:
        self.daemons[vm] = Daemon(self.config(vm), self.boots[vm], self.root)
        self.started_at[vm] = time.time()

    def kill(self, vm: str, signo: int = signal.SIGKILL) -> None:
        daemon = self.daemons.get(vm)
        if daemon is None:
            return
        daemon.kill(signo)
        self.records += [(vm, r) for r in daemon.records]
        self.daemons[vm] = None
        _, problem = StateStore(self.work / vm).load()
        if problem:
            self.report.violations.append(f"{vm}: the state file did not load: {problem}")

    def note(self, what: str) -> None:
        self.faults.append((time.time(), what))

    # ---- events -------------------------------------------------------------------------

    def inject(self, lead_extra: tuple[float, float]) -> None:
        """A Reboot for each VM that has none open: mostly with NotBefore past the 10-minute
        lead (a slot is asked for), some inside it (prepared at once without one)."""
        now = time.time()
        for vm in self.vms:
            if self.free_at[vm] > now:
                continue
            near = self.rng.random() < 0.15
            ahead = (
                self.rng.uniform(15, 30) if near else WINDOW_LEAD + self.rng.uniform(*lead_extra)
            )
            drain = round(self.rng.uniform(3, 9), 1)
            event_id = self.sim.add_from_spec(
                {
                    "EventType": "Reboot",
                    "Resources": [vm],
                    "not_before_in": ahead,
                    "Description": f"maintenance drain={drain}",
                }
            )
            self.events[event_id] = GroupEvent(event_id, vm, now, now + ahead, drain)
            self.current[vm] = event_id
            self.free_at[vm] = float("inf")  # set once this one is over
            self.report.events += 1

    def settle_events(self) -> None:
        """Frees VMs whose event is over (after a pause), and brings NotBefore to now for an
        event prepared without a slot: its lead has passed, its drain ended, no approval."""
        now = time.time()
        present = set(self.sim.event_ids())
        ended = {(f[1], f[3]) for f in _hook_log(self.log) if f[0] == "end" and f[2] == "before"}
        approved = {a.event_id for a in self.sim.approvals}
        for vm, event_id in self.current.items():
            if event_id not in present and self.free_at[vm] == float("inf"):
                self.free_at[vm] = now + self.rng.uniform(1, 4)
        for e in self.events.values():
            if e.event_id not in present:
                continue
            lead_passed = now > e.not_before - WINDOW_LEAD
            prepared = (e.event_id, e.vm) in ended and e.event_id not in approved
            if e.warped is None and lead_passed and prepared:
                e.warped = now
                e.not_before = now + 1
                self.sim.update_event(e.event_id, NotBefore=rfc1123(e.not_before))
                self.note(f"NotBefore of {e.vm}'s {e.event_id[:8]} brought to now")

    # ---- faults -------------------------------------------------------------------------

    def draining(self) -> list[str]:
        """VMs whose before-hooks have started and not ended (per the hooks' own log)."""
        running: set[tuple[str, str]] = set()
        for f in _hook_log(self.log):
            if f[2] == "before" and f[0] in ("start", "end"):
                (running.add if f[0] == "start" else running.discard)((f[1], f[3]))
        up = {vm for vm, d in self.daemons.items() if d is not None}
        return sorted({vm for _, vm in running} & up)

    def fault(self) -> None:
        """One fault at a random instant: a partition, etcd members or a daemon killed."""
        kind = self.rng.choices(["partition", "member", "daemon"], [4, 2, 2])[0]
        now = time.monotonic()
        if kind == "partition":
            busy = {who for _, what, who in self.pending if what == "heal"}
            targets = [vm for vm in self.vms if vm not in busy]
            if targets:
                self.partition(self.rng.choice(targets), "at a random instant")
        elif kind == "member":
            up = [i for i, p in enumerate(self.cluster.procs) if p is not None and p.poll() is None]
            if len(up) < 3:
                return
            victims = self.rng.sample(up, 2 if self.rng.random() < 0.25 else 1)
            for i in victims:
                self.cluster.kill(i)
                self.pending.append((now + self.rng.uniform(2, 8), "member", i))
            self.note(f"etcd member(s) {victims} killed")
            self.report.member_kills += len(victims)
            self.report.quorum_losses += len(victims) > 1
        else:
            up_vms = [vm for vm, d in self.daemons.items() if d is not None]
            if not up_vms:
                return
            draining = self.draining()
            vm = self.rng.choice(draining if draining and self.rng.random() < 0.5 else up_vms)
            self.kill(vm)
            self.outages[vm].append(["kill -9", time.time(), time.time()])
            self.note(f"{vm}'s daemon killed -9")
            self.report.daemon_kills += 1
            self.pending.append((now + self.rng.uniform(0.5, 4), "daemon", vm))

    def partition(self, vm: str, why: str) -> None:
        """Cut `vm` off from etcd (held or reset) for 3-14 s: often past its lease's ttl."""
        mode = self.rng.choice(["hold", "reset"])
        seconds = self.rng.uniform(3, 14)
        self.etcd_proxies[vm].set(mode)
        self.outages[vm].append(["partition", time.time(), float("inf")])
        self.note(f"{vm} cut off from etcd ({mode}) {why} for {seconds:.1f} s")
        self.report.partitions[mode] += 1
        self.pending.append((time.monotonic() + seconds, "heal", vm))

    def on_drain_started(self, seen: set[tuple[str, str, str]]) -> None:
        """The chosen moment: half the drains are followed at once by a partition of their VM
        from etcd (while it holds the slot, most likely)."""
        for f in _hook_log(self.log):
            if f[0] != "start" or f[2] != "before" or (f[1], f[3], f[4]) in seen:
                continue
            seen.add((f[1], f[3], f[4]))
            busy = {who for _, what, who in self.pending if what == "heal"}
            if f[3] not in busy and self.rng.random() < self.partition_drains:
                self.partition(f[3], f"right after its drain of {f[1][:8]} started")

    def undo_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        due = [p for p in self.pending if everything or p[0] <= now]
        self.pending = [p for p in self.pending if p not in due]
        for _, what, who in due:
            if what == "heal":
                self.etcd_proxies[who].set("forward")
                cut = [o for o in self.outages[who] if o[0] == "partition" and o[2] == float("inf")]
                cut[-1][2] = time.time()
                self.note(f"{who} healed")
            elif what == "member":
                self.cluster.start(who)
                self.note(f"etcd member {who} started again")
            elif what != "daemon":
                self.undo(what, who)
            else:
                self.start(who)
                self.note(f"{who}'s daemon started again")

    def undo(self, what: str, who: Any) -> None:
        """A pending undo of a kind a variant adds (none here)."""
        raise ValueError(what)

    def tick(self) -> bool:
        """A variant's own moves, each turn of the run's loop; True: stop the faults now."""
        return False

    def at_rest(self) -> None:
        """Every daemon is up and every event over: a variant's last checks (none here)."""

    def check_polling(self) -> None:
        """Every daemon up for a while has sent IMDS something within LIVENESS seconds."""
        now = time.time()
        for vm, daemon in self.daemons.items():
            if daemon is None or now - self.started_at[vm] < 2 * self.LIVENESS:
                continue
            quiet = now - self.imds_proxies[vm].last_request
            if quiet > self.LIVENESS and not any(vm in v for v in self.report.violations):
                self.report.violations.append(f"{vm}'s daemon stopped polling ({quiet:.0f} s)")

    # ---- the run ------------------------------------------------------------------------

    def run(self, seconds: float, lead_extra: tuple[float, float] = (10, 30)) -> GroupReport:
        try:
            for vm in self.vms:
                self.start(vm)
            for vm in self.vms:
                _wait(lambda vm=vm: self.daemons[vm].seen("document_changed"), 20)  # type: ignore[union-attr]
            end = time.monotonic() + seconds
            next_fault = time.monotonic() + self.rng.expovariate(1 / self.fault_every)
            drains: set[tuple[str, str, str]] = set()
            while time.monotonic() < end:
                self.inject(lead_extra)
                self.settle_events()
                self.undo_due()
                self.on_drain_started(drains)
                if time.monotonic() >= next_fault:
                    self.fault()
                    next_fault = time.monotonic() + self.rng.expovariate(1 / self.fault_every)
                self.check_polling()
                if self.tick():
                    self.cut_short = True  # a variant saw enough: no settling either
                    break
                time.sleep(0.1)
            self.undo_due(everything=True)
            self.cluster.healthy()
            limit = time.monotonic() + (0 if self.cut_short else lead_extra[1] + 60)
            while time.monotonic() < limit and set(self.events) & set(self.sim.event_ids()):
                self.settle_events()
                self.check_polling()
                time.sleep(0.1)
            time.sleep(2)  # the last after-hooks
            self.at_rest()
        finally:
            for vm in self.vms:
                self.kill(vm, signal.SIGTERM)
            for proxy in [*self.etcd_proxies.values(), *self.imds_proxies.values()]:
                proxy.stop()
            self.sim.stop()
            with (self.work / "daemons.jsonl").open("w") as out:  # for whoever reads a failure
                out.writelines(json.dumps(dict(r, vm=vm)) + "\n" for vm, r in self.records)
            with (self.work / "faults.txt").open("w") as out:
                out.writelines(f"{_clock(t)} {what}\n" for t, what in self.faults)
        self.check()
        return self.report

    # ---- the invariants -----------------------------------------------------------------

    def check(self) -> None:
        r = self.report
        fields = _hook_log(self.log)
        starts = [(f[1], f[3], float(f[4])) for f in fields if f[0] == "start" and f[2] == "before"]
        ends = [
            (f[1], f[3], float(f[4]), f[5]) for f in fields if f[0] == "end" and f[2] == "before"
        ]
        approvals = _first_approvals(self.sim)
        started = {e: t for t, e, what in self.sim.history if what == "started"}
        spans: list[tuple[float, float, GroupEvent]] = []
        for e in self.events.values():
            at = approvals.get(e.event_id)
            mine = [t for i, vm, t in starts if (i, vm) == (e.event_id, e.vm)]
            if at is not None and at < e.not_before:  # an early approval
                r.early += 1
                before = [t for t in mine if t <= at]
                ok = [t for i, vm, t, code in ends if (i, vm, code) == (e.event_id, e.vm, "0")]
                if not before or not ok or min(ok) > at:
                    r.violations.append(f"{e.vm}'s {e.event_id} approved before its drain ended")
                    continue
                spans.append((max(before), at, e))
            elif e.event_id in started:
                r.at_not_before += 1
                if not [t for t in mine if t <= started[e.event_id]]:
                    r.violations.append(f"{e.vm}'s {e.event_id} started unprepared")
            elif not self.cut_short:  # cut short, some had no time to end
                r.violations.append(f"{e.vm}'s {e.event_id} neither approved nor started: lost")
        self._check_overlap(spans)
        for vm, rec in self.records:
            if rec.get("event") in ("transition_refused", "internal_error"):
                r.violations.append(f"{vm} logged {rec.get('event')}: {rec}")

    def _check_overlap(self, spans: list[tuple[float, float, GroupEvent]]) -> None:
        """At no instant more than GROUP_MAX VMs between before-hooks start and early approval."""
        edges = sorted(
            [(s, 1, e) for s, _, e in spans] + [(a, -1, e) for _, a, e in spans],
            key=lambda x: (x[0], x[1]),
        )
        inside: list[GroupEvent] = []
        for _at, step, e in edges:
            if step < 0:
                inside.remove(e)
                continue
            inside.append(e)
            self.report.most_at_once = max(self.report.most_at_once, len(inside))
            if len(inside) > GROUP_MAX:
                both = ", ".join(f"{x.vm} ({x.event_id[:8]})" for x in inside)
                self.report.violations.append(
                    f"{len(inside)} VMs between before-hooks and early approval at once "
                    f"(max {GROUP_MAX}): {both}"
                )
                self._history([(s, a, x) for s, a, x in spans if x in inside])

    def _history(self, spans: list[tuple[float, float, GroupEvent]]) -> None:
        """The faults, approvals, drains and slot records around an overlap, in time order."""
        lo = min(s for s, _, _ in spans) - 10
        hi = max(a for _, a, _ in spans) + 1
        vms = {e.vm for _, _, e in spans}
        lines: list[tuple[float, str]] = [(t, f"fault: {what}") for t, what in self.faults]
        for s, a, e in spans:
            lines.append((s, f"{e.vm}: drain of {e.event_id[:8]} started ({e.drain} s)"))
            lines.append((a, f"{e.vm}: {e.event_id[:8]} approved (NotBefore {e.not_before:.0f})"))
        for vm, rec in self.records:
            name = str(rec.get("event", ""))
            if vm in vms and (name.startswith("slot_") or name in _TOLD):
                at = _wall(rec.get("timestamp"))
                detail = rec.get("cause") or rec.get("kind") or rec.get("reason") or ""
                event = str(rec.get("event_id", ""))[:8]
                lines.append((at, f"{vm}: {name} {event} {str(detail)[:80]}".rstrip()))
        self.report.history.append(f"-- {' and '.join(sorted(vms))} at once:")
        self.report.history += [f"{_clock(t)} {text}" for t, text in sorted(lines) if lo <= t <= hi]


# The records a violation's history shows besides every slot_* one.
_TOLD = ("event_detected", "event_approved", "event_not_approved", "daemon_starting")


def _wall(text: Any) -> float:
    """A record's ISO timestamp as time.time() (0 when it has none)."""
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def _hook_log(path: Path) -> list[list[str]]:
    """The hooks' own log, a line each: start|end, event, stage, ..., time[, exit status]."""
    text = path.read_text() if path.exists() else ""
    return [line.split() for line in text.splitlines()]


def _first_approvals(sim: Simulator) -> dict[str, float]:
    """When each event's first approval POST reached the simulator."""
    approvals: dict[str, float] = {}
    for a in sim.approvals:
        approvals.setdefault(a.event_id, a.at)
    return approvals


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument(
        "--fleet", action="store_true", help="three VMs sharing events through a real etcd"
    )
    parser.add_argument(
        "--group",
        action="store_true",
        help="one concurrency group (max 1) under etcd partitions, member and daemon kills",
    )
    parser.add_argument("--seconds", type=float, default=600, help="--group: faults this long")
    parser.add_argument("--vms", type=int, default=3, help="--group: daemons of the group")
    parser.add_argument(
        "--hold",
        action="store_true",
        help="--group: and tier and zone groups, long maintenances, operator frees (issue 28)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sed-campaign-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        if args.fleet or args.group:
            from tests.etcd_cluster import Cluster  # noqa: PLC0415 - only the fleet needs etcd

            with Cluster(work / "etcd") as cluster:
                if args.hold:
                    from tests.campaign_hold import HoldCampaign  # noqa: PLC0415 - a variant

                    campaign: Any = HoldCampaign(work, args.seed, cluster, args.vms)
                else:
                    campaign = GroupCampaign(work, args.seed, cluster, args.vms)
                report: Any = (
                    campaign.run(args.seconds)
                    if args.group
                    else FleetCampaign(work, args.seed, cluster).run(args.kills)
                )
        else:
            report = Campaign(work, args.seed).run(args.kills)
    summary = report.summary()
    summary["seed"] = args.seed
    summary["seconds"] = round(time.monotonic() - began)
    print(json.dumps(summary, indent=2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
