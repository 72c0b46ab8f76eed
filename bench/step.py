"""Cost of one engine step, at rest and under churn (50 events of other VMs, one of ours
waiting for its lead time), in microseconds.

    python -m bench.step

To compare two commits side by side, run it in a worktree of each, in one sitting:
    git worktree add /tmp/before REV
    (cd /tmp/before && python -m bench.step); python -m bench.step
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from scheduledeventsd import engine
from scheduledeventsd.config import Config, EventRule
from scheduledeventsd.model import Document, Event

WALL = 1_800_000_000.0


def _event(i: int, vm: str) -> Event:
    when = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    return Event(f"E{i}", "Reboot", "Scheduled", "VirtualMachine", (vm,), when)


def per_step_us(documents: list[Document], steps: int) -> float:
    cfg = Config(
        vm_name="this-vm",
        hooks={},
        events={"Reboot": EventRule(("drain",), start_before=600.0)},
        state_dir=Path("/unused"),
    )
    state, _ = engine.step(engine.initial(cfg), engine.Boot({}), 0.0)
    state, _ = engine.step(state, engine.DocumentFetched(documents[0], WALL), 0.5)
    started = time.perf_counter()
    for k in range(steps):
        document = documents[k % len(documents)]
        state, _ = engine.step(state, engine.DocumentFetched(document, WALL + k), 1.0 + k)
    return (time.perf_counter() - started) / steps * 1e6


def main() -> None:
    ours = _event(999, "this-vm")
    rest = [Document(5, (*(_event(i, "other") for i in range(50)), ours))]
    churn = [
        Document(5 + j, (*(_event(i + j, "other") for i in range(50)), ours)) for j in range(200)
    ]
    at_rest = min(per_step_us(rest, 20_000) for _ in range(3))
    churning = min(per_step_us(churn, 4_000) for _ in range(3))
    print(f"at rest (the same document)      {at_rest:7.1f} us per step")
    print(f"churn (a new document each poll) {churning:7.1f} us per step")


if __name__ == "__main__":
    main()
