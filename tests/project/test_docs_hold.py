"""docs/hold-timeline.svg, the picture of the whole-maintenance hold on
docs/explanation/fleets.md, is what `scheduledeventsd plan --format svg` draws for the page's own
hold-fleet.yaml and hold.yaml: drawn by the daemon's engine, not by hand."""

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
        import hold as generator  # noqa: PLC0415 - docs/hold.py, the generator
    finally:
        sys.path.pop(0)
    return generator


def test_the_hold_picture_is_drawn_from_the_pages_own_files():
    """The generator takes the page's two heredocs, as a reader's shell writes them: three VMs
    of one group with max 1, vm-1's undrain failing once, vm-2 down longer than hold_max."""
    generator = _generator()
    files = generator.files(generator.PAGE.read_text())
    assert sorted(files) == ["hold-fleet.yaml", "hold.yaml"]
    config = yaml.safe_load(files["hold.yaml"])
    assert config["concurrency"]["max"] == 1
    fleet = yaml.safe_load(files["hold-fleet.yaml"])
    assert fleet["vms"][0]["hooks"]["undrain"] == ["fail", "2m"]
    assert fleet["maintenance"][1]["vms"] == "vm-2"
    assert fleet["maintenance"][1]["impact"] == "2h"  # longer than hold_max: 3600
    assert config["concurrency"]["hold_max"] == 3600


def test_the_hold_picture_is_what_the_planner_draws():
    """docs/hold.py --check: the committed picture is the planner's drawing, byte for byte, so
    a change of what the engine does with a held slot shows as a stale picture."""
    done = subprocess.run(
        [sys.executable, "docs/hold.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if "the planner is not in this tree" in done.stdout:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout


def test_a_stale_hold_picture_is_caught(tmp_path, monkeypatch, capsys):
    """Not vacuous: a picture that is not the planner's drawing fails --check, and is
    rewritten without it."""
    generator = _generator()
    if generator.drawn(generator.PAGE.read_text()) is None:
        pytest.skip("the planner is not in this tree")
    stale = tmp_path / "hold-timeline.svg"
    stale.write_text(generator.OUT.read_text().replace("vm-3", "vm-4"))
    monkeypatch.setattr(generator, "OUT", stale)
    monkeypatch.setattr(sys, "argv", ["docs/hold.py", "--check"])
    assert generator.main() == 1
    assert "stale" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["docs/hold.py"])
    assert generator.main() == 0
    assert stale.read_text() == (ROOT / "docs" / "hold-timeline.svg").read_text() != ""
