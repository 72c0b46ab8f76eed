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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
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

from scheduledeventsd.host.store import StateStore
from scheduledeventsd.lifecycle import PREPARED, Rule
from scheduledeventsd.simulators.azure import Simulator
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

    def __init__(self, config: Path, boot_file: Path) -> None:
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
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)},
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sed-campaign-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        if args.fleet:
            from tests.etcd_cluster import Cluster  # noqa: PLC0415 - only the fleet needs etcd

            with Cluster(work / "etcd") as cluster:
                report = FleetCampaign(work, args.seed, cluster).run(args.kills)
        else:
            report = Campaign(work, args.seed).run(args.kills)
    summary = report.summary()
    summary["seed"] = args.seed
    summary["seconds"] = round(time.monotonic() - began)
    print(json.dumps(summary, indent=2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
