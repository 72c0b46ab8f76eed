"""Benchmarks: `python -m bench` (against the documented sample), `python -m bench.fleet`
(shared events), `python -m bench.parse` (parse and engine step)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def daemon_command(config: Path) -> list[str]:
    """scheduledeventsd as the benchmarks run it: a real process, quiet but for warnings."""
    return [
        sys.executable,
        "-m",
        "scheduledeventsd",
        "run",
        "--config",
        str(config),
        "--log-target",
        "console",
        "--log-level",
        "warning",
    ]


def start_daemon(config: Path, log: Path, root: Path = ROOT) -> subprocess.Popen[bytes]:
    """The daemon from this checkout (or the tree at `root`), its warnings appended to `log`."""
    return subprocess.Popen(
        daemon_command(config),
        cwd=root,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(root)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def stop_daemon(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """A benchmark's daemon stopped as systemd would: SIGTERM, SIGKILL after `timeout` s."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """Each live thread's CPU time in ns (schedstat), by thread id; a thread that ends between
    two reads takes its time with it."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[task.name] = int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return out


class CpuMeter:
    """CPU a process spends, to the nanosecond: /proc/PID/stat counts in 10 ms ticks, too coarse
    for a daemon at rest that uses a few hundred microseconds a second. Sample often (each second)
    so a thread that ends between samples loses at most its last interval."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.last = thread_cpu_ns(pid)
        self.spent_ns = 0

    def sample(self) -> None:
        now = thread_cpu_ns(self.pid)
        self.spent_ns += sum(ns - self.last.get(tid, 0) for tid, ns in now.items())
        self.last = now


def cpu_percent(pids: list[int], seconds: float) -> list[float]:
    """Percent of one core each process uses over the next `seconds`, sampled each second."""
    meters = [CpuMeter(pid) for pid in pids]
    began = time.monotonic()
    while (left := began + seconds - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        for meter in meters:
            meter.sample()
    spent = time.monotonic() - began
    return [100 * meter.spent_ns / 1e9 / spent for meter in meters]
