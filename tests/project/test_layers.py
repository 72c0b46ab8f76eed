"""The package's layers, held in place by its imports (read from the source with `ast`, never
by importing it): the engine reaches no I/O, no two folders import each other, no module is too
long to read, and every package directory ships.

Every import counts, wherever it is written: at the top, inside a function (a lazy import still
runs), and under `if TYPE_CHECKING:` (a type-only import still ties the two modules together).
Importing `a.b` also runs `a/__init__.py`, so a module depends on its target's packages too.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # the 3.9 run (EL 9): the same parser, from PyPI
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "scheduledeventsd"

ENGINE = f"{PACKAGE}.engine"  # engine.py while it is one file, engine/ once it is a package
# Imports the engine may not reach, directly or through any module it imports.
IO_MODULES = frozenset({
    "subprocess", "socket", "select", "threading", "http", "urllib", "requests", "httptools",
    "yaml", "structlog", "prometheus_client",
    # the same kind, for good measure
    "urllib3", "ssl", "fcntl", "signal", "multiprocessing", "asyncio", "systemd",
})  # fmt: skip
# The layers that do I/O: the engine imports nothing of theirs.
IO_LAYERS = tuple(
    f"{PACKAGE}.{layer}"
    for layer in ("runtime", "coordination", "providers", "observe", "simulators", "host")
)

# Imports that break a rule, each with why, while they are being removed. An entry is
# (importer, imported), each a module or a package prefix: the import is not followed by the
# engine's I/O check and not counted as an edge by the cycle checks. The test fails once an
# entry matches no import any more. Empty since issue 27 (the engine took its settings from a
# config/ that loaded the walker and PyYAML): an import that breaks a rule is fixed, not listed.
KNOWN_EXCEPTIONS: Mapping[tuple[str, str], str] = {}

# Folders whose insides are not checked for cycles (cycles between them and other folders are).
# Empty since issue 27 (engine/, gates/, poll/ and config/ had cycles inside): keep it so.
INSIDE_NOT_YET_CHECKED: Mapping[str, str] = {}

MAX_LINES = 600
MAX_ENGINE_LINES = 400
# Modules over the limits today, being split by the other parts of issue 27. Empty it.
TOO_LONG_FOR_NOW: Mapping[str, str] = {}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted name as resolved: one of the package's modules, or an outside name
    line: int
    statement: str = ""  # what the statement names: `target`, or a module inside it


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under `root`, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(root: Path) -> list[Import]:
    """Every import statement of every module, resolved: a target inside the package is the
    most specific of its modules the statement loads, plus each package above it."""
    known = modules(root)
    found: list[Import] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            for name, line in _named(node, module, _is_package(path)):
                found.extend(_resolved(module, name, line, known))
    return found


def _named(node: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """The absolute dotted names one statement imports (`from a import b` gives `a.b`: b may
    be a module; `_resolved` falls back to `a` when it is not)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, node.lineno
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            if not is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join([*base, *([node.module] if node.module else [])])
        else:
            prefix = node.module or ""
        for alias in node.names:
            yield f"{prefix}.{alias.name}", node.lineno


def _resolved(importer: str, name: str, line: int, known: Mapping[str, Path]) -> Iterator[Import]:
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        yield Import(importer, name, line)
        return
    parts = name.split(".")
    while len(parts) > 1 and ".".join(parts) not in known:
        parts.pop()  # `from .config import Config`: Config is not a module, config is
    for n in range(1, len(parts) + 1):
        target = ".".join(parts[:n])
        if target != importer:
            yield Import(importer, target, line, ".".join(parts))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _excepted(edge: Import, exceptions: Iterable[tuple[str, str]]) -> bool:
    """Also the packages the excepted import loads on the way (`host` for `host.hooks`)."""
    named = edge.statement or edge.target
    return any(_within(edge.importer, a) and _within(named, b) for a, b in exceptions)


def internal(edges: Iterable[Import], exceptions: Iterable[tuple[str, str]]) -> list[Import]:
    """The package's own imports, less the known exceptions."""
    exceptions = list(exceptions)
    return [e for e in edges if _within(e.target, PACKAGE) and not _excepted(e, exceptions)]


