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
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from generate import refresh, report
from plan import inputs

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
    with tempfile.TemporaryDirectory(prefix="hold-timeline-") as tmp:
        for name, text in files(page).items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        command = ["plan", "--fleet", "hold-fleet.yaml", "--from", found.group(1)]
        done = subprocess.run(  # noqa: S603 - this Python, this package, fixed arguments
            [sys.executable, "-m", "scheduledeventsd", *command, "--format", "svg"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode == 2 and "invalid choice: 'plan'" in done.stderr:
        return None
    if done.returncode not in (0, 1):  # 1: vm-2 down past hold_max lets vm-3 go: over max
        raise SystemExit(f"scheduledeventsd {' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def main() -> int:
    check = "--check" in sys.argv
    new = drawn(PAGE.read_text(encoding="utf-8"))
    if new is None:
        print(f"the planner is not in this tree: {OUT} left as it is")
        return 0
    if not OUT.exists():  # the first time: nothing to compare with
        if not check:
            OUT.write_text(new, encoding="utf-8")
        return report("hold.py", [str(OUT)], check=check)
    return report("hold.py", refresh({OUT: lambda _old: new}, check=check), check=check)


if __name__ == "__main__":
    sys.exit(main())
