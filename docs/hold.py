"""Draw the whole-maintenance hold of docs/explanation/fleets.md: docs/hold-timeline.svg, what
`scheduledeventsd plan --format svg` prints for the page's own FLEET file and config.

    .venv/bin/python docs/hold.py            # write it
    .venv/bin/python docs/hold.py --check    # exit 1 if it is stale

Not drawn by hand: the planner runs the daemon's own engine over the page's three VMs (vm-1's
undrain fails once and is retried, vm-2 stays down past `hold_max`), so the picture shows what
the engine does with the slot, and a change of behaviour shows as a stale picture.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Optional

from plan import inputs, svg_of, write

HERE = Path(__file__).parent
PAGE = HERE / "explanation" / "fleets.md"
OUT = HERE / "hold-timeline.svg"
COMMAND = re.compile(r"scheduledeventsd plan --fleet hold-fleet\.yaml --from (\S+)")
FILES = ("hold-fleet.yaml", "hold.yaml")  # the page's other heredocs are not the example's


def files(page: str) -> dict[str, str]:
    """The example's two files, as a reader's shell writes them from the page."""
    return {name: text for name, text in inputs(page).items() if name in FILES}


def drawn(page: str) -> Optional[str]:
    """The SVG the planner draws for the page's example; None without the planner."""
    found = COMMAND.search(page)
    if found is None:
        raise SystemExit(f"{PAGE}: no `scheduledeventsd plan --fleet hold-fleet.yaml` line")
    return svg_of(files(page), "hold-fleet.yaml", found.group(1))  # exit 1: vm-3 over max


def main() -> int:
    return write("hold.py", OUT, drawn(PAGE.read_text(encoding="utf-8")), "--check" in sys.argv)


if __name__ == "__main__":
    sys.exit(main())
