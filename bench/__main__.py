"""Benchmark: scheduledeventsd against the documented polling sample, side by side, in one run.

Each contender gets its own simulator process and runs as a real process with a real hook; both
run at the same time through the same phases (rest, detection, churn), then startup is timed.
Prints a table with ratios and writes JSON and a PNG plot to bench/results/.

    python -m bench            # about 10 minutes
    python -m bench --quick    # about 1 minute (CI runs this so the bench cannot rot)
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench import daemon_command

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
VM = "bench-vm_0"
TICK = os.sysconf("SC_CLK_TCK")
# Terminate stands for a slow preparation (a drain): it takes SLOW_HOOK_S.
SLOW_HOOK_S = 5
HOOK = f"""#!/bin/bash
echo "start $SCHEDULED_EVENT_ID $EPOCHREALTIME" >> "$BENCH_LOG"
# The event's JSON arrives on stdin from both contenders.
if grep -q '"Terminate"'; then sleep {SLOW_HOOK_S}; fi
echo "end $SCHEDULED_EVENT_ID $EPOCHREALTIME" >> "$BENCH_LOG"
"""


@dataclass(frozen=True)
class Plan:
    rest_s: float
    detection_events: int
    overlaps: int
    churn_s: float
    startups: int


FULL = Plan(rest_s=180, detection_events=200, overlaps=20, churn_s=120, startups=5)
QUICK = Plan(rest_s=8, detection_events=15, overlaps=2, churn_s=8, startups=2)


class Sim:
    """A simulator process and its control API."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scheduledeventsd",
                "simulate",
                "--listen",
                "127.0.0.1:0",
                "--vm-name",
                VM,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        self.url = line.split(" on ", 1)[1].strip()
        self.base = self.url.rsplit("/metadata", 1)[0] + "/_simulator"
        self.http = requests.Session()
        self.http.trust_env = False

    def add(self, resources: list[str], event_type: str = "Reboot") -> tuple[str, float]:
        body = {"EventType": event_type, "Resources": resources, "not_before_in": 900}
        reply = self.http.post(f"{self.base}/events", json=body, timeout=5).json()
        return reply["EventId"], reply["at"]

    def remove(self, event_id: str) -> None:
        self.http.delete(f"{self.base}/events/{event_id}", timeout=5)

    def requests(self) -> list[dict[str, Any]]:
        return list(self.http.get(f"{self.base}/requests", timeout=10).json())

    def approvals(self) -> list[dict[str, Any]]:
        return list(self.http.get(f"{self.base}/state", timeout=10).json()["approvals"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@dataclass
class Contender:
    name: str
    workdir: Path
    sim: Sim
    interval: float = 1.0  # seconds between polls (the baseline's is fixed at 1)
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (t, cpu_s, rss_kb)
    marks: dict[str, float] = field(default_factory=dict)
    detection: list[tuple[str, float]] = field(default_factory=list)  # (event id, appeared at)
    overlap: list[tuple[str, float]] = field(default_factory=list)  # appeared during a slow hook
    churn_ours: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def hook_log(self) -> Path:
        return self.workdir / "hooks.log"

    def command(self) -> list[str]:
        hook = self.workdir / "hook"
        if not hook.exists():
            hook.write_text(HOOK)
            hook.chmod(0o755)
        if self.name == "baseline":
            return [sys.executable, "-m", "bench.baseline", self.sim.url, VM, str(hook)]
        state = self.workdir / "state"
        shutil.rmtree(state, ignore_errors=True)
        config = self.workdir / "config.yaml"
        config.write_text(
            json.dumps(
                {
                    "metadata": {"url": self.sim.url, "poll_interval": self.interval},
                    "vm_name": VM,
                    "state_dir": str(state),
                    "approve": "always",
                    "hooks": {"bench": [{"command": [str(hook)]}]},
                    "events": {
                        t: ["bench"]
                        for t in ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
                    },
                    "environment": {"BENCH_LOG": str(self.hook_log)},
                }
            )
        )
        return daemon_command(config)

    def start(self) -> float:
        env = {"PATH": os.environ["PATH"], "BENCH_LOG": str(self.hook_log), "PYTHONPATH": str(ROOT)}
        started = time.time()
        self.proc = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "stderr.log").open("ab"),
        )
        return started

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def sample(self) -> None:
        assert self.proc is not None
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / TICK
        rss = next(
            int(line.split()[1])
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        self.samples.append((time.monotonic(), cpu, rss))


def sampler(contenders: list[Contender], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        for c in contenders:
            with contextlib.suppress(OSError, StopIteration, AssertionError):
                c.sample()


def run_phases(c: Contender, plan: Plan, seed: int) -> None:
    rng = random.Random(seed)
    c.marks["start"] = time.monotonic()
    time.sleep(3)  # past the first poll and the allocations of start-up
    c.sample()
    c.marks["rest_from"] = time.monotonic()
    time.sleep(plan.rest_s)
    c.sample()
    c.marks["rest_to"] = time.monotonic()
    types = ("Reboot", "Freeze", "Redeploy", "Preempt")
    for _ in range(plan.detection_events):
        time.sleep(rng.uniform(0.35, 1.65))  # uniform phase against a 1 s poll cycle
        c.detection.append(c.sim.add([VM], rng.choice(types)))
    time.sleep(4)
    for _ in range(plan.overlaps):
        c.sim.add([VM], "Terminate")  # its hook takes SLOW_HOOK_S
        time.sleep(rng.uniform(1.5, 2.5))
        c.overlap.append(c.sim.add([VM], "Preempt"))
        time.sleep(SLOW_HOOK_S + 2)
    c.sample()
    c.marks["churn_from"] = time.monotonic()
    foreign = [c.sim.add([f"other-vm_{i}", f"other-vm_{i + 1}"])[0] for i in range(47)]
    tick = time.monotonic()
    for second in range(int(plan.churn_s)):
        c.sim.remove(foreign.pop(0))
        foreign.append(c.sim.add([f"other-vm_{second}"])[0])
        if second % 5 == 0:
            c.churn_ours.append(c.sim.add([VM], "Freeze")[0])
        tick += 1.0
        time.sleep(max(0.0, tick - time.monotonic()))
    time.sleep(4)
    c.sample()
    c.marks["churn_to"] = time.monotonic()


def startup_times(c: Contender, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        seen = len(c.sim.requests())
        t0 = c.start()
        first = None
        for _ in range(200):
            time.sleep(0.05)
            gets = [
                r
                for r in c.sim.requests()[seen:]
                if r["method"] == "GET" and r["path"].endswith("scheduledevents")
            ]
            if gets:
                first = gets[0]["wall"]
                break
        c.stop()
        if first is not None:
            out.append(first - t0)
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def analyse(c: Contender, startups: list[float]) -> dict[str, Any]:
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    for line in c.hook_log.read_text().splitlines() if c.hook_log.exists() else []:
        kind, event_id, at = line.split()
        (starts if kind == "start" else ends).setdefault(event_id, []).append(float(at))
    approvals: dict[str, list[float]] = {}
    for a in c.sim.approvals():
        approvals.setdefault(a["EventId"], []).append(a["at"])
    detection = [starts[e][0] - at for e, at in c.detection if e in starts]
    overlap = [starts[e][0] - at for e, at in c.overlap if e in starts]
    approval = [
        approvals[e][0] - ends[e][0] for e, _ in c.detection if e in approvals and e in ends
    ]
    missed = [e for e, _ in c.detection + c.overlap if e not in starts] + [
        e for e in c.churn_ours if e not in starts
    ]
    twice = [e for e, s in starts.items() if len(s) > 1]

    requests_seen = c.sim.requests()
    get_walls = sorted(
        r["wall"]
        for r in requests_seen
        if r["method"] == "GET" and r["path"].endswith("scheduledevents")
    )
    # The part of detection that is ours, not the poll phase: the poll that first could see
    # the event (the first GET after it appeared) to the hook starting.
    reaction = []
    for e, at in c.detection:
        first = bisect.bisect_right(get_walls, at)
        if e in starts and first < len(get_walls):
            reaction.append(starts[e][0] - get_walls[first])
    gets = [
        r["at"]
        for r in requests_seen
        if r["method"] == "GET" and r["path"].endswith("scheduledevents")
    ]
    span = [t for t in gets if c.marks["start"] + 2 <= t <= c.marks["churn_to"]]
    intervals = [b - a for a, b in zip(span, span[1:])]
    errors = [abs(i - c.interval) for i in intervals]
    duration = span[-1] - span[0] if len(span) > 1 else 0.0

    def cost(frm: str, to: str) -> dict[str, float]:
        window = [s for s in c.samples if c.marks[frm] - 0.5 <= s[0] <= c.marks[to] + 0.5]
        if len(window) < 2:
            return {}
        (t0, cpu0, _), (t1, cpu1, _) = window[0], window[-1]
        rss = [s[2] for s in window]
        return {
            "cpu_s_per_hour": (cpu1 - cpu0) / (t1 - t0) * 3600,
            "cpu_percent_of_core": (cpu1 - cpu0) / (t1 - t0) * 100,
            "rss_mb": statistics.median(rss) / 1024,
            "rss_growth_mb": (rss[-1] - rss[0]) / 1024,
        }

    return {
        "detection_s": {
            "n": len(detection),
            "mean": statistics.mean(detection) if detection else math.nan,
            "p50": pct(detection, 50),
            "p95": pct(detection, 95),
            "p99": pct(detection, 99),
            "max": max(detection, default=float("nan")),
        },
        "reaction_s": {"p50": pct(reaction, 50), "p99": pct(reaction, 99)},
        "overlap_s": {
            "n": len(overlap),
            "p50": pct(overlap, 50),
            "max": max(overlap, default=math.nan),
        },
        "approval_s": {"n": len(approval), "p50": pct(approval, 50), "p99": pct(approval, 99)},
        "poll": {
            "polls": len(span),
            "duration_s": duration,
            "error_p50_s": pct(errors, 50),
            "error_p99_s": pct(errors, 99),
            "polls_per_hour": (len(span) - 1) / duration * 3600 if duration else float("nan"),
        },
        "rest": cost("rest_from", "rest_to"),
        "churn": cost("churn_from", "churn_to"),
        "startup_s": {
            "n": len(startups),
            "p50": pct(startups, 50),
            "max": max(startups, default=float("nan")),
        },
        "missed": len(missed),
        "handled_twice": len(twice),
        "churn_ours": len(c.churn_ours),
        "raw": {"detection": detection, "approval": approval, "intervals": intervals},
    }


ROWS = [
    ("detection mean (s)", ("detection_s", "mean")),
    ("detection p50 (s)", ("detection_s", "p50")),
    ("detection p95 (s)", ("detection_s", "p95")),
    ("detection p99 (s)", ("detection_s", "p99")),
    ("detection max (s)", ("detection_s", "max")),
    ("poll -> hook start p50 (ms)", ("reaction_s", "p50"), 1000),
    ("poll -> hook start p99 (ms)", ("reaction_s", "p99"), 1000),
    (f"during a {SLOW_HOOK_S} s hook p50 (s)", ("overlap_s", "p50")),
    (f"during a {SLOW_HOOK_S} s hook max (s)", ("overlap_s", "max")),
    ("approval p50 (ms)", ("approval_s", "p50"), 1000),
    ("approval p99 (ms)", ("approval_s", "p99"), 1000),
    ("poll error p50 (ms)", ("poll", "error_p50_s"), 1000),
    ("poll error p99 (ms)", ("poll", "error_p99_s"), 1000),
    ("polls per hour", ("poll", "polls_per_hour")),
    ("rest CPU (% of a core)", ("rest", "cpu_percent_of_core")),
    ("rest CPU (s/hour)", ("rest", "cpu_s_per_hour")),
    ("rest RSS (MB)", ("rest", "rss_mb")),
    ("rest RSS growth (MB)", ("rest", "rss_growth_mb")),
    ("churn CPU (% of a core)", ("churn", "cpu_percent_of_core")),
    ("churn RSS (MB)", ("churn", "rss_mb")),
    ("churn RSS growth (MB)", ("churn", "rss_growth_mb")),
    ("startup p50 (s)", ("startup_s", "p50")),
    ("missed events", ("missed",)),
    ("handled twice", ("handled_twice",)),
]


def lookup(result: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = result
    for key in path:
        value = value.get(key, float("nan")) if isinstance(value, dict) else float("nan")
    return float(value)


def _ratio(num: float, den: float) -> str:
    return f"{num / den:.2f}x" if den and math.isfinite(num) and math.isfinite(den) else "-"


def table(results: dict[str, dict[str, Any]]) -> str:
    """Side by side: the daemon at 1 Hz, at 4 Hz, the documented sample (1 Hz), and ratios."""
    lines = [
        f"{'metric':<30}{'daemon 1 Hz':>13}{'daemon 4 Hz':>13}{'baseline':>11}"
        f"{'baseline/1 Hz':>15}{'4 Hz/1 Hz':>11}"
    ]
    for row in ROWS:
        label, path = row[0], row[1]
        scale = row[2] if len(row) > 2 else 1
        one, four, base = (
            lookup(results[k], path) * scale for k in ("scheduledeventsd", FOUR_HZ, "baseline")
        )
        lines.append(
            f"{label:<30}{one:>13.3f}{four:>13.3f}{base:>11.3f}"
            f"{_ratio(base, one):>15}{_ratio(four, one):>11}"
        )
    return "\n".join(lines)


FOUR_HZ = "scheduledeventsd-4hz"
# Issue 17: at 4 Hz, detection p50 <= 0.15 s and p99 <= 0.3 s, and at rest "at most twice its
# 1 Hz CPU of today": today being the daemon before issue 17, whose full run on this machine
# kind measured 0.122 % of a core at 1 Hz (README, "1 Hz before"). The same run's 1 Hz is in the
# table beside it: it got cheaper by the same changes, so twice it is not the target.
ONE_HZ_BEFORE = 0.122
TARGETS_4HZ = [
    ("4 Hz: detection p50 <= 0.15 s", lambda r, one: lookup(r, ("detection_s", "p50")) <= 0.15),
    ("4 Hz: detection p99 <= 0.3 s", lambda r, one: lookup(r, ("detection_s", "p99")) <= 0.3),
    (
        f"4 Hz: rest CPU <= 2x the 1 Hz of before ({2 * ONE_HZ_BEFORE:.3f} %)",
        lambda r, one: lookup(r, ("rest", "cpu_percent_of_core")) <= 2 * ONE_HZ_BEFORE,
    ),
    (
        "4 Hz: nothing missed or handled twice",
        lambda r, one: r["missed"] == r["handled_twice"] == 0,
    ),
]

TARGETS = [
    ("detection p50 <= 0.55 s", lambda r: lookup(r, ("detection_s", "p50")) <= 0.55),
    ("detection p99 <= 1.05 s", lambda r: lookup(r, ("detection_s", "p99")) <= 1.05),
    ("approval p99 <= 20 ms", lambda r: lookup(r, ("approval_s", "p99")) <= 0.020),
    ("3600 +- 2 polls per hour", lambda r: abs(lookup(r, ("poll", "polls_per_hour")) - 3600) <= 2),
    ("rest CPU <= 0.2 % of a core", lambda r: lookup(r, ("rest", "cpu_percent_of_core")) <= 0.2),
    ("rest RSS <= 35 MB", lambda r: lookup(r, ("rest", "rss_mb")) <= 35),
    ("no RSS growth at rest (< 1 MB)", lambda r: lookup(r, ("rest", "rss_growth_mb")) < 1),
    ("nothing missed or handled twice", lambda r: r["missed"] == 0 and r["handled_twice"] == 0),
]


def plot(results: dict[str, dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, result in results.items():
        for ax, key, scale in ((axes[0], "detection", 1), (axes[1], "approval", 1000)):
            values = sorted(v * scale for v in result["raw"][key])
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    axes[0].set(
        title="detection: event appears -> first hook starts", xlabel="seconds", ylabel="CDF"
    )
    axes[1].set(
        title="approval: last hook exits -> POST arrives", xlabel="milliseconds", xscale="log"
    )
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one-minute smoke run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="scheduledeventsd-bench-") as tmp:
        contenders = []
        for name, interval in (("scheduledeventsd", 1.0), (FOUR_HZ, 0.25), ("baseline", 1.0)):
            workdir = Path(tmp) / name
            workdir.mkdir()
            contenders.append(Contender(name, workdir, Sim(), interval))
        began = time.time()
        for c in contenders:
            c.start()
        stop = threading.Event()
        threading.Thread(
            target=sampler, args=(contenders, stop, 5.0 if not args.quick else 1.0), daemon=True
        ).start()
        threads = [
            threading.Thread(target=run_phases, args=(c, plan, args.seed)) for c in contenders
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        for c in contenders:
            c.stop()
        results = {}
        for c in contenders:
            startups = startup_times(c, plan.startups)
            results[c.name] = analyse(c, startups)
            c.sim.stop()
    elapsed = time.time() - began
    report = table(results)
    ours = results["scheduledeventsd"]
    targets = [(label, check(ours)) for label, check in TARGETS]
    targets += [(label, check(results[FOUR_HZ], ours)) for label, check in TARGETS_4HZ]
    machine = f"{os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}"
    print(f"{'quick' if args.quick else 'full'} run, {elapsed:.0f} s, {machine}\n")
    print(report)
    print("\ntargets:")
    for label, met in targets:
        print(f"  {'met   ' if met else 'MISSED'} {label}")
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = RESULTS / f"{'quick' if args.quick else 'full'}-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "plan": plan.__dict__,
                "machine": machine,
                "elapsed_s": elapsed,
                "results": results,
                "targets": dict(targets),
                "table": report,
            },
            indent=1,
        )
    )
    png = out.with_suffix(".png")
    print(f"\nwrote {out}" + (f" and {png}" if plot(results, png) else " (no matplotlib: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
