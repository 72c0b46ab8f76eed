"""The command line as a user runs it: events table, version, the README's demo."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import VM, cli

ROOT = Path(__file__).parents[2]


def test_version_is_printed():
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("scheduledeventsd ")


def test_events_shows_which_events_affect_this_vm(sim, daemons):
    ours = sim.add_event("Reboot", [VM], not_before_in=3600)
    theirs = sim.add_event("Freeze", ["other"])
    path = daemons.write_config(daemons.config())
    table = cli("events", "--config", str(path))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert f"this VM is {VM}" in lines[0]
    row = next(line for line in lines if ours in line)
    assert row.startswith("yes")
    assert "Reboot" in row
    assert "59m" in row or "1h00m" in row
    assert next(line for line in lines if theirs in line).startswith("no")

    as_json = json.loads(cli("events", "--config", str(path), "--json").stdout)
    assert {e["EventId"]: e["ForThisVM"] for e in as_json["Events"]} == {ours: True, theirs: False}


def test_events_shows_when_the_hooks_of_a_waiting_event_will_start(sim, daemons, hooks):
    ours = sim.add_event("Reboot", [VM], not_before_in=7200)
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]},
        events={"Reboot": {"before": ["a"], "start_before": 3600}},
    )
    path = daemons.write_config(cfg)
    table = cli("events", "--config", str(path))
    assert "HOOKS IN" in table.stdout
    row = next(line for line in table.stdout.splitlines() if ours in line)
    assert "1h59m" in row or "2h00m" in row
    assert "59m" in row.split("1h59m")[-1] or "1h00m" in row
    as_json = json.loads(cli("events", "--config", str(path), "--json").stdout)
    (event,) = as_json["Events"]
    assert event["HooksStartAt"].endswith("Z")


def test_events_reports_an_unreachable_imds_without_a_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "metadata:\n  url: http://127.0.0.1:9/metadata/scheduledevents\n  timeout: 1\n"
        "  first_call_timeout: 1\nvm_name: x\nhooks: {}\nevents: {}\n"
    )
    result = cli("events", "--config", str(path))
    assert result.returncode == 1
    assert "connection" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_readme_demo_handles_two_events_and_ignores_the_other_vms():
    result = cli(
        "demo", "--hooks-dir", "etc/scheduledeventsd/hooks", "--log-format", "json", timeout=90
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    approved = {r["event_type"] for r in records if r["event"] == "event_approved"}
    ignored = {r["event_type"] for r in records if r["event"] == "event_ignored"}
    assert approved == {"Reboot", "Freeze"}
    assert ignored == {"Redeploy"}
    assert "approvals the simulator received: 6F2B0F41" in result.stderr


def test_the_readme_demo_prints_what_the_readme_shows():
    """The README's sample of `make demo` (its console log) is what the demo prints."""
    from tests.project.test_docs_pages import README, blocks, matches  # noqa: PLC0415

    marker = (
        "checked by tests/system/test_cli.py::test_the_readme_demo_prints_what_the_readme_shows"
    )
    (sample,) = [b for b in blocks(README.read_text()) if marker in b.marker]
    result = cli("demo", "--hooks-dir", "etc/scheduledeventsd/hooks", timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = (result.stdout + result.stderr).splitlines()
    assert matches(sample.text, printed) == [], result.stderr[-4000:]


def _rehearsal_config(tmp_path, hooks_body):
    hook = tmp_path / "drain"
    hook.write_text(f"#!/bin/sh\n{hooks_body}\n")
    hook.chmod(0o755)
    path = tmp_path / "config.yaml"
    path.write_text(
        f"vm_name: rehearsal-vm\nstate_dir: {tmp_path / 'state'}\n"
        f"hooks:\n  drain:\n    - command: [{hook}]\n"
        "events:\n  Reboot:\n    before: [drain]\n    after: [drain]\n"
    )
    return path


@pytest.mark.parametrize("command", ["check-config", "test-hooks"])
def test_a_reader_that_stops_reading_ends_the_command_quietly(tmp_path, command):
    """`check-config | grep -q OK`, `test-hooks ... | head -1`: the reader goes away before
    the output ends. The command ends as one killed by SIGPIPE does (141), without a traceback
    (before: BrokenPipeError, exit 1 or 120)."""
    path = _rehearsal_config(tmp_path, "echo drained")
    argv = [command, *(["Reboot"] if command == "test-hooks" else []), "--config", str(path)]
    with subprocess.Popen(
        [sys.executable, "-m", "scheduledeventsd", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()  # gone before the first line
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err, err
    assert "BrokenPipe" not in err, err


def test_test_hooks_runs_a_stage_for_a_synthetic_event_as_a_real_one_would(tmp_path):
    path = _rehearsal_config(
        tmp_path,
        'echo "$SCHEDULED_EVENT_STAGE $SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_ID"\n'
        "head -c 60 | tr -d '\\n'; echo",
    )
    result = cli("test-hooks", "Reboot", "--stage", "after", "--config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[drain] stdout: after rehearsal-vm test-" in result.stdout
    assert '[drain] stdout: {"Description":' in result.stdout, "the event arrives on stdin"
    assert result.stdout.rstrip().endswith("Reboot after: 1 hook(s) succeeded")
    assert not (tmp_path / "state").exists(), "no state is written"


def test_test_hooks_exits_1_when_a_hook_fails_and_2_when_nothing_is_configured(tmp_path):
    path = _rehearsal_config(tmp_path, "echo broken >&2; exit 3")
    failed = cli("test-hooks", "Reboot", "--config", str(path))
    assert failed.returncode == 1
    assert "[drain] stderr: broken" in failed.stdout
    assert "[drain] exit 3" in failed.stdout
    assert "FAILED" in failed.stdout
    nothing = cli("test-hooks", "Freeze", "--config", str(path))
    assert nothing.returncode == 2
    assert "no before hooks are configured for Freeze" in nothing.stdout


def test_events_shows_that_a_reboot_waits_for_its_maintenance_window(sim, daemons, hooks):
    """A window opening in about two hours, placed from the test's own clock."""
    opens = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)).replace(second=0)
    closes = opens + dt.timedelta(hours=1)
    ours = sim.add_event("Reboot", [VM], not_before_in=6 * 3600)
    cfg = daemons.config(
        hooks={"a": [{"command": [hooks.recorder("a")]}]},
        events={"Reboot": ["a"]},
        windows=[{"start": f"{opens:%H:%M}", "end": f"{closes:%H:%M}", "timezone": "UTC"}],
    )
    path = daemons.write_config(cfg)
    row = next(
        line for line in cli("events", "--config", str(path)).stdout.splitlines() if ours in line
    )
    assert "(window)" in row
    assert "1h59m" in row or "2h00m" in row or "1h58m" in row
    (event,) = json.loads(cli("events", "--config", str(path), "--json").stdout)["Events"]
    assert event["HooksWaitFor"] == "window"
    assert event["HooksStartAt"].startswith(f"{opens:%Y-%m-%dT%H:%M}")
