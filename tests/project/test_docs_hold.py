"""docs/hold-timeline.svg, the picture of the whole-maintenance hold on
docs/explanation/fleets.md, is what `scheduledeventsd plan --format svg` draws for the page's own
hold-fleet.yaml and hold.yaml: drawn by the daemon's engine, not by hand (test_docs_plan checks
the picture and that a stale one is caught)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.project.test_docs_plan import _generator as _drawn_by

ROOT = Path(__file__).parents[2]


def _generator():
    return _drawn_by("hold")


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
