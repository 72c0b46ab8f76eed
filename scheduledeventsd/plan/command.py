"""`scheduledeventsd plan`: the fleet (or a built-in scenario) read, the wave planned, the plan
rendered; bad input told as `check-config` tells it (exit 2), a plan with problems exit 1."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Optional

from ..config import ConfigError
from . import fleet, report, run, scenarios

EXIT_CONFIG = 2


def main(
    given: Optional[Path],
    scenario: Optional[str],
    config: Path,
    *,
    start: Optional[dt.datetime],
    form: str,
    output: Optional[Path],
) -> int:
    try:
        planned = fleet.load(given, config) if given else scenarios.load(str(scenario), config)
    except ConfigError as e:
        for problem in e.problems:
            print(f"error: {problem}", file=sys.stderr)
        shown = given or f"scenario {scenario}"
        print(f"{shown}: {len(e.problems)} problem(s); nothing was planned", file=sys.stderr)
        return EXIT_CONFIG
    start = start or dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    try:
        data = report.build(run.Plan(planned, start).run())
    except run.PlanError as e:  # a defect of the planner: said, not a traceback
        print(f"error: the plan could not be simulated: {e}", file=sys.stderr)
        return 1
    text = report.render(data, form)
    if output is None:
        sys.stdout.write(text)
        return int(data["summary"]["exit"])
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"error: {output}: {e.strerror or e}", file=sys.stderr)
        return EXIT_CONFIG  # bad input (--output), not a plan that is late
    return int(data["summary"]["exit"])
