"""Benchmarks: `python -m bench` (against the documented sample), `python -m bench.fleet`
(shared events), `python -m bench.parse` (parse and engine step)."""

from __future__ import annotations

import os
import subprocess
import sys
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
