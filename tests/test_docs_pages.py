"""The documentation site as a reader meets it: every page reachable from the index, the README
short, and every shell block of the tutorial, the how-tos and the README run as written against
the simulator on loopback, its sample output checked against what the program printed.

A shell block a test cannot run (it needs a cloud VM, or installs the package) is preceded by
`<!-- not tested: REASON -->`; a sample output is a `text` block preceded by
`<!-- output of the block above -->`, where `...` stands for what differs from run to run."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
NOT_TESTED = re.compile(r"<!-- not tested: (\S.*?) -->")
OUTPUT = "<!-- output of the block above -->"
README_MAX_LINES = 300


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, text, and the marker line before it."""

    lang: str
    text: str
    marker: str
    line: int


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, each with the comment line just before it."""
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^( *)```(\w*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        indent = opening.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == f"{indent}```")
        marker = before.strip() if before.strip().startswith("<!--") else ""
        body = textwrap.dedent("\n".join(lines[i + 1 : end]))
        found.append(Block(opening.group(2), body, marker, i + 1))
        i = end + 1
    return found


def nav_pages(nav: object) -> set[str]:
    """Every page a nav (mkdocs.yml) lists, at any depth."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(nav_pages(v) for v in nav.values()))
    if isinstance(nav, list):
        return set().union(*(nav_pages(v) for v in nav))
    return set()


def unreachable(docs: Path, nav: object) -> set[str]:
    """Pages of the site no reader reaches from the index's navigation."""
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    return pages - nav_pages(nav)


def test_every_page_is_reachable_from_the_index():
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert unreachable(DOCS, site["nav"]) == set()
    assert nav_pages(site["nav"]) <= {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}


def test_a_page_left_out_of_the_nav_is_found(tmp_path):
    """Not vacuous: a page no nav entry names is reported."""
    (tmp_path / "index.md").write_text("# i\n")
    (tmp_path / "how-to").mkdir()
    (tmp_path / "how-to" / "orphan.md").write_text("# o\n")
    assert unreachable(tmp_path, [{"Home": "index.md"}]) == {"how-to/orphan.md"}


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def test_the_readme_keeps_the_two_commands():
    """`.ci/run` and the review hooks find the test command in the README."""
    text = README.read_text()
    assert "make demo" in text
    assert "make test " in text or "make test\n" in text


# ---- the pages' shell blocks, run as written ----------------------------------------------

RUN_PAGES = sorted(
    [DOCS / "tutorial.md", *(DOCS / "how-to").glob("*.md"), README],
    key=lambda p: p.as_posix(),
)


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_shell_block_is_run_or_marked():
    """A shell block either runs in the tests or says why it cannot (and the reason is given)."""
    for page in RUN_PAGES:
        for block in blocks(page.read_text()):
            if block.lang in ("sh", "bash", "console", "shell"):
                assert block.lang == "sh", f"{page_id(page)}:{block.line}: write ```sh"
            if block.lang == "text" and block.marker:
                assert block.marker == OUTPUT, f"{page_id(page)}:{block.line}: {block.marker}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def script(page: Path, port: int) -> tuple[str, list[tuple[int, int, str]]]:
    """The page's runnable shell blocks as one bash script that marks where each block's
    output begins, and the samples to check: (block number, line, sample text)."""
    parts = ["set -u"]
    samples = []
    last = -1
    for block in blocks(page.read_text()):
        if block.lang == "sh" and not NOT_TESTED.fullmatch(block.marker):
            last += 1
            body = block.text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
            parts.append(f"echo '@@block {last}'\n{body}")
        elif block.lang == "text" and block.marker == OUTPUT:
            samples.append(
                (last, block.line, block.text.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
            )
    parts.append("echo '@@block end'")
    return "\n".join(parts) + "\n", samples


def outputs(printed: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    current = None
    for line in printed.splitlines():
        mark = re.fullmatch(r"@@block (\d+|end)", line)
        if mark:
            current = None if mark.group(1) == "end" else int(mark.group(1))
            found.setdefault(current if current is not None else -1, [])
        elif current is not None:
            found[current].append(line)
    return found


def matches(sample: str, printed: list[str]) -> list[str]:
    """The sample lines not found, in order, among the printed ones (`...` matches anything;
    a sample line that is only `...` stands for any lines)."""
    missing = []
    at = 0
    for line in sample.splitlines():
        if line.strip() == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("...")) + r"\s*")
        hit = next((i for i in range(at, len(printed)) if pattern.fullmatch(printed[i])), None)
        if hit is None:
            missing.append(line)
        else:
            at = hit + 1
    return missing


