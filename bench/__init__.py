"""Benchmarks: `python -m bench` (against the documented sample), `python -m bench.fleet`
(shared events), `python -m bench.parse` (parse and engine step)."""

from __future__ import annotations

import sys
from pathlib import Path


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
