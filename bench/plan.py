"""`scheduledeventsd plan` at scale (issue 30): a maintenance wave over 100, 1 000 and 10 000 VMs
in groups of 100 (`max: 5` each), weekend windows, 7 days' notice, 10-minute drains, 5 minutes
down; each size in a process of its own, so its peak memory is its own. Prints the wall time,
the engine steps taken, steps per second, the peak RSS, and how each grows against the size.

    python -m bench.plan               # 100, 1 000 and 10 000 VMs
    python -m bench.plan --sizes 100 1000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    groups = max(1, vms // GROUP)
    entries, maintenance = [], []
    for g in range(groups):
        (directory / f"g{g}.yaml").write_text(CONFIG.format(group=f"g{g}"))
        names = f"g{g}-vm-[1-{min(GROUP, vms)}]"
        entries.append(f"  - names: {names}\n    config: g{g}.yaml\n"
                       "    hooks: {drain: 10m, undrain: 1m}\n")  # fmt: skip
        maintenance.append(f"  - type: Reboot\n    vms: {names}\n    notice: 7d\n"
                           "    spread: 1h\n    impact: 5m\n")  # fmt: skip
    path = directory / "fleet.yaml"
    path.write_text("vms:\n" + "".join(entries) + "maintenance:\n" + "".join(maintenance))
    return path


def one(vms: int) -> dict[str, object]:
    """One size, in this process."""
    from scheduledeventsd.plan import fleet, report, run

    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        path = write_fleet(Path(tmp), vms)
        started = time.perf_counter()
        loaded = fleet.load(path, Path(tmp) / "absent.yaml")
        plan = run.Plan(loaded, START).run()
        data = report.build(plan)
        seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    summary = data["summary"]
    return {
        "vms": vms,
        "seconds": round(seconds, 2),
        "steps": plan.steps,
        "steps_per_s": round(plan.steps / seconds),
        "peak_mib": round(peak_kib / 1024),
        "exit": summary["exit"],  # type: ignore[index]
        "late": summary["problems"]["late"],  # type: ignore[index]
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plan")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one)))
        return
    rows = []
    print(f"{'VMs':>7} {'seconds':>8} {'steps':>10} {'steps/s':>9} {'peak MiB':>9} "
          f"{'s/VM vs first':>14}", flush=True)  # fmt: skip
    for size in args.sizes:
        out = subprocess.run(
            [sys.executable, "-m", "bench.plan", "--one", str(size)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        row = json.loads(out)
        rows.append(row)
        first = rows[0]
        per_vm = (row["seconds"] / row["vms"]) / max(first["seconds"] / first["vms"], 1e-9)
        print(f"{row['vms']:>7} {row['seconds']:>8} {row['steps']:>10} {row['steps_per_s']:>9} "
              f"{row['peak_mib']:>9} {per_vm:>13.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
