"""Benchmark: a fleet through etcd: shared-event approval, a slot chain, what it costs.

N daemons (vm-0 .. vm-N-1) poll one simulator serving a Reboot that names all of them; each runs
a hook of a random length. Measured per event: from the end of the last VM's hook, and (etcd)
from the last `ready` written to etcd, to the first approval POST the simulator receives. The
contenders: `approve: all` through a real 3-member etcd cluster (a watch), and through a gate
command that marks this VM ready in a shared directory and answers 0 once every VM named is
(75 until then, asked every second). Either way the last VM to get ready finds the others
ready at once, so both measure the daemon's own path: the write and read (etcd) or the
process start (gate), then the POST.

A slot chain (`concurrency: {group: g, max: 1}`, one Reboot per VM, a 1 s undrain as the
after-hook): from the previous VM's after-hooks' end to the next VM's before-hooks' start, the
hand-off of the slot. And what it costs: etcd requests and watch events per VM and event (the
members' /metrics, diffed around each event), CPU and RSS of the daemons at rest, with no event
and with every daemon watching one shared event that waits for a VM that never comes.

    python -m bench.fleet            # 3, 20 and 100 daemons, 10 events; a chain of 20: ~10 min
    python -m bench.fleet --quick    # 3 daemons, 3 events; a chain of 3 (CI)
    python -m bench.fleet --versus main  # and main's daemons through etcd, side by side
    python -m bench.fleet --reboot --versus main  # only a slot held through a reboot (root)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from bench import start_daemon
from bench.fleet_hold import reboot_hold
from bench.fleet_load import at_rest, cpu_seconds, etcd_counters, per_vm_event
from scheduledeventsd.config import Etcd
from scheduledeventsd.coordination.etcd import EtcdClient
from scheduledeventsd.simulators.azure import Approval, Simulator
from scheduledeventsd.simulators.scenario import Scenario
from tests.etcd_cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]
# A daemon forgets an event (and deletes its keys) a poll (1 s here) after it left the document.
FORGOTTEN_S = 2.0
RESULTS = ROOT / "bench" / "results"
GIT = shutil.which("git") or "/usr/bin/git"
TAR = shutil.which("tar") or "/usr/bin/tar"
HOOK = """#!/bin/sh
sleep "$(shuf -i 0-150 -n 1 | awk '{ print $1 / 100 }')"
date +%s.%N > "$OUT/$SCHEDULED_EVENT_ID.$SCHEDULED_EVENT_VM_NAME"
"""
GATE = """#!/bin/sh
touch "$OUT/$SCHEDULED_EVENT_ID.ready.$SCHEDULED_EVENT_VM_NAME"
for vm in $SCHEDULED_EVENT_RESOURCES; do
    [ -e "$OUT/$SCHEDULED_EVENT_ID.ready.$vm" ] || exit 75
done
exit 0
"""


def approvals(sim: Simulator) -> list[Approval]:
    """A copy taken under the simulator's lock: its server threads append while we read (100
    daemons' POSTs broke an iteration: deque mutated during iteration)."""
    with sim._lock:
        return list(sim.approvals)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Contender:
    def __init__(  # noqa: PLR0917 - the bench's own, one call site
        self,
        name: str,
        work: Path,
        sim: Simulator,
        count: int,
        coordination: Callable[[Contender], dict[str, Any]],
        root: Path = ROOT,
    ) -> None:
        self.name = name
        self.work = work
        self.sim = sim
        self.vms = [f"vm-{i}" for i in range(count)]
        self.out = work / "out"
        self.out.mkdir(parents=True)
        hook = self._script("hook", HOOK)
        self.procs: list[subprocess.Popen[bytes]] = []
        for vm in self.vms:
            config = work / f"{vm}.yaml"
            config.write_text(
                json.dumps(
                    {
                        "metadata": {"url": sim.url, "poll_interval": 1},
                        "vm_name": vm,
                        "state_dir": str(work / vm),
                        "approve": "all",
                        "coordination": coordination(self),
                        "hooks": {"prepare": [{"command": [hook]}]},
                        "events": {"Reboot": ["prepare"]},
                        "environment": {"OUT": str(self.out)},
                    }
                )
            )
            self.procs.append(start_daemon(config, work / f"{vm}.log", root))

    def _script(self, name: str, body: str) -> str:
        path = self.work / name
        path.write_text(body)
        path.chmod(0o755)
        return str(path)

    def gate(self) -> dict[str, Any]:
        return {"gate": {"command": [self._script("gate", GATE)], "interval": 1}}

    def round(
        self, timeout: float = 60, approved: Callable[[str], None] = lambda _: None
    ) -> dict[str, float]:
        """One shared event: seconds from the last hook end (and last ready) to the POST.
        `approved(EventId)` as soon as it is (its keys are deleted once it is over)."""
        event_id = self.sim.add_event("Reboot", list(self.vms), not_before_in=900)
        deadline = time.monotonic() + timeout
        while not [a for a in approvals(self.sim) if a.event_id == event_id]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {event_id} not approved in {timeout} s")
            time.sleep(0.01)
        posted = min(a.at for a in approvals(self.sim) if a.event_id == event_id)
        approved(event_id)
        ends = [float((self.out / f"{event_id}.{vm}").read_text()) for vm in self.vms]
        while event_id in self.sim.event_ids():
            time.sleep(0.05)
        return {"hook_end": posted - max(ends)}

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def tree_of(rev: str, tmp: Path) -> Path:
    """The tree of `rev` (its daemons run from it, as bench/versus.py does), unpacked with
    `git archive`: no worktree of the repository is made or left behind."""
    out = tmp / f"tree-{rev_parse(rev)[:12]}"
    out.mkdir()
    archive = subprocess.run(
        [GIT, "-C", str(ROOT), "archive", rev], capture_output=True, check=True, timeout=60
    ).stdout
    subprocess.run([TAR, "-x", "-C", str(out)], input=archive, check=True, timeout=60)
    return out


