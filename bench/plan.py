"""Benchmark: `scheduledeventsd plan` over fleets of 100, 1 000 and 10 000 VMs, side by side.

Each fleet is groups of 100 VMs (`concurrency: max 5` each), weekend windows (Saturday and
Sunday 02:00-05:00 Europe/Berlin), a Reboot per VM with 7 days' notice posted over an hour,
10-minute drains, 1-minute undrains, 5 minutes down. Each size runs in its own process, so its
peak RSS is its own. Measured: the wall and CPU time of the plan (reading the fleet and building
the report apart), engine steps per CPU second, peak RSS, and how each grows with the fleet
(the issue asks for no faster than linear: reported, never asserted).

    python -m bench.plan                     # 100, 1 000 and 10 000 VMs
    python -m bench.plan --quick             # 100 and 300 VMs (CI: so the bench cannot rot)
    python -m bench.plan --sizes 100 1000    # any sizes
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FULL = (100, 1_000, 10_000)
QUICK = (100, 300)
GROUP = 100
START = dt.datetime(2026, 11, 23, 9, tzinfo=dt.timezone.utc)  # a Monday

CONFIG = """\
hooks:
  drain: [{{command: [/usr/local/bin/drain], timeout: 1800}}]
  undrain: [{{command: [/usr/local/bin/undrain]}}]
events:
  Reboot: {{before: [drain], after: [undrain]}}
windows:
  - {{days: [sat, sun], start: "02:00", end: "05:00", timezone: Europe/Berlin}}
concurrency: {{group: {group}, max: 5}}
coordination: {{etcd: {{endpoints: ["http://127.0.0.1:2379"]}}}}
"""


def write_fleet(directory: Path, vms: int) -> Path:
    """FLEET.yaml and one config per group of 100: a Reboot for every VM of each group."""
    entries, maintenance = [], []
    for g in range(max(1, vms // GROUP)):
        (directory / f"g{g}.yaml").write_text(CONFIG.format(group=f"g{g}"))
        names = f"g{g}-vm-[1-{min(GROUP, vms)}]"
        entries.append(f"  - names: {names}\n    config: g{g}.yaml\n"
                       "    hooks: {drain: 10m, undrain: 1m}\n")  # fmt: skip
        maintenance.append(f"  - type: Reboot\n    vms: {names}\n    notice: 7d\n"
                           "    spread: 1h\n    impact: 5m\n")  # fmt: skip
    path = directory / "fleet.yaml"
    path.write_text("vms:\n" + "".join(entries) + "maintenance:\n" + "".join(maintenance))
    return path


def planner() -> Optional[tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]]:
    """The planner's public parts (fleet.load, run.Plan, report.build), or None while the
    planner is not in this tree."""
    try:
        fleet = importlib.import_module("scheduledeventsd.plan.fleet")
        run = importlib.import_module("scheduledeventsd.plan.run")
        report = importlib.import_module("scheduledeventsd.plan.report")
    except ImportError:
        return None
    parts = (
        getattr(fleet, "load", None),
        getattr(run, "Plan", None),
        getattr(report, "build", None),
    )
    if not all(callable(part) for part in parts):
        return None
    return fleet.load, run.Plan, report.build


def one(vms: int) -> dict[str, Any]:
    """One size, in this process: the fleet written and read, planned, then reported (the rows
    and summary `plan` prints), each timed."""
    parts = planner()
    assert parts is not None
    load, plan_class, build = parts
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        fleet_path = write_fleet(Path(tmp), vms)
        started = time.perf_counter()
        fleet = load(fleet_path, Path(tmp) / "absent.yaml")  # each set names its config
        read = time.perf_counter() - started
        started, cpu = time.perf_counter(), time.process_time()
        plan = plan_class(fleet, START).run()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        started = time.perf_counter()
        data = build(plan)
        reported = time.perf_counter() - started
    problems = data["summary"]["problems"]
    return {
        "vms": vms,
        "groups": vms // GROUP,
        "read_s": read,
        "wall_s": wall,
        "cpu_s": cpu,
        "report_s": reported,
        "steps": plan.steps,
        "events": len(plan.seen),
        "hooks_failed": problems.get("hooks_failed", 0),
        "no_slot": problems.get("no_slot", 0),
        "late": problems.get("late", 0),
        "exit": data["summary"]["exit"],
        "simulated_days": plan.until / 86400,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def table(runs: list[dict[str, Any]]) -> list[str]:
    """The sizes side by side; each growth is against the size before it (linear: ratio 1.0)."""
    lines = [
        f"{'VMs':>7} {'groups':>6} {'no slot':>7} {'read s':>7} {'plan s':>7} {'CPU s':>7} "
        f"{'report s':>8} {'steps':>9} {'steps/CPU s':>11} "
        f"{'RSS MB':>7} {'time/VM growth':>15} {'steps/VM growth':>16}"
    ]
    for k, run in enumerate(runs):
        rate = run["steps"] / run["cpu_s"] if run["cpu_s"] else 0.0
        growth = steps = "-"
        if k:
            before = runs[k - 1]
            scale = run["vms"] / before["vms"]
            growth = f"{run['cpu_s'] / before['cpu_s'] / scale:.2f}"
            steps = f"{run['steps'] / max(before['steps'], 1) / scale:.2f}"
        lines.append(
            f"{run['vms']:>7} {run['groups']:>6} {run['no_slot']:>7} {run['read_s']:>7.2f} "
            f"{run['wall_s']:>7.2f} {run['cpu_s']:>7.2f} {run['report_s']:>8.2f} "
            f"{run['steps']:>9} {rate:>11.0f} {run['peak_rss_mb']:>7.0f} "
            f"{growth:>15} {steps:>16}"
        )
    lines.append(
        "growth: (CPU s or steps per VM at this size) / (at the size before); 1.00 is linear."
        " Wall time counts what other processes took of the 2 cores; CPU time does not."
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 and 300 VMs only")
    parser.add_argument("--sizes", type=int, nargs="+", help="VMs of each run (groups of 100)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size
    args = parser.parse_args()
    if planner() is None:
        print("bench.plan: skipped, the planner (scheduledeventsd.plan.run) is not in this tree")
        return 0
    if args.one:
        print(json.dumps(one(args.one)))
        return 0
    runs = []
    for vms in args.sizes or (QUICK if args.quick else FULL):
        done = subprocess.run(
            [sys.executable, "-m", "bench.plan", "--one", str(vms)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            return 1
        runs.append(json.loads(done.stdout.splitlines()[-1]))
        # The wave measured is the one described: every drain within its timeout.
        assert runs[-1]["hooks_failed"] == 0, runs[-1]
        print(f"{vms} VMs: {runs[-1]['wall_s']:.2f} s", flush=True)
    print("\n".join(table(runs)))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"plan-{'quick' if args.quick else 'full'}.json"
    out.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
