"""docs/plan-example.svg, the picture of docs/how-to/plan-a-wave.md, is what
`scheduledeventsd plan --format svg` draws for the page's own FLEET.yaml and web.yaml."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).parents[2]


def _generator(name: str = "plan") -> ModuleType:
    """docs/NAME.py, the generator of a picture the planner draws."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


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


# The pictures the planner draws for the docs: the generator, the name it writes, a label of the
# picture that a stale copy changes.
PICTURES = [("plan", "web-8", "web-9"), ("hold", "vm-3", "vm-4")]


@pytest.mark.parametrize("name", [name for name, _, _ in PICTURES])
def test_each_picture_is_what_the_planner_draws(name):
    """docs/NAME.py --check: the committed picture is the planner's drawing, byte for byte, so
    a change of what the engine does shows as a stale picture."""
    done = subprocess.run(
        [sys.executable, f"docs/{name}.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout


@pytest.mark.parametrize(("name", "label", "other"), PICTURES)
def test_a_stale_picture_is_caught_and_redrawn(name, label, other, tmp_path, monkeypatch, capsys):
    """Not vacuous: a picture that is not the planner's drawing fails --check, and is
    rewritten without it."""
    generator = _generator(name)
    stale = tmp_path / generator.OUT.name
    stale.write_text(generator.OUT.read_text().replace(label, other))
    monkeypatch.setattr(generator, "OUT", stale)
    monkeypatch.setattr(sys, "argv", [f"docs/{name}.py", "--check"])
    assert generator.main() == 1
    assert "stale" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [f"docs/{name}.py"])
    assert generator.main() == 0
    assert stale.read_text() == (ROOT / "docs" / stale.name).read_text() != ""