def engine_io(root: Path, exceptions: Iterable[tuple[str, str]] = KNOWN_EXCEPTIONS) -> list[str]:
    """Each way an engine module reaches I/O: the chain of imports, then what it reaches."""
    edges = imports(root)
    inside: dict[str, list[Import]] = {}
    for e in internal(edges, exceptions):
        inside.setdefault(e.importer, []).append(e)
    outside: dict[str, list[Import]] = {}
    for e in edges:
        if not _within(e.target, PACKAGE):
            outside.setdefault(e.importer, []).append(e)
    problems = []
    starts = [m for m in modules(root) if _within(m, ENGINE)]
    came_from: dict[str, str] = {m: "" for m in starts}
    todo = list(starts)
    while todo:
        module = todo.pop()
        chain = [module]
        while came_from[chain[-1]]:
            chain.append(came_from[chain[-1]])
        via = " -> ".join(reversed(chain))
        if any(_within(module, layer) for layer in IO_LAYERS):
            problems.append(f"{via} (an I/O layer)")
            continue
        for e in outside.get(module, []):
            if e.target.split(".")[0] in IO_MODULES:
                problems.append(f"{via} imports {e.target} (line {e.line})")
        for e in inside.get(module, []):
            if e.target not in came_from:
                came_from[e.target] = module
                todo.append(e.target)
    return sorted(problems)


def packages(root: Path) -> list[str]:
    """Every package (folder with an `__init__.py`) of the package, itself first."""
    return [m for m, path in modules(root).items() if _is_package(path)]


def cycles(edges: Iterable[Import], package: str = PACKAGE) -> list[list[str]]:
    """The groups of `package`'s children (its modules and folders, a folder standing for all
    it holds) that import each other, each with the imports that tie it. A module's own
    packages are not counted: Python loads them before it, whatever it imports, and a
    package's `__init__` importing its modules to give them one face is the usual way."""
    depth = package.count(".") + 2
    graph: dict[str, dict[str, Import]] = {}
    for e in edges:
        if not (_within(e.importer, package) and _within(e.target, package)):
            continue
        if e.importer.startswith(e.target + "."):
            continue
        a, b = (".".join(m.split(".")[:depth]) for m in (e.importer, e.target))
        if a != b:
            graph.setdefault(a, {}).setdefault(b, e)
            graph.setdefault(b, {})
    found = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            ties = [
                f"{a} -> {b} ({e.importer} imports {e.target}, line {e.line})"
                for a in sorted(group)
                for b, e in sorted(graph[a].items())
                if b in group
            ]
            found.append(ties)
    return found


def cycles_inside(root: Path, exceptions: Iterable[tuple[str, str]]) -> dict[str, list[list[str]]]:
    """Each folder below the top with modules or folders importing each other (the top's are
    `cycles`'), but for those whose insides are being rebuilt."""
    edges = internal(imports(root), exceptions)
    found = {}
    for package in packages(root):
        skipped = any(_within(package, prefix) for prefix in INSIDE_NOT_YET_CHECKED)
        if package != PACKAGE and not skipped:
            inside = cycles(edges, package)
            if inside:
                found[package] = inside
    return found


