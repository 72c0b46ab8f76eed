"""The group campaign extended to the whole-maintenance hold (issue 28): besides its partitions
and kills, several groups at once (each VM in a tier and a zone, the list form of
`concurrency`), long maintenances (an approved VM's daemon stopped as for its reboot, for
longer than `ttl`, then started again on a new boot, or not before `hold_max`) and operator
frees (`scheduledeventsd fleet free VM`, a real CLI process, at random instants).

The invariant, from the hooks' own records at every instant they record: per group, never
more VMs in early maintenance than its `max`. A VM is in early maintenance for an event
approved early from the start of the before-hooks that led to the approval until its slot is
released: its after-hooks succeeded; or, as documented, sooner: an operator freed it (the
free's instant), its VM was not back within `hold_max` of the hold lease's last renewal (its
daemon's stop, or sooner when etcd was out of reach then), or a fault (a kill -9, a partition
from etcd, a stop while etcd had no quorum) came after the approval but before its daemon
said the slot was on the hold lease (`slot_held_through`: after that, none of them costs it
the slot). And no before-hooks leading to an early approval start while their VM
holds no slot in one of its groups (the drain hook reads etcd itself as it starts). At rest,
every daemon up and every event over, no slot is left held.

    python -m tests.campaign --group --hold --seconds 600 --vms 5 --seed N
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from scheduledeventsd.config import Etcd
from scheduledeventsd.coordination.etcd import EtcdClient, EtcdError
from scheduledeventsd.simulators.azure import rfc1123
from tests.campaign import (
    GROUP_TTL,
    ROOT,
    GroupCampaign,
    GroupEvent,
    GroupReport,
    _clock,
    _first_approvals,
    _hook_log,
    _wall,
)

HOLD_MAX = 25  # s: a VM away longer than this frees its slot (check-config would warn: a test)
BACK_IN = (1.5 * GROUP_TTL, 3 * GROUP_TTL)  # a maintenance that returns: well past the ttl
TAKE_BACK = 5.0  # s from a daemon's start to its slot taken back, at most (else: not back)
SLOTS = "/campaign/slots/"
HELD = "slot_held_through"  # the daemon's record: its slot is on the hold lease
MEMBER_DOWN = 8.0  # s: an etcd member killed is started again within this (GroupCampaign)


def places(vms: list[str]) -> tuple[dict[str, tuple[str, ...]], dict[str, int]]:
    """Each VM's tier (web, db alternately) and zone (a, b by pairs), and each group's max:
    both kinds bind (vm-a shares web with vm-c and zone-a with vm-b)."""
    place = {
        vm: ("web" if i % 2 == 0 else "db", f"zone-{'ab'[i // 2 % 2]}") for i, vm in enumerate(vms)
    }
    wide = len(vms) > 3
    return place, {"web": 2 if wide else 1, "db": 1, "zone-a": 2 if wide else 1, "zone-b": 1}


def planted(work: Path, path: str, old: str, new: str) -> Path:
    """A copy of the daemon's package with one defect planted, `old` replaced by `new` in
    `path` (under scheduledeventsd/): the root a mutant's campaign runs its daemons from."""
    root = work / "mutant"
    shutil.copytree(
        ROOT / "scheduledeventsd",
        root / "scheduledeventsd",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    target = root / "scheduledeventsd" / path
    text = target.read_text()
    if text.count(old) != 1:
        raise ValueError(f"the plant's site moved: {path} has {text.count(old)} of {old!r}")
    target.write_text(text.replace(old, new))
    return root


@dataclass
class Stop:
    """A daemon stopped for the maintenance its event was approved early for."""

    vm: str
    event_id: str
    at: float  # time.time() as SIGTERM was sent
    away: float  # seconds planned
    quorum: bool  # etcd had a quorum as it stopped (else its slot could not be moved)
    back: Optional[float] = None  # when its daemon was started again


@dataclass
class Free:
    """`scheduledeventsd fleet free VM`, run by the campaign as an operator would."""

    vm: str
    at: float  # as the CLI was started (it frees after this)
    status: int
    said: str
    events: tuple[str, ...]  # the events whose slot it says it freed


@dataclass
class Hold:
    """A VM in early maintenance for one event: from its before-hooks' start until released."""

    event: GroupEvent
    start: float
    approved: float
    end: float
    why: str  # what ended it


@dataclass
class HoldReport(GroupReport):
    stops: int = 0
    never_back: int = 0
    frees: Counter[str] = field(default_factory=Counter)
    holds: int = 0
    ended: Counter[str] = field(default_factory=Counter)  # what ended each hold
    most_in: dict[str, int] = field(default_factory=dict)  # per group, the most at once
    held_read: Counter[str] = field(default_factory=Counter)  # the drain hook's etcd reads

    def summary(self) -> dict[str, Any]:
        plain = super().summary()
        del plain["most VMs at once between before-hooks and early approval"]  # per group here
        return {
            **plain,
            "daemons stopped for their maintenance": self.stops,
            "of them not back within hold_max": self.never_back,
            "operator frees": dict(self.frees),
            "early maintenances checked": self.holds,
            "what ended them": dict(self.ended),
            "most VMs at once in early maintenance, per group": self.most_in,
            "slots read by the drains as they started": dict(self.held_read),
        }


class HoldCampaign(GroupCampaign):
    """GroupCampaign with several groups, long maintenances and operator frees; `away`: the
    share of early approvals whose daemon is then stopped, `never`: of those, the share not
    back before `hold_max`; `frees`: mean seconds between frees (0: none); `groups`: False
    keeps the one group of the mapping form; `until_violation`: stop as soon as the
    invariant breaks (a mutant's run)."""

    def __init__(
        self,
        work: Path,
        seed: int,
        cluster: Any,
        vms: int = 3,
        root: Path = ROOT,
        *,
        groups: bool = True,
        away: float = 0.6,
        never: float = 0.25,
        frees: float = 20.0,
        hold_max: int = HOLD_MAX,
        until_violation: bool = False,
    ) -> None:
        super().__init__(work, seed, cluster, vms, root)
        self.report: HoldReport = HoldReport(seed, vms)
        self.fault_every, self.partition_drains = 8.0, 0.25  # room for approvals to happen
        if groups:
            self.places, self.maxes = places(self.vms)
        else:
            self.places, self.maxes = {vm: ("tier",) for vm in self.vms}, {"tier": 1}
        self.groups = groups
        self.away_share, self.never_share, self.free_every = away, never, frees
        self.hold_max = hold_max
        self.until_violation = until_violation
        self.away: dict[str, Stop] = {}  # the VMs whose daemon is stopped for maintenance
        self.stops: list[Stop] = []
        self.frees: list[Free] = []
        self.decided: set[str] = set()  # early approvals whose stop was decided
        self.hurried: set[str] = set()  # freed events whose NotBefore was brought near
        self.next_free = time.monotonic() + self._free_delay()
        self.next_check = 0.0
        self.etcd = Etcd(endpoints=tuple(cluster.endpoints), prefix="/campaign", timeout=2)
        self.operator = work / "operator.json"

    def concurrency(self, vm: str) -> Any:
        shared = {"ttl": GROUP_TTL, "hold_max": self.hold_max}
        if not self.groups:
            return {"group": "tier", "max": 1, **shared}
        return [{"group": g, "max": self.maxes[g], **shared} for g in self.places[vm]]

    def start(self, vm: str) -> None:
        super().start(vm)
        if not self.operator.exists():  # the operator's: this VM's config, etcd reached directly
            cfg = json.loads((self.work / f"{vm}.json").read_text())
            cfg["coordination"]["etcd"]["endpoints"] = list(self.cluster.endpoints)
            self.operator.write_text(json.dumps(cfg))

    # ---- events -------------------------------------------------------------------------

    def inject(self, lead_extra: tuple[float, float]) -> None:
        """As the group's, but a VM away for its maintenance gets nothing new meanwhile."""
        now = time.time()
        for vm in self.away:
            self.free_at[vm] = max(self.free_at[vm], now + 1)
        super().inject(lead_extra)

    def settle_events(self) -> None:
        """As the group's; and an event whose slot an operator freed before its approval is
        not approved early (documented): its NotBefore is brought within the lead, so it
        prepares now and the group's rule then starts it."""
        super().settle_events()
        approved = {a.event_id for a in self.sim.approvals}
        present = set(self.sim.event_ids())
        for free in self.frees:
            for event_id in free.events:
                e = self.events.get(event_id)
                if e is None or event_id in self.hurried or event_id in approved:
                    continue
                self.hurried.add(event_id)
                if event_id in present and e.warped is None:
                    e.not_before = time.time() + 25
                    self.sim.update_event(event_id, NotBefore=rfc1123(e.not_before))
                    self.note(f"NotBefore of freed {e.vm}'s {event_id[:8]} brought within the lead")

    # ---- what this variant plays -------------------------------------------------------------

    def tick(self) -> bool:
        self.stop_approved()
        if self.free_every and time.monotonic() >= self.next_free:
            ran = self.free_one()  # not run: tried again in a second
            self.next_free = time.monotonic() + (self._free_delay() if ran else 1.0)
        if self.until_violation and time.monotonic() >= self.next_check:
            self.next_check = time.monotonic() + 2
            self._check_holds(self._spans(), final=False)
            return bool(self.report.violations)
        return False

    def _free_delay(self) -> float:
        return self.rng.expovariate(1 / self.free_every) if self.free_every else math.inf

    def stop_approved(self) -> None:
        """An event of a VM just approved early: its daemon stopped (SIGTERM, as for the
        reboot) for part of the runs (always the first), 1.5-3x `ttl`, or past `hold_max`;
        back on a new boot."""
        approvals = _first_approvals(self.sim)
        for vm, event_id in self.current.items():
            e = self.events[event_id]
            at = approvals.get(event_id)
            if at is None or at >= e.not_before or event_id in self.decided:
                continue
            self.decided.add(event_id)
            chosen = not self.stops or self.rng.random() < self.away_share
            if self.daemons.get(vm) is None or not chosen or not self.away_share:
                continue
            never = self.rng.random() < self.never_share
            away = self.hold_max + self.rng.uniform(3, 8) if never else self.rng.uniform(*BACK_IN)
            up = [p for p in self.cluster.procs if p is not None and p.poll() is None]
            stop = Stop(vm, event_id, time.time(), away, quorum=len(up) >= 2)
            self.kill(vm, signal.SIGTERM)
            self.away[vm] = stop
            self.stops.append(stop)
            self.report.stops += 1
            self.report.never_back += never
            self.pending.append((time.monotonic() + away, "back", vm))
            self.note(f"{vm}'s daemon stopped for its maintenance of {event_id[:8]}: {away:.0f} s")

    def undo(self, what: str, who: Any) -> None:
        if what != "back":
            super().undo(what, who)
            return
        stop = self.away.pop(who)
        self.boots[who].write_text(str(uuid.uuid4()) + "\n")  # back on a new boot
        self.start(who)
        stop.back = time.time()
        self.note(f"{who} back on a new boot, {stop.back - stop.at:.1f} s after its stop")

    def free_one(self) -> bool:
        """`fleet free VM` for a VM holding a slot, most often one away for its maintenance
        (the operator's lever: the next VM goes), now and then one holding none (it must say
        so and exit 2); its instant, status and what it says are recorded. False when it did
        not run (etcd without a quorum, or nothing held: tried again in a moment)."""
        try:
            held = {json.loads(kv.value or b"{}").get("vm") for kv in self._slots()}
        except (EtcdError, ValueError):
            return False  # no quorum: an operator would see it and wait
        down = sorted(held & set(self.away))
        if down and self.rng.random() < 0.7:
            vm = self.rng.choice(down)
        elif held and self.rng.random() < 0.85:
            vm = self.rng.choice(sorted(held))
        elif self.rng.random() < 0.15:
            vm = self.rng.choice(sorted(set(self.vms) - held) or self.vms)
        else:
            return False
        at = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "scheduledeventsd", "fleet", "free", vm,
             "--config", str(self.operator)],
            capture_output=True, text=True, timeout=60, check=False,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(self.root)}, cwd=self.root,
        )  # fmt: skip
        said = (done.stdout + done.stderr).strip()
        events = tuple(re.findall(r"event_id=(\S+)", done.stdout))
        self.frees.append(Free(vm, at, done.returncode, said, events))
        kind = {0: "freed", 2: "nothing freed"}.get(done.returncode, f"exit {done.returncode}")
        self.report.frees[kind] += 1
        self.note(f"operator: fleet free {vm} -> {done.returncode}: {' '.join(said.split())}")
        if done.returncode not in (0, 2) or (done.returncode == 0 and not events):
            self.report.violations.append(f"fleet free {vm} exited {done.returncode}: {said}")
        nothing = "holds no slot" in said or "etcd" in said
        if done.returncode == 2 and vm not in held and not nothing:
            self.report.violations.append(f"fleet free {vm} (holding none) said: {said}")
        return True

    def _slots(self) -> list[Any]:
        client = EtcdClient(self.etcd)
        try:
            return client.range(SLOTS)[1]
        finally:
            client.close()

    def at_rest(self) -> None:
        """Liveness: every daemon up and every event over, every slot is given back."""
        if self.cut_short:
            return
        deadline = time.monotonic() + 20
        left: list[Any] = []
        while time.monotonic() < deadline:
            try:
                left = self._slots()
            except EtcdError:
                left = [None]
            if not left:
                return
            time.sleep(0.5)
        what = [f"{kv.key}={kv.value!r}" if kv else "etcd unreadable" for kv in left]
        self.report.violations.append(f"slots still held at rest: {what}")

    # ---- the invariant --------------------------------------------------------------------

    def _spans(self) -> list[tuple[float, float, GroupEvent]]:
        """Per event approved early: the last start of its before-hooks before the approval,
        and the approval (the group's check makes sure they succeeded before it)."""
        approvals = _first_approvals(self.sim)
        starts: dict[tuple[str, str], list[float]] = {}
        for f in _hook_log(self.log):
            if f[0] == "start" and f[2] == "before":
                starts.setdefault((f[1], f[3]), []).append(float(f[4]))
        spans = []
        for e in list(self.events.values()):
            at = approvals.get(e.event_id)
            before = [t for t in starts.get((e.event_id, e.vm), []) if at and t <= at]
            if at is not None and at < e.not_before and before:
                spans.append((max(before), at, e))
        return spans

    def _check_overlap(self, spans: list[tuple[float, float, GroupEvent]]) -> None:
        """Called by the group's check with its spans: the whole maintenance is checked."""
        self._check_holds(spans, final=True)

    def _check_holds(self, spans: list[tuple[float, float, GroupEvent]], *, final: bool) -> None:
        fields = _hook_log(self.log)
        after_ok: dict[tuple[str, str], list[float]] = {}
        held: dict[tuple[str, str], list[tuple[float, str]]] = {}
        for f in fields:
            if f[0] == "end" and f[2] == "after" and f[5] == "0":
                after_ok.setdefault((f[1], f[3]), []).append(float(f[4]))
            elif f[0] == "held":
                held.setdefault((f[1], f[3]), []).append((float(f[4]), f[5]))
        now = time.time()
        holds = []
        for start, approved, e in spans:
            ok = [t for t in after_ok.get((e.event_id, e.vm), []) if t >= approved]
            end, why = (min(ok), "after-hooks succeeded") if ok else (math.inf, "")
            for at, reason in self._cuts(e, start, approved, end):
                if at < end:
                    end, why = at, reason
            if end == math.inf:
                if final and not self.cut_short:
                    self.report.violations.append(
                        f"{e.vm}'s {e.event_id[:8]} approved early and never released"
                    )
                end, why = now, "still held"
            holds.append(Hold(e, start, approved, end, why))
            if final:
                self._check_held(e, start, held.get((e.event_id, e.vm), []))
        if final:
            self.report.holds = len(holds)
            self.report.ended = Counter(h.why for h in holds)
        self._check_groups(holds)

    def _cuts(
        self, e: GroupEvent, start: float, approved: float, end: float
    ) -> list[tuple[float, str]]:
        """What releases `e.vm`'s slot before its after-hooks succeed, by design: when, why.
        From its approval on the slot is on the hold lease, so a partition, a kill -9 or a stop
        without etcd costs it nothing, unless the move had not been made yet (etcd unreachable
        from the approval on, or a fault in the instant after it): its daemon says when it was
        made (`slot_held_through`), and only before that may a fault lose it within ttl."""
        vm = e.vm
        moved = self._moved(vm, e.event_id, approved)
        cuts = [
            (f.at, "freed by the operator")
            for f in self.frees
            if f.vm == vm and f.status == 0 and start <= f.at < end
        ]
        for kind, began, healed in self.outages[vm]:
            at = max(began, approved)
            if healed >= approved and began < end and at < moved:
                cuts.append((at, f"{kind} after its approval, not on the hold lease yet (ttl)"))
        for stop in self.stops:
            if stop.vm != vm or not approved <= stop.at < end:
                continue
            if not stop.quorum and stop.at < moved:  # its move failed too: gone within ttl
                cuts.append((stop.at, "stopped while etcd had no quorum, not moved yet (ttl)"))
                continue
            renewed = self._renewed(vm, stop)
            if stop.back is None or stop.back + TAKE_BACK > renewed + self.hold_max:
                cuts.append((renewed + self.hold_max, "not back within hold_max"))
        return cuts

    def _moved(self, vm: str, event_id: str, approved: float) -> float:
        """When `vm`'s slot for `event_id` was first said on the hold lease after its approval
        (inf: never)."""
        live = [(v, r) for v, d in self.daemons.items() if d is not None for r in d.names(HELD)]
        said = [
            _wall(r.get("timestamp"))
            for v, r in [*self.records, *live]
            if v == vm and r.get("event") == HELD and r.get("event_id") == event_id
        ]
        return min((t for t in said if t >= approved - 1), default=math.inf)

    def _renewed(self, vm: str, stop: Stop) -> float:
        """When the hold lease was last renewed before the stop, at the latest: at the stop,
        unless etcd could not be reached then (a partition of the VM, or no quorum: its member
        kills last at most MEMBER_DOWN s), then a third of ttl before the reach was lost."""
        cut = [b for _, b, h in self.outages[vm] if b <= stop.at <= h]
        if cut:
            return min(cut) - GROUP_TTL / 3
        return stop.at if stop.quorum else stop.at - MEMBER_DOWN - GROUP_TTL / 3

    def _check_held(self, e: GroupEvent, start: float, reads: list[tuple[float, str]]) -> None:
        """The drain that led to an early approval started with a slot in each of its groups
        (read from etcd by the drain itself), unless an operator freed one before the read."""
        later = [r for r in reads if r[0] >= start]
        if not later:
            self.report.held_read["no read"] += 1
            return
        at, groups = min(later)
        if groups == "?":
            self.report.held_read["etcd did not answer"] += 1
            return
        missing = set(self.places[e.vm]) - set(groups.split(","))
        freed = any(f.vm == e.vm and f.status == 0 and start - 1 <= f.at <= at for f in self.frees)
        self.report.held_read["missing, freed" if missing and freed else "every group held"] += 1
        if missing and not freed:
            self.report.violations.append(
                f"{e.vm}'s drain of {e.event_id[:8]} started at {_clock(start)} holding no slot "
                f"in {sorted(missing)} (etcd read at {_clock(at)}: {groups})"
            )

    def _check_groups(self, holds: list[Hold]) -> None:
        """Per group, at every instant a hold starts, no more than its max at once."""
        said = self.report.violations
        for group, most in self.maxes.items():
            mine = [h for h in holds if group in self.places[h.event.vm]]
            for h in mine:
                inside = [o for o in mine if o.start <= h.start < o.end]
                self.report.most_in[group] = max(self.report.most_in.get(group, 0), len(inside))
                if len(inside) <= most:
                    continue
                text = f"{group} over its max {most} at {_clock(h.start)}"
                if any(v.startswith(text) for v in said):  # seen by a check while it ran
                    continue
                both = "; ".join(
                    f"{o.event.vm} ({o.event.event_id[:8]}) from {_clock(o.start)}, approved "
                    f"{_clock(o.approved)}, until {_clock(o.end)} ({o.why})"
                    for o in inside
                )
                self.report.violations.append(f"{text}: {len(inside)} VMs: {both}")
                self._hold_history(inside, h.start)

    def _hold_history(self, inside: list[Hold], at: float) -> None:
        """The faults, stops, frees and slot records of the VMs over a max, up to then."""
        vms = {h.event.vm for h in inside}
        lo = min(h.start for h in inside) - 10
        lines = [(t, f"campaign: {what}") for t, what in self.faults]
        for h in inside:
            lines.append((h.start, f"{h.event.vm}: drain of {h.event.event_id[:8]} started"))
            lines.append((h.approved, f"{h.event.vm}: {h.event.event_id[:8]} approved early"))
        for vm, rec in self.records:
            name = str(rec.get("event", ""))
            if vm in vms and (name.startswith("slot_") or name == "event_approved"):
                lines.append((_wall(rec.get("timestamp")), f"{vm}: {name} {rec.get('reason', '')}"))
        self.report.history.append(f"-- {' and '.join(sorted(vms))} at {_clock(at)}:")
        self.report.history += [f"{_clock(t)} {s}" for t, s in sorted(lines) if lo <= t <= at + 1]