def test_the_sample_matcher_catches_a_stale_line():
    """Not vacuous: a sample line the program no longer prints is reported; `...` is free."""
    printed = ["config.yaml: OK", "  approve:   sole", "  hook drain: /x/drain (timeout 300s)"]
    assert matches("config.yaml: OK\n...\n  hook drain: .../drain (timeout 300s)", printed) == []
    assert matches("config.yaml: OK\n  approve:   all", printed) == ["  approve:   all"]


RUNNABLE = [p for p in RUN_PAGES if script(p, 0)[0].count("@@block") > 1]


@pytest.mark.parametrize("page", RUNNABLE, ids=page_id)
def test_the_pages_shell_blocks_run_as_written_and_print_their_samples(page, tmp_path):
    """Each page's untagged blocks run in order in one bash, as root, with HOME a fresh
    directory and the simulator on a free loopback port instead of 8080; each block must
    succeed and print its sample. The page's own commands stop what it started; whatever is
    left of its process group is killed."""
    port = free_port()
    text, samples = script(page, port)
    venv_bin = Path(sys.executable).parent
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
    }
    proc = subprocess.Popen(  # the page's blocks, as a reader runs them
        ["/bin/bash", "-e", "-o", "pipefail", "-c", text],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        printed, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, printed
    found = outputs(printed)
    assert -1 in found, f"the page's blocks did not all run:\n{printed}"
    for number, line, sample in samples:
        missing = matches(sample, found.get(number, []))
        assert not missing, f"{page_id(page)}:{line}: not printed: {missing}\n{printed}"


# ---- the site builds strictly, and the README's links lead somewhere -------------------------

MKDOCS = Path("/usr/bin/mkdocs")  # Debian's: `make test` installs it, as `make docs` does


def build(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(MKDOCS),
            "build",
            "--strict",
            "-f",
            str(root / "mkdocs.yml"),
            "-d",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    built = build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "tutorial.html").exists()
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "mkdocs.yml").write_text((ROOT / "mkdocs.yml").read_text())
    shutil.copytree(DOCS, copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "docs" / "tutorial.md").open("a") as page:
        page.write("\n[a page that is not there](how-to/nowhere.md)\n")
    broken = build(copy, tmp_path / "broken")
    assert broken.returncode != 0
    assert "nowhere.md" in broken.stdout + broken.stderr


def test_every_relative_link_of_the_readme_leads_to_a_file():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if "://" not in link]
    assert len(relative) >= 10
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing


def _cli_generator():
    sys.path.insert(0, str(DOCS))
    try:
        import cli as generator  # noqa: PLC0415 - docs/cli.py, the generator
    finally:
        sys.path.pop(0)
    return generator


def test_the_command_line_reference_and_the_man_synopsis_are_the_parsers(monkeypatch):
    """docs/reference/command-line.md and the man page's SYNOPSIS are what docs/cli.py writes
    from the parser; a changed parser makes them stale (the check is not vacuous)."""
    generator = _cli_generator()
    for path, render in generator.rendered().items():
        assert render(path.read_text()) == path.read_text(), f"{path} stale: run docs/cli.py"
    parser = generator.cli.parser

    def changed():
        top = parser()
        top.description = "A changed description."
        return top

    monkeypatch.setattr(generator.cli, "parser", changed)
    assert "A changed description." in generator.markdown()
    monkeypatch.setattr(generator, "_roman", lambda text: text.upper())
    assert ".B scheduledeventsd RUN" in generator.troff()
