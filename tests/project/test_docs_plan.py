"""docs/plan-example.svg, the picture of docs/how-to/plan-a-wave.md, is what
`scheduledeventsd plan --format svg` draws for the page's own FLEET.yaml and web.yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[2]


def _generator():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import plan as generator  # noqa: PLC0415 - docs/plan.py, the generator
    finally:
        sys.path.pop(0)
    return generator


def test_the_example_is_drawn_from_the_pages_own_files():
    """The generator takes FLEET.yaml and web.yaml from the page's heredocs, as a reader's shell
    writes them (valid YAML, the fleet naming the config), and a changed line of the page
    changes them: the picture cannot be drawn from other files than the page shows."""
    generator = _generator()
    page = generator.PAGE.read_text()
    files = generator.inputs(page)
    assert sorted(files) == ["FLEET.yaml", "web.yaml"]
    fleet = yaml.safe_load(files["FLEET.yaml"])
    assert fleet["vms"][0]["config"] == "web.yaml"
    assert yaml.safe_load(files["web.yaml"])["concurrency"]["max"] == 1
    changed = generator.inputs(page.replace("max: 1", "max: 2", 1))
    assert yaml.safe_load(changed["web.yaml"])["concurrency"]["max"] == 2
    assert generator.FROM.search(page).group(1) == "2026-12-04T00:00:00Z"


def test_the_example_picture_is_what_the_planner_draws():
    """docs/plan.py --check: the committed picture is the planner's drawing, byte for byte."""
    done = subprocess.run(
        [sys.executable, "docs/plan.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if "the planner is not in this tree" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout


def test_a_stale_example_picture_is_caught(tmp_path, monkeypatch, capsys):
    """Not vacuous: a picture that is not the planner's drawing fails --check, and is
    rewritten without it."""
    generator = _generator()
    if generator.drawn(generator.PAGE.read_text()) is None:
        pytest.skip("the planner is not in this tree")
    stale = tmp_path / "plan-example.svg"
    stale.write_text(generator.OUT.read_text().replace("web-8", "web-9"))
    monkeypatch.setattr(generator, "OUT", stale)
    monkeypatch.setattr(sys, "argv", ["docs/plan.py", "--check"])
    assert generator.main() == 1
    assert "stale" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["docs/plan.py"])
    assert generator.main() == 0
    assert stale.read_text() == (ROOT / "docs" / "plan-example.svg").read_text() != ""