def _strongly_connected(graph: Mapping[str, Mapping[str, object]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (a deep package must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
    return groups


def _shown(found: list[list[str]]) -> str:
    return "\n\n".join("\n".join(ties) for ties in found)


# ---- the rules ------------------------------------------------------------------------------


def test_the_engine_reaches_no_io_and_nothing_of_the_io_layers():
    """No engine module imports, directly or through the modules it imports, subprocess,
    sockets, threads, HTTP, YAML, logging or metrics libraries, or runtime/, coordination/,
    providers/, observe/, simulators/ or host/: the engine stays a pure function of its input."""
    problems = engine_io(ROOT)
    assert not problems, "the engine reaches I/O:\n" + "\n".join(problems)


def planner_io(root: Path) -> list[str]:
    """Each import by which the planner (plan/) reaches an I/O layer, directly or through what
    it imports; [] also when there is no planner (a copy where it was removed fails below)."""
    planner = f"{PACKAGE}.plan"
    inside: dict[str, list[Import]] = {}
    for e in internal(imports(root), KNOWN_EXCEPTIONS):
        inside.setdefault(e.importer, []).append(e)
    starts = [m for m in modules(root) if _within(m, planner)]
    reached, todo, problems = set(starts), list(starts), []
    while todo:
        module = todo.pop()
        for e in inside.get(module, []):
            if any(_within(e.target, layer) for layer in IO_LAYERS):
                problems.append(f"{e.importer} imports {e.target} (line {e.line})")
            elif e.target not in reached:
                reached.add(e.target)
                todo.append(e.target)
    return sorted(problems)


def test_the_planner_reaches_no_io_layer():
    """`plan` runs the engine over a simulated fleet: it may read the configuration (config/,
    PyYAML) but reaches none of the layers that talk to IMDS, etcd, Pacemaker or processes,
    directly or through what it imports (issue 30)."""
    assert (ROOT / PACKAGE / "plan" / "run.py").exists()
    problems = planner_io(ROOT)
    assert not problems, "the planner reaches an I/O layer:\n" + "\n".join(problems)


def test_no_two_folders_of_the_package_import_each_other():
    """The folders (and top-level modules) form layers: an import cycle between two of them
    means neither can be read, tested or replaced without the other."""
    found = cycles(internal(imports(ROOT), KNOWN_EXCEPTIONS))
    assert not found, "import cycles between folders:\n" + _shown(found)


def test_no_two_modules_or_folders_inside_a_folder_import_each_other():
    """The same one level down, and below (the daemon and its lanes did, through a type)."""
    found = cycles_inside(ROOT, KNOWN_EXCEPTIONS)
    shown = "\n\n".join(f"in {package}:\n{_shown(ties)}" for package, ties in found.items())
    assert not found, "import cycles:\n" + shown


def test_every_folder_not_yet_checked_inside_still_needs_it():
    """Once a folder listed in INSIDE_NOT_YET_CHECKED has no cycle inside, it leaves the list."""
    edges = internal(imports(ROOT), KNOWN_EXCEPTIONS)
    done = [
        prefix
        for prefix in INSIDE_NOT_YET_CHECKED
        if prefix in packages(ROOT)
        and not any(cycles(edges, p) for p in packages(ROOT) if _within(p, prefix))
    ]
    assert not done, f"remove from INSIDE_NOT_YET_CHECKED in tests/project/test_layers.py: {done}"


def test_every_known_exception_is_still_needed():
    """An exception that matches no import any more is removed, so the list only shrinks."""
    edges = [e for e in imports(ROOT) if _within(e.target, PACKAGE)]
    stale = [pair for pair in KNOWN_EXCEPTIONS if not any(_excepted(e, [pair]) for e in edges)]
    assert not stale, f"remove from KNOWN_EXCEPTIONS in tests/project/test_layers.py: {stale}"


def test_no_module_is_over_600_lines_and_no_engine_module_over_400():
    """A module longer than that holds more than one idea (issue 27's rule 5)."""
    too_long = []
    for module, path in modules(ROOT).items():
        shown = str(path.relative_to(ROOT))
        limit = MAX_ENGINE_LINES if _within(module, ENGINE) else MAX_LINES
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit and shown not in TOO_LONG_FOR_NOW:
            too_long.append(f"{shown}: {lines} lines (at most {limit})")
    assert not too_long, "\n".join(too_long)


def test_every_module_too_long_for_now_still_is():
    """Once split, a module leaves TOO_LONG_FOR_NOW, so the list only shrinks."""
    done = []
    for shown in TOO_LONG_FOR_NOW:
        path = ROOT / shown
        limit = MAX_ENGINE_LINES if shown.startswith(f"{PACKAGE}/engine") else MAX_LINES
        if not path.exists() or len(path.read_text(encoding="utf-8").splitlines()) <= limit:
            done.append(shown)
    assert not done, f"remove from TOO_LONG_FOR_NOW in tests/project/test_layers.py: {done}"


def test_every_package_directory_is_listed_for_the_build():
    """pyproject.toml names each package: one left out would be missing from the .deb and the
    .rpm, and only a deployed machine would notice."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    present = {
        ".".join(d.relative_to(ROOT).parts)
        for d in [ROOT / PACKAGE, *(ROOT / PACKAGE).rglob("*")]
        if d.is_dir()
        and d.name != "__pycache__"
        and any(f.suffix in (".py", ".yaml") for f in d.iterdir())
    }
    assert listed == present


# ---- the checks above can fail ----------------------------------------------------------------


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The package's source, copied: a place to plant imports."""
    shutil.copytree(
        ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


def _engine_file(root: Path) -> Path:
    package = root / PACKAGE / "engine" / "__init__.py"
    return package if package.exists() else root / PACKAGE / "engine.py"


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n\n{line}\n", encoding="utf-8")


def test_the_copy_passes_as_the_package_does(copy: Path):
    """So a failure below comes from what was planted, not from copying."""
    assert engine_io(copy) == engine_io(ROOT)
    assert cycles(internal(imports(copy), KNOWN_EXCEPTIONS)) == []
    assert cycles_inside(copy, KNOWN_EXCEPTIONS) == {}


@pytest.mark.parametrize(
    ("planted", "reached"),
    [
        ("import subprocess", "subprocess"),
        ("from http.server import HTTPServer", "http.server.HTTPServer"),
        ("def later() -> None:\n    import yaml", "yaml"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import threading", "threading"),
    ],
)
def test_an_io_import_planted_in_the_engine_fails_the_check(copy: Path, planted: str, reached: str):
    """At the top, inside a function, or under TYPE_CHECKING: each is found."""
    _plant(_engine_file(copy), planted)
    problems = engine_io(copy)
    assert [p for p in problems if p not in engine_io(ROOT)] == [
        f"{ENGINE} imports {reached} (line {_last_line(_engine_file(copy))})"
    ]


def _last_line(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_an_import_of_the_runtime_planted_in_the_engine_fails_the_check(copy: Path):
    engine = _engine_file(copy)
    _plant(engine, f"from {'..' if engine.name == '__init__.py' else '.'}runtime import daemon")
    problems = engine_io(copy)
    assert f"{ENGINE} -> {PACKAGE}.runtime.daemon (an I/O layer)" in problems


def test_an_import_of_the_runtime_planted_in_the_planner_fails_the_check(copy: Path):
    _plant(copy / PACKAGE / "plan" / "world.py", "from ..runtime import lanes")
    assert planner_io(copy) == [
        f"{PACKAGE}.plan.world imports {PACKAGE}.runtime (line {_lines(copy)})",
        f"{PACKAGE}.plan.world imports {PACKAGE}.runtime.lanes (line {_lines(copy)})",
    ]


def _lines(copy: Path) -> int:
    return len((copy / PACKAGE / "plan" / "world.py").read_text().splitlines())


def test_an_io_import_reached_through_another_module_fails_the_check(copy: Path):
    """The engine importing a pure-looking module that imports sockets reaches sockets."""
    (copy / PACKAGE / "planted.py").write_text("import socket\n", encoding="utf-8")
    engine = _engine_file(copy)
    _plant(engine, f"from {'..' if engine.name == '__init__.py' else '.'} import planted")
    problems = engine_io(copy)
    assert f"{ENGINE} -> {PACKAGE}.planted imports socket (line 1)" in problems


def test_a_cycle_planted_between_two_folders_fails_the_check(copy: Path):
    """providers/ importing the daemon closes a cycle: the daemon imports providers/."""
    _plant(copy / PACKAGE / "providers" / "identity.py", "from ..runtime import daemon")
    found = cycles(internal(imports(copy), KNOWN_EXCEPTIONS))
    assert found, "the planted cycle was not found"
    shown = _shown(found)
    assert f"{PACKAGE}.providers -> {PACKAGE}.runtime" in shown
    assert f"{PACKAGE}.runtime -> {PACKAGE}.providers" in shown


def test_a_cycle_planted_between_two_modules_of_one_folder_fails_the_check(copy: Path):
    """The lanes importing the daemon for a type, as they did."""
    _plant(
        copy / PACKAGE / "runtime" / "lanes.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .daemon import Daemon",
    )
    assert cycles(internal(imports(copy), KNOWN_EXCEPTIONS)) == []  # one folder
    found = cycles_inside(copy, KNOWN_EXCEPTIONS)
    assert list(found) == [f"{PACKAGE}.runtime"]
    assert f"{PACKAGE}.runtime.lanes -> {PACKAGE}.runtime.daemon" in _shown(
        found[f"{PACKAGE}.runtime"]
    )


def _found(root: Path, exceptions: Iterable[tuple[str, str]]) -> int:
    """How many problems the checks see, with these exceptions."""
    edges = internal(imports(root), exceptions)
    inside = [cycles(edges, p) for p in packages(root) if p != PACKAGE]
    return len(engine_io(root, exceptions)) + len(cycles(edges)) + sum(map(len, inside))


def test_each_known_exception_hides_a_problem_the_checks_would_see():
    """Lifting any one exception makes the checks see more: none is there for nothing."""
    everything = _found(ROOT, KNOWN_EXCEPTIONS)
    for pair in KNOWN_EXCEPTIONS:
        others = [other for other in KNOWN_EXCEPTIONS if other != pair]
        assert _found(ROOT, others) > everything, f"{pair} hides nothing: remove it"


TEST_LAYERS = ("engine", "config", "edges", "system", "project")
# Only these may wait on the wall clock: the engine's and config's tests run on a fake clock.
MAY_SLEEP = ("edges", "system")


def test_the_tests_are_laid_out_by_layer():
    """A test file lives beside the tests of its layer, so a newcomer finds them by folder: engine/
    (pure, fake clock), config/, edges/ (one I/O module against its real peer), system/ (real
    daemons, etcd, Pacemaker, systemd, the deployed package), project/ (docs, layout, contrib)."""
    tests = ROOT / "tests"
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert not loose, f"move into one of tests/{{{','.join(TEST_LAYERS)}}}/: {loose}"
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders <= set(TEST_LAYERS), folders - set(TEST_LAYERS)


def test_only_edge_and_system_tests_sleep():
    """A sleep in an engine or config test means it waits on a real clock where a fake one is
    given: slow, and flaky under load."""
    sleeping = []
    for layer in set(TEST_LAYERS) - set(MAY_SLEEP):
        for path in sorted((ROOT / "tests" / layer).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                called = node.func if isinstance(node, ast.Call) else None
                name = getattr(called, "attr", None) or getattr(called, "id", None)
                if name == "sleep":
                    sleeping.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not sleeping, sleeping