def rev_parse(rev: str) -> str:
    return subprocess.run(
        [GIT, "-C", str(ROOT), "rev-parse", rev],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout.strip()


def last_ready(cluster: Cluster, prefix: str, event_id: str) -> float:
    """When the last VM wrote its ready, from the keys themselves (read with the daemon's
    own etcd client)."""
    client = EtcdClient(Etcd(endpoints=tuple(cluster.endpoints), prefix=prefix))
    try:
        _, kvs = client.range(f"{prefix}/events/{event_id}/")
    finally:
        client.close()
    stamps = [json.loads(kv.value or b"{}")["at"] for kv in kvs]
    return max(
        dt.datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ")
        .replace(tzinfo=dt.timezone.utc)
        .timestamp()
        for at in stamps
    )


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(values), "p99": pct(values, 0.99), "max": max(values)}


def measure(
    name: str,
    count: int,
    rounds: int,
    root: Path,
    cluster: Cluster,
    *,
    rest: float,
    trees: dict[str, Path],
) -> dict[str, Any]:
    """`name`: etcd, gate, or etcd@REV (the daemons of the tree of REV, in `trees`)."""
    sim = Simulator(
        Scenario(vm_name="vm-0", start_after_approval=0.2, started_for=0.3), rate_limit=False
    )
    sim.start()
    prefix = f"/bench-{name.replace('@', '-')}-{count}"
    work = root / f"{name.replace('@', '-')}-{count}"
    work.mkdir()
    etcd = {"etcd": {"endpoints": cluster.endpoints, "prefix": prefix}}
    began = time.monotonic()
    via_etcd = name.startswith("etcd")
    contender = Contender(
        name,
        work,
        sim,
        count,
        (lambda c: etcd) if via_etcd else Contender.gate,
        trees.get(name.partition("@")[2], ROOT),
    )
    extra: dict[str, Any] = {}
    try:
        settle(sim, count)
        extra["started_s"] = round(time.monotonic() - began, 1)
        hook_end: list[float] = []
        ready: list[float] = []
        load_before: Counter[str] = Counter()
        load_after: Counter[str] = Counter()
        cpu_before = sum(cpu_seconds(p.pid) for p in contender.procs)
        marks: dict[str, float] = {}  # when the last VM wrote ready, read at the approval
        for _ in range(rounds):
            event_id_before = set(sim.event_ids())
            if via_etcd:
                load_before += etcd_counters(cluster)
            result = contender.round(
                approved=lambda e: (
                    marks.update({e: last_ready(cluster, prefix, e)}) if via_etcd else None
                )
            )
            hook_end.append(result["hook_end"])
            if via_etcd:
                time.sleep(FORGOTTEN_S)  # its keys' deletion counted with it, not the next
                load_after += etcd_counters(cluster)
                load_after["grpc.Range"] -= 1  # last_ready's read: the bench's, not a daemon's
                event_id = next(
                    a.event_id
                    for a in reversed(approvals(sim))
                    if a.event_id not in event_id_before
                )
                posted = min(a.at for a in approvals(sim) if a.event_id == event_id)
                ready.append(posted - marks[event_id])
        cpu = sum(cpu_seconds(p.pid) for p in contender.procs) - cpu_before
        extra["daemon_cpu_ms_per_vm_event"] = round(1000 * cpu / (count * rounds), 1)
        if via_etcd:
            extra["etcd_per_vm_event"] = per_vm_event(load_before, load_after, count * rounds)
            if rest and name == "etcd":
                extra["rest"] = resting(contender, cluster, prefix, rest)
    finally:
        contender.stop()
        sim.stop()
    result: dict[str, Any] = {
        "daemons": count,
        "events": rounds,
        "hook_end_to_post_s": summary(hook_end),
    }
    if ready:
        result["last_ready_to_post_s"] = summary(ready)
    result.update(extra)
    return result


