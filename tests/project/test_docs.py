"""What the documentation (docs/, the README) and the man page promise is what the code does: log
names, metrics, the command line, the hook environment and the numbers the code defines. Each
test fails when the words drift from the code, whichever of the two moved."""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduledeventsd import cli, config, engine, model
from scheduledeventsd.config import loader
from scheduledeventsd.host import hooks
from scheduledeventsd.observe import observer, telemetry, web
from scheduledeventsd.observe.metrics import Metrics
from scheduledeventsd.providers import imds
from scheduledeventsd.records import What

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
SITE = "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.md")))  # every page of the site
LOGGING = (DOCS / "reference" / "logging.md").read_text()
OBSERVABILITY = (DOCS / "reference" / "observability.md").read_text()
COMMAND_LINE = (DOCS / "reference" / "command-line.md").read_text()
HOOKS = (DOCS / "reference" / "hooks.md").read_text()
MAN = (ROOT / "packaging" / "man" / "scheduledeventsd.8").read_text()
LOG_METHODS = {"debug", "info", "warning", "error", "critical", "exception"}


def section(text: str, heading: str, end: str) -> str:
    start = text.index(heading)
    return text[start : text.index(end, start)]


def emitted_log_names() -> set[str]:
    """Every record name the package can log: the engine's typed records, and the literal
    names of the daemon's own records (a log method's first argument, `report`'s second,
    `_report`'s and `_problem`'s first, with the recovery `_problem` implies)."""
    names = {w.value for w in What}
    for path in (ROOT / "scheduledeventsd").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            texts = [
                a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None
                for a in node.args
            ]
            if called in LOG_METHODS and texts and texts[0] and texts[0].islower():
                names.add(texts[0])
            elif called == "report" and len(texts) >= 2 and texts[1]:
                names.add(texts[1])
            elif called in ("_report", "_problem") and texts and texts[0]:
                names.add(texts[0])
                if called == "_problem":
                    names.add(texts[0].replace("_not_", "_"))
    return names


def test_every_log_name_the_daemon_can_emit_is_listed_and_none_listed_is_dead():
    listed = set(re.findall(r"`([a-z_]+)`", section(LOGGING, "# Log records", "\n\nUnder systemd")))
    emitted = emitted_log_names()
    assert emitted - listed == set(), "emitted but not in docs/reference/logging.md"
    assert listed - emitted == set(), "in docs/reference/logging.md but never emitted"


def test_the_log_name_collector_sees_a_new_name():
    """Not vacuous: the collector reads the calls, so a new literal name would be found."""
    tree = ast.parse('self.log.warning("brand_new_record", x=1)')
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call))
    assert isinstance(call.func, ast.Attribute)
    assert call.func.attr in LOG_METHODS
    assert "hook_output" in emitted_log_names()


def exported() -> dict[str, set[str]]:
    """Metric family name -> label names, as the daemon exports them (counters with _total)."""
    fleet = config.Coordination(etcd=config.Etcd(("http://127.0.0.1:9",), timeout=0.1))
    cfg = config.Config(
        hooks={}, events=loader.DEFAULT_EVENTS, coordination=fleet, concurrency=CONCURRENCY
    )
    metrics = Metrics(cfg)  # with concurrency: the group's gauges (its etcd never answers)
    families: dict[str, set[str]] = {}
    try:
        for family in text_string_to_metric_families(metrics.render().decode()):
            for sample in family.samples:
                families.setdefault(sample.name, set()).update(sample.labels)
    finally:
        metrics.close()
    return families


CONCURRENCY = config.Concurrency("web")


def test_every_metric_and_label_the_docs_name_is_exported():
    names = exported()
    rows = re.findall(r"^\| `(scheduledeventsd_[a-z_]+)(?:\{([^}]*)\})?`", OBSERVABILITY, re.M)
    assert len(rows) >= 10
    for name, labels in rows:
        matching = [n for n in names if n == name or n.startswith(name + "_")]
        assert matching, f"{name}: not exported"
        for label in re.findall(r"([a-z_]+)(?:=|,|$)", labels):
            assert any(label in names[n] for n in matching), f"{name}: no label {label}"


def test_every_metric_of_the_daemon_is_in_the_metrics_reference():
    ours = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in exported()}
    ours = {n for n in ours if n.startswith("scheduledeventsd_")}
    documented = set(re.findall(r"`(scheduledeventsd_[a-z_]+)", OBSERVABILITY))
    missing = {n for n in ours if not any(d == n or d.startswith(n) for d in documented)}
    assert not missing


