"""This tree against another commit, side by side in one run: the engine's step (at rest and under
churn) and the daemon's CPU at rest at 1 Hz and 4 Hz, each pair measured in the same sitting so
the machine's load falls on both. Prints both figures and their ratio (this tree / the other).

    python -m bench.versus REV [--rest SECONDS] [--rounds N]
    make bench-versus REV=7d756ca^   # issue 27: against the commit before the layout and gates

The other commit is checked out in a temporary `git worktree` and run with its own code
(PYTHONPATH), against its own simulator from this tree. CPU is the process's own user + system
time over the rest period, to the nanosecond (each thread's /proc schedstat; /proc/PID/stat's 10 ms
ticks turned a 0.015 % difference into a 1.5x ratio), not the wall clock: a busy machine slows
both equally but does not bill either for the other's work.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from bench import ROOT, cpu_percent, start_daemon, stop_daemon
from scheduledeventsd.simulators.azure import Simulator
from scheduledeventsd.simulators.scenario import Scenario

GIT = shutil.which("git") or "/usr/bin/git"
VM = "bench-vm"


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A detached checkout of `rev`, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="scheduledeventsd-versus-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(
            [GIT, "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), rev],
            check=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                [GIT, "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
            )


def step_us(tree: Path) -> tuple[float, float]:
    """bench.step of `tree`, run with `tree`'s own code: (at rest, churn) in microseconds."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.step"],
        cwd=tree,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rest, churn = (float(x) for x in re.findall(r"([\d.]+) us per step", out))
    return rest, churn


def start(tree: Path, url: str, interval: float, workdir: Path) -> subprocess.Popen[bytes]:
    """The daemon of `tree` polling `url` every `interval` s, with one hook and no event of ours."""
    workdir.mkdir(parents=True)
    config = workdir / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "metadata": {"url": url, "poll_interval": interval},
                "vm_name": VM,
                "state_dir": str(workdir / "state"),
                "hooks": {"drain": [{"command": ["/bin/true"]}]},
                "events": {"Reboot": ["drain"]},
            }
        )
    )
    return start_daemon(config, workdir / "stderr.log", tree)


def rest_cpu(trees: dict[str, Path], interval: float, rest: float, tmp: Path) -> dict[str, float]:
    """Percent of one core each tree's daemon uses at rest, all running at the same time."""
    sims = {name: Simulator(Scenario(vm_name=VM)) for name in trees}
    procs = {}
    try:
        for name, sim in sims.items():
            sim.start()
            procs[name] = start(trees[name], sim.url, interval, tmp / f"{name}-{interval}")
        time.sleep(3)  # past the first poll and start-up's imports
        cpu = cpu_percent([p.pid for p in procs.values()], rest)
        return dict(zip(procs, cpu))
    finally:
        for p in procs.values():
            stop_daemon(p, 15)
        for sim in sims.values():
            sim.stop()


def ratio(now: float, then: float) -> str:
    return f"{now / then:.2f}x" if then else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the commit to compare with (e.g. 7d756ca^)")
    parser.add_argument("--rest", type=float, default=60.0, help="seconds at rest per rate")
    parser.add_argument("--rounds", type=int, default=3, help="bench.step runs per tree")
    args = parser.parse_args()
    with worktree(args.rev) as other, tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": ROOT, args.rev: other}
        steps: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for _ in range(args.rounds):  # alternate, so a burst of load falls on both
            for name, tree in trees.items():
                steps[name].append(step_us(tree))
        cpu = {hz: rest_cpu(trees, 1 / hz, args.rest, Path(tmp)) for hz in (1, 4)}
    rows = [
        ("bench.step at rest (us)", {n: min(s[0] for s in steps[n]) for n in trees}),
        ("bench.step churn (us)", {n: min(s[1] for s in steps[n]) for n in trees}),
        ("CPU at rest, 1 Hz (% of a core)", cpu[1]),
        ("CPU at rest, 4 Hz (% of a core)", cpu[4]),
    ]
    names = list(trees)
    print(f"{'':34}{names[0]:>14}{names[1]:>14}{'ratio':>9}")
    for label, values in rows:
        now, then = values[names[0]], values[names[1]]
        print(f"{label:34}{now:14.2f}{then:14.2f}{ratio(now, then):>9}")
    spread = {n: statistics.pstdev(s[0] for s in steps[n]) for n in trees}
    print(f"\nstep spread over {args.rounds} rounds (us, at rest): {spread}")
    print(f"CPU over {args.rest:.0f} s at rest per rate, in ns from /proc/PID/task/*/schedstat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
