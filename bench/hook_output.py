"""What a hook's output costs the daemon: CPU and peak RSS of the process runner with a JSON
log sink, for 200 000 short lines and for 100 MB without a newline.

    python -m bench.hook_output

Before the output budget (commit d39e296, this machine, the same sink): 1.84 s of CPU for the
lines, a peak of 218 MB RSS (from 24 MB) for the 100 MB line.
"""

from __future__ import annotations

import os
import resource
import threading
import time

import structlog

from scheduledeventsd.host.hooks import BASE_ENV, ProcessRunner

CASES = (
    ("200 000 lines", "seq 200000"),
    ("100 MB, no newline", "head -c 100000000 /dev/zero"),
)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


def main() -> None:
    with open(os.devnull, "w", encoding="utf-8") as sink_file:
        structlog.configure(
            processors=[structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(sink_file),
        )
        logger = structlog.get_logger()
        runner = ProcessRunner()
        for label, script in CASES:
            cpu, rest, started = _cpu(), _rss_mb(), time.monotonic()
            peak = [rest]
            done = threading.Event()

            def watch(peak: list[float] = peak, done: threading.Event = done) -> None:
                while not done.wait(0.05):
                    peak[0] = max(peak[0], _rss_mb())

            threading.Thread(target=watch, daemon=True).start()
            result = runner.run(
                ("/bin/sh", "-c", script),
                BASE_ENV,
                b"",
                600,
                lambda stream, line: logger.info("hook_output", stream=stream, line=line),
            )
            done.set()
            print(
                f"{label:20s} cpu {_cpu() - cpu:5.2f} s  wall {time.monotonic() - started:5.2f} s"
                f"  rss {rest:.0f} -> peak {peak[0]:.0f} MB  dropped {result.dropped_lines} lines"
            )


if __name__ == "__main__":
    main()