def subcommands() -> dict[str, set[str]]:
    """Subcommand -> its long options, from the argument parser itself."""
    parser = cli.parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {o for a in sub._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
        for name, sub in action.choices.items()
    }


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_the_command_line_reference_synopsis_of_each_command_matches_the_parser(command):
    lines = [
        line
        for line in section(COMMAND_LINE, "```\n", "```\n\n").splitlines()
        if line.startswith(f"scheduledeventsd {command} ")
    ]
    assert len(lines) == 1, f"{command}: not in docs/reference/command-line.md's synopsis"
    synopsis = lines[0].split("#")[0]
    assert set(re.findall(r"--[a-z-]+", synopsis)) == subcommands()[command]


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_the_man_page_synopsis_of_each_command_matches_the_parser(command):
    synopsis = section(MAN, ".SH SYNOPSIS", ".SH DESCRIPTION")
    blocks = synopsis.split(".br")
    (block,) = [
        b for b in blocks if f".B scheduledeventsd {command.replace('-', chr(92) + '-')}" in b
    ]
    options = {o.replace("\\", "") for o in re.findall(r"\\-\\-[a-z\\-]+", block)}
    assert options == subcommands()[command]


def test_every_variable_a_hook_gets_is_documented_in_the_readme_the_docs_and_the_man_page():
    event = model.Event("E", "Reboot", "Scheduled", "VirtualMachine", ("vm",), None)
    given = {k for k in hooks.hook_environment(event, "h", 1, "vm", {}) if k.startswith("SCHED")}
    readme = set(
        re.findall(
            r"^\| `(SCHEDULED_EVENT_[A-Z_]+)`", section(README, "## What a hook", "## Com"), re.M
        )
    )
    page = set(re.findall(r"^ *\| `(SCHEDULED_EVENT_[A-Z_]+)`", HOOKS, re.M))
    man = set(re.findall(r"(SCHEDULED_EVENT_[A-Z_]+)", section(MAN, ".SH HOOKS", ".SH LIFECYCLE")))
    assert given == readme
    assert given == page
    assert given == man


def test_the_numbers_the_docs_state_are_the_codes():
    """Limits, intervals and defaults, written from the constants that define them."""
    md = config.Metadata()
    stall = md.first_call_timeout + md.timeout + engine.STALL_MARGIN
    approval = engine.APPROVAL_BACKOFF
    name = engine.NAME_BACKOFF
    stated = [
        f"never reading more than {imds.MAX_BODY >> 20} MiB of response",
        f"timeouts by {engine.STALL_MARGIN:g} s (`first_call_timeout` + `timeout` + "
        f"{engine.STALL_MARGIN:g} s: {stall:g} s by default)",
        f"({approval.first:g} s doubling to {approval.cap:g} s)",
        f"again after {name.first:g} s, doubling to {name.cap:g} s",
        f"SIGKILL {hooks.KILL_GRACE:g} s later",
        f"cut to {hooks.MAX_ENV_VALUE // 1024} KiB",
        f"EventIds over {model.MAX_EVENT_ID} characters",
        f"else every {telemetry.TEXTFILE_EVERY:g} s",
        f"the textfile every {telemetry.TEXTFILE_EVERY:g} s",
        f"unreachable for over {observer.BLIND_AFTER / 60:g} minutes",
        f"each line cut at {hooks.MAX_LINE} bytes with a marker, at most "
        f"{hooks.MAX_LOGGED_LINES} lines or {hooks.MAX_LOGGED_BYTES // 1024} KiB per",
        "then SIGKILL a second later" if hooks.LEFTOVER_GRACE == 1 else "LEFTOVER_GRACE",
        f"at most {web.MAX_CONNECTIONS} connections",
        f"each request has {web.REQUEST_DEADLINE:g} s in all",
    ]
    assert telemetry.STATUS_EVERY == 60, "the docs say 'at least every minute'"
    assert "at least every minute" in SITE
    unit = (ROOT / "systemd" / "scheduledeventsd.service").read_text()
    assert f"shutdown_grace ({config.Config().shutdown_grace:g} s)" in unit
    for text in stated:
        assert text in SITE, text
    assert engine.KILL_WAIT + engine.STOP_MARGIN == 17, "the docs say 'its grace plus 17 s'"
    assert dt.timedelta(seconds=stall) == dt.timedelta(seconds=185)
