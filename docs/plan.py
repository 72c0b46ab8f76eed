"""Draw the worked example of docs/how-to/plan-a-wave.md: docs/plan-example.svg, what
`scheduledeventsd plan --format svg` prints for the page's own FLEET.yaml and web.yaml.

    .venv/bin/python docs/plan.py            # write it
    .venv/bin/python docs/plan.py --check    # exit 1 if it is stale

The files are taken from the page's heredocs and the instant from its `plan` command, so the
picture cannot drift from the text. Without the planner in the tree it says so and leaves the
picture alone.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Optional

from generate import refresh, report

HERE = Path(__file__).parent
PAGE = HERE / "how-to" / "plan-a-wave.md"
OUT = HERE / "plan-example.svg"
HEREDOC = re.compile(r"cat >(\S+) <<'EOF2'\n(.*?)\n *EOF2\n", re.S)
FROM = re.compile(r"scheduledeventsd plan --fleet FLEET\.yaml --from (\S+)")


def inputs(page: str) -> dict[str, str]:
    """The files the page writes, by name, as a reader's shell writes them."""
    return {name: textwrap.dedent(body) + "\n" for name, body in HEREDOC.findall(page)}


def drawn(page: str) -> Optional[str]:
    """The SVG the planner draws for the page's example; None without the planner."""
    found = FROM.search(page)
    if found is None:
        raise SystemExit(f"{PAGE}: no `scheduledeventsd plan --fleet FLEET.yaml --from` line")
    return svg_of(inputs(page), "FLEET.yaml", found.group(1))


def svg_of(files: dict[str, str], fleet: str, start: str) -> Optional[str]:
    """What `scheduledeventsd plan --format svg` prints for these files, in a folder of their
    own; None without the planner in this tree."""
    with tempfile.TemporaryDirectory(prefix="plan-example-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        command = ["plan", "--fleet", fleet, "--from", start, "--format", "svg"]
        done = subprocess.run(  # noqa: S603 - this Python, this package, fixed arguments
            [sys.executable, "-m", "scheduledeventsd", *command],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode == 2 and "invalid choice: 'plan'" in done.stderr:
        return None
    if done.returncode not in (0, 1):  # 1: the plan flags a problem, as the examples' do
        raise SystemExit(f"scheduledeventsd {' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def write(generator: str, out: Path, new: Optional[str], check: bool) -> int:
    """Write (or with `check`, compare) a picture the planner drew."""
    if new is None:
        print(f"the planner is not in this tree: {out} left as it is")
        return 0
    if not out.exists():  # the first time: nothing to compare with
        if not check:
            out.write_text(new, encoding="utf-8")
        return report(generator, [str(out)], check=check)
    return report(generator, refresh({out: lambda _old: new}, check=check), check=check)


def main() -> int:
    return write("plan.py", OUT, drawn(PAGE.read_text(encoding="utf-8")), "--check" in sys.argv)


if __name__ == "__main__":
    sys.exit(main())