def settle(sim: Simulator, count: int) -> None:
    """Until every daemon has polled a few times (start-up of 100 takes ~15 s on 2 cores)."""
    gets = sim.gets()
    time.sleep(2)
    deadline = time.monotonic() + 60 + count
    while sim.gets() - gets < 3 * count and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)


def resting(contender: Contender, cluster: Cluster, prefix: str, seconds: float) -> dict[str, Any]:
    """CPU and RSS at rest: with no event, then with every daemon watching one shared event
    that names a VM no daemon runs (so none is approved), and what etcd serves meanwhile."""
    quiet = at_rest(contender.procs, seconds)
    vms = contender.vms
    event_id = contender.sim.add_event("Reboot", [*vms, "vm-absent"], not_before_in=3600)
    client = EtcdClient(Etcd(endpoints=tuple(cluster.endpoints), prefix=prefix))
    try:
        deadline = time.monotonic() + 60
        while len(client.range(f"{prefix}/events/{event_id}/")[1]) < len(vms):
            if time.monotonic() > deadline:
                raise RuntimeError("not every daemon wrote its ready")
            time.sleep(0.2)
    finally:
        client.close()
    time.sleep(2)
    before = etcd_counters(cluster)
    watching = at_rest(contender.procs, seconds)
    after = etcd_counters(cluster)
    watching["watchers"] = after["watcher_total"]
    watching["etcd_requests_per_vm_minute"] = round(
        sum(after[k] - before[k] for k in after if k.startswith("grpc."))
        / len(vms)
        / (watching["seconds"] / 60),
        2,
    )
    contender.sim.remove_event(event_id)
    return {"no_event": quiet, "watching": watching}


CHAIN_DRAIN = """#!/bin/sh
date +%s.%N > "$OUT/drain.$SCHEDULED_EVENT_VM_NAME"
"""
CHAIN_UNDRAIN = """#!/bin/sh
sleep 1
date +%s.%N > "$OUT/undrain.$SCHEDULED_EVENT_VM_NAME"
"""


