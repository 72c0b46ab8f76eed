"""Every module of the package imports under the Python running the tests.

CI runs a subset of the suite a second time under Python 3.9 (EL 9's; see .ci/run): this is
what makes the subset reach every module there, the ones no test of the subset runs included.
A module using syntax or a standard library import newer than the interpreter (a `match`
statement, `tomllib`, a dataclass with `slots=True`) fails here, named.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scheduledeventsd"
SUBSET = ROOT / "tests" / "python39.txt"
MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for path in PACKAGE.rglob("*.py")
    if path.name != "__main__.py"  # it runs the command line when imported
)


def test_the_package_has_modules_to_import():
    assert len(MODULES) > 100, MODULES
    assert "scheduledeventsd.engine.machine" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports(name):
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - said with the module's name and the Python
        version = ".".join(map(str, sys.version_info[:3]))
        pytest.fail(f"{name} does not import under Python {version}: {e!r}")


def test_every_test_the_python39_run_names_exists():
    """A test renamed or removed must be renamed in tests/python39.txt too: found here by
    `make test`, not only by CI's 3.9 run (pytest's "not found"), which a machine without a
    3.9 skips."""
    lines = [line.strip() for line in SUBSET.read_text().splitlines()]
    named = [line.removeprefix("--deselect=") for line in lines if line and line[0] != "#"]
    missing = []
    for node in named:
        path, _, function = node.partition("::")
        if not (ROOT / path).exists():
            missing.append(node)
        elif function:
            tree = ast.parse((ROOT / path).read_text())
            defined = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
            if function.partition("[")[0] not in defined:
                missing.append(node)
    assert len(named) > 10, named
    assert missing == [], f"tests/python39.txt names what does not exist: {missing}"