def chain(count: int, root: Path, cluster: Cluster) -> dict[str, Any]:
    """`max: 1` over `count` VMs, one Reboot each with an hour's notice: the seconds from one
    VM's after-hooks' end (a 1 s undrain) to the next VM's before-hooks' start."""
    sim = Simulator(
        Scenario(vm_name="vm-0", start_after_approval=0.2, started_for=0.3), rate_limit=False
    )
    sim.start()
    work = root / f"chain-{count}"
    out = work / "out"
    out.mkdir(parents=True)
    scripts = {}
    for name, body in (("drain", CHAIN_DRAIN), ("undrain", CHAIN_UNDRAIN)):
        path = work / name
        path.write_text(body)
        path.chmod(0o755)
        scripts[name] = str(path)
    vms = [f"vm-{i}" for i in range(count)]
    procs = []
    for vm in vms:
        config = work / f"{vm}.yaml"
        config.write_text(
            json.dumps(
                {
                    "metadata": {"url": sim.url, "poll_interval": 1},
                    "vm_name": vm,
                    "state_dir": str(work / vm),
                    "approve": "always",
                    "coordination": {
                        "etcd": {"endpoints": cluster.endpoints, "prefix": f"/chain-{count}"}
                    },
                    "concurrency": {"group": "g", "max": 1},
                    "hooks": {
                        "drain": [{"command": [scripts["drain"]]}],
                        "undrain": [{"command": [scripts["undrain"]]}],
                    },
                    "events": {"Reboot": {"before": ["drain"], "after": ["undrain"]}},
                    "environment": {"OUT": str(out)},
                }
            )
        )
        procs.append(start_daemon(config, work / f"{vm}.log"))
    try:
        settle(sim, count)
        before = etcd_counters(cluster)
        began = time.monotonic()
        for vm in vms:
            sim.add_event("Reboot", [vm], not_before_in=3600)
        deadline = time.monotonic() + 30 + 10 * count
        while len(list(out.glob("undrain.*"))) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"chain of {count}: not every VM's undrain ran")
            time.sleep(0.1)
        took = time.monotonic() - began
        time.sleep(2)  # the last slot's release and its hold lease's revoke
        # What a slot held through a maintenance costs, measured (the daemons' keep-alives
        # over the whole chain included: LeaseKeepAlive, said apart).
        cost = per_vm_event(before, etcd_counters(cluster), count)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        sim.stop()
    spans = sorted(
        (float((out / f"drain.{vm}").read_text()), float((out / f"undrain.{vm}").read_text()))
        for vm in vms
    )
    handoffs = [nxt[0] - prev[1] for prev, nxt in zip(spans, spans[1:])]
    return {
        "vms": count,
        "handoffs": len(handoffs),
        "after_end_to_next_before_s": summary(handoffs),
        "overlapping": sum(1 for h in handoffs if h < 0),
        "whole_chain_s": round(took, 1),
        "etcd_per_vm_event": cost,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", type=lambda t: [int(n) for n in t.split(",")])
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--rest", type=float, help="seconds of each at-rest sample")
    parser.add_argument("--chain", type=int, help="VMs in the slot chain (0: none)")
    parser.add_argument("--disk", action="store_true", help="daemons' state on disk, not tmpfs")
    parser.add_argument(
        "--etcd-tmpfs", action="store_true", help="etcd's data on tmpfs too (no WAL fsync wait)"
    )
    parser.add_argument("--etcd-only", action="store_true", help="no gate contender (profiling)")
    parser.add_argument(
        "--reboot",
        action="store_true",
        help="only etcd's requests for a slot held through a reboot",
    )
    parser.add_argument(
        "--versus", metavar="REV", help="also the daemons of REV through etcd, side by side"
    )
    args = parser.parse_args()
    sizes = args.sizes or ([3] if args.quick else [3, 20, 100])
    rounds = args.rounds or (3 if args.quick else 10)
    rest = args.rest if args.rest is not None else (0 if args.quick else 30)
    chained = args.chain if args.chain is not None else (3 if args.quick else 20)
    random.seed(1)
    results: dict[str, Any] = {}
    load = [os.getloadavg()]  # the machine is shared: say how busy it was
    began = time.monotonic()
    # The daemons' state directories on a tmpfs unless --disk: on one box, 100 daemons' fsyncs
    # (state on each step that changes it) queue on one disk, which no fleet of VMs shares.
    shm = None if args.disk or not Path("/dev/shm").is_dir() else "/dev/shm"  # noqa: S108
    with (
        tempfile.TemporaryDirectory(prefix="sed-fleet-bench-") as tmp,
        tempfile.TemporaryDirectory(prefix="sed-fleet-bench-", dir=shm) as state,
    ):
        root = Path(state)
        trees = {args.versus: tree_of(args.versus, Path(tmp))} if args.versus else {}
        if args.reboot:
            return rebooting(root, root if args.etcd_tmpfs else Path(tmp), trees)
        names = ["etcd", *(f"etcd@{rev}" for rev in trees), *([] if args.etcd_only else ["gate"])]
        with Cluster((root if args.etcd_tmpfs else Path(tmp)) / "etcd") as cluster:
            for count in sizes:
                for name in names:
                    results[f"{name}-{count}"] = measure(
                        name,
                        count,
                        rounds,
                        root,
                        cluster,
                        rest=rest if count == max(sizes) else 0,
                        trees=trees,
                    )
            if chained:
                results[f"chain-{chained}"] = chain(chained, root, cluster)
    results["wall_s"] = round(time.monotonic() - began, 1)
    load.append(os.getloadavg())
    results["load"] = [[round(x, 2) for x in sample] for sample in load]
    results["state_on"] = "disk" if shm is None else "tmpfs"
    results["etcd_on"] = "tmpfs" if args.etcd_tmpfs and shm else "disk"
    if args.versus:
        results["versus"] = {args.versus: rev_parse(args.versus), "this": rev_parse("HEAD")}
    print(report(results, sizes, names))
    print(f"\nwrote {written(results, 'quick' if args.quick else 'full').relative_to(ROOT)}")
    return 0


def rebooting(root: Path, etcd: Path, trees: dict[str, Path]) -> int:
    """`--reboot`: bench/fleet_hold.py for this tree (and REV's), one etcd cluster, in turn."""
    results: dict[str, Any] = {}
    with Cluster(etcd / "etcd") as cluster:
        for name, tree in [("this", ROOT), *trees.items()]:
            results[name] = reboot_hold(f"reboot-{len(results)}", root / name, cluster, tree)
            print(f"{name}: slot held through a reboot, per VM: {json.dumps(results[name])}")
    print(f"wrote {written(results, 'reboot').relative_to(ROOT)}")
    return 0


def written(results: dict[str, Any], run: str) -> Path:
    """`results` written to bench/results/fleet-RUN-STAMP.json (a run's own file): its path."""
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = RESULTS / f"fleet-{run}-{stamp}.json"
    out.write_text(json.dumps(results, indent=2))
    return out


def report(results: dict[str, Any], sizes: list[int], names: list[str]) -> str:
    ms = lambda d: {k: v * 1000 for k, v in d.items()}  # noqa: E731
    lines = [
        "contender      daemons events  hook end -> POST p50/p99/max (ms)"
        "  last ready -> POST p50/p99",
    ]
    for count in sizes:
        for name in names:
            if f"{name}-{count}" not in results:
                continue
            r = results[f"{name}-{count}"]
            h = ms(r["hook_end_to_post_s"])
            row = (
                f"{name:<14} {count:>7} {r['events']:>6}  "
                f"{h['p50']:10.1f} / {h['p99']:5.1f} / {h['max']:5.1f}"
                f"  (daemon CPU {r['daemon_cpu_ms_per_vm_event']} ms per VM and event)"
            )
            if "last_ready_to_post_s" in r:
                lr = ms(r["last_ready_to_post_s"])
                row += f"        {lr['p50']:6.1f} / {lr['p99']:5.1f}"
            lines.append(row)
    base = results[f"etcd-{sizes[0]}"]["last_ready_to_post_s"]["p99"]
    for count in sizes:
        e, g = results[f"etcd-{count}"], results.get(f"gate-{count}", results[f"etcd-{count}"])
        ratio = e["hook_end_to_post_s"]["p50"] / max(g["hook_end_to_post_s"]["p50"], 1e-6)
        growth = e["last_ready_to_post_s"]["p99"] / max(base, 1e-6)
        lines.append(
            f"{count} daemons: etcd / gate (p50, hook end -> POST) = {ratio:.2f}; last ready ->"
            f" POST p99 = {growth:.1f}x {sizes[0]} daemons' for {count / sizes[0]:.1f}x the"
            f" daemons; etcd per VM and event: {e['etcd_per_vm_event']}"
        )
        for name in names:
            other = results.get(f"{name}-{count}") if "@" in name else None
            if other is not None:
                lo = ms(other["last_ready_to_post_s"])
                ratio_p99 = e["last_ready_to_post_s"]["p99"] / max(lo["p99"] / 1000, 1e-6)
                lines.append(
                    f"{count} daemons: {name} last ready -> POST p50/p99 {lo['p50']:.1f} /"
                    f" {lo['p99']:.1f} ms, this tree / it (p99) ="
                    f" {ratio_p99:.3f};"
                    f" its etcd per VM and event: {other['etcd_per_vm_event']}"
                )
        if "rest" in e:
            lines.append(f"{count} daemons at rest: {json.dumps(e['rest'])}")
    for key, r in results.items():
        if key.startswith("chain-"):
            h = ms(r["after_end_to_next_before_s"])
            lines.append(
                f"slot chain of {r['vms']} (max 1, 1 s undrain): after-hooks end -> next"
                f" before-hooks p50/p99/max {h['p50']:.0f} / {h['p99']:.0f} / {h['max']:.0f} ms,"
                f" {r['overlapping']} overlapping, whole chain {r['whole_chain_s']} s;"
                f" etcd per VM and event: {r.get('etcd_per_vm_event')}"
            )
    lines.append(f"wall: {results['wall_s']} s; load average before / after: {results['load']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
