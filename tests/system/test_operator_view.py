"""What an operator reads: check-config's summary of every section, check-config refusing what
`run` refuses, status in words (not Python's `None`, the lead by its source, no drain where none
is configured), the start-up record naming the provider, a second daemon refused before it opens
a port, and every description of the package naming the three clouds."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from scheduledeventsd import cli as cli_module
from scheduledeventsd.observe import report
from scheduledeventsd.simulators.azure import Fault
from tests.conftest import VM, cli, wait_for
from tests.etcd_cluster import free_ports
from tests.system.test_aws import aws_config, ec2  # noqa: F401 - the AWS simulator fixture

ROOT = Path(__file__).parents[2]


# ---- check-config -----------------------------------------------------------------------------


def test_check_config_prints_every_section_it_read(daemons, hooks):
    """Windows, concurrency, coordination, http, metrics, health and webhooks were read but not
    shown: an operator could not see that they were. A webhook shows its host only."""
    (port,) = free_ports(1)
    cfg = daemons.config(
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"]},
        windows=[{"days": ["sat", "sun"], "start": "02:00", "end": "05:00", "timezone": "UTC"}],
        concurrency={"group": "web", "max": 2},
        coordination={"etcd": {"endpoints": ["http://127.0.0.1:2379"]}},
        http={"listen": f"127.0.0.1:{port}"},
        health={"unhealthy_from": "hooks_started"},
        webhooks=[{"url": "https://hooks.example.com/T000/SECRET", "format": "text"}],
    )
    shown = cli("check-config", "--config", str(daemons.write_config(cfg)))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "  windows:   sat,sun 02:00-05:00 UTC" in out
    assert "  concurrency: group web, 2 slot(s), ttl 30s, by etcd" in out
    assert "held up to 3600s while its VM is away (hold_max)" in out, "issue 28"
    assert "  coordination: etcd http://127.0.0.1:2379 (prefix /scheduledeventsd" in out
    assert f"  http:      127.0.0.1:{port} (" in out
    assert "  health:    503 from hooks_started" in out
    assert "  webhook:   https://hooks.example.com/... (text; on detected" in out
    assert "SECRET" not in out
    assert "  provider:  azure (" in out


def test_check_config_prints_none_for_each_section_left_unset(daemons):
    shown = cli("check-config", "--config", str(daemons.write_config(daemons.config())))
    assert shown.returncode == 0, shown.stderr
    for line in (
        "windows:   none",
        "concurrency: none",
        "coordination: none",
        "cluster:   none",
        "http:      none",
    ):
        assert f"  {line}" in shown.stdout, line
    assert "  webhooks:  none" in shown.stdout


@pytest.mark.skipif(not Path("/usr/sbin/crm_mon").exists(), reason="needs pacemaker-cli-utils")
def test_check_config_shows_the_pacemaker_drain_it_read(daemons):
    cfg = daemons.config(cluster={"pacemaker": {"method": "standby", "min_healthy": 2}})
    shown = cli("check-config", "--config", str(daemons.write_config(cfg)))
    assert shown.returncode == 0, shown.stderr
    assert "  cluster:   pacemaker, method standby; drains for Reboot, Redeploy" in shown.stdout
    assert "min_healthy 2" in shown.stdout


def test_check_config_refuses_a_state_directory_run_refuses(daemons):
    """check-config said OK for a group-writable state directory, then `run` refused to start
    with it: the unit's ExecStartPre passed and the service failed."""
    daemons.state_dir.mkdir(mode=0o775)
    daemons.state_dir.chmod(0o775)
    path = daemons.write_config(daemons.config())
    checked = cli("check-config", "--config", str(path))
    assert checked.returncode == 2, checked.stdout
    assert f"state_dir: {daemons.state_dir} is owned by uid" in checked.stderr
    assert "with mode 775" in checked.stderr
    ran = daemons.start(daemons.config(), ready=False)
    assert ran.proc.wait(20) == 1
    assert "with mode 775" in ran.logs("state_unavailable")[0]["error"]
    daemons.state_dir.chmod(0o700)
    assert cli("check-config", "--config", str(path), "--quiet").returncode == 0


def test_check_config_of_the_shipped_file_in_a_clone_says_why_its_hooks_are_missing():
    """In a clone the shipped config's hooks point at /etc/scheduledeventsd/hooks, which only the
    package installs: check-config failed there and nothing said why."""
    if Path("/etc/scheduledeventsd/hooks/drain").exists():
        pytest.skip("the package's hooks are installed on this machine")
    shown = cli("check-config", "--config", str(ROOT / "etc/scheduledeventsd/config.yaml"))
    assert shown.returncode == 2
    assert "hint: /etc/scheduledeventsd/hooks/ is where the package installs" in shown.stderr
    assert "docs/tutorial.md" in shown.stderr


# ---- status ---------------------------------------------------------------------------------


def test_status_before_the_first_good_poll_says_not_yet_not_none(daemons, sim):
    sim.add_fault(Fault("status", status=500, count=0))
    cfg = daemons.config(vm_name=VM)
    daemon = daemons.start(cfg, ready=False)
    daemon.wait_log("poll_failed")
    wait_for((daemons.state_dir / "status.json").exists, what="status.json")
    shown = cli("status", "--config", str(daemons.write_config(cfg, "same.yaml")))
    assert "; incarnation not yet" in shown.stdout, shown.stdout
    assert "None" not in shown.stdout
    sim.clear_faults()


def test_status_names_the_default_lead_when_start_before_is_unset(daemons, sim, hooks):
    """A window opening 5 minutes before NotBefore gives way to the lead: with start_before
    unset that is the default 10 minutes, which status called `start_before`."""
    now = dt.datetime.now(dt.timezone.utc)
    opens = (now + dt.timedelta(minutes=115)).replace(second=0, microsecond=0)
    closes = opens + dt.timedelta(minutes=30)
    cfg = daemons.config(
        vm_name=VM,
        hooks={"drain": [{"command": [hooks.recorder("drain")]}]},
        events={"Reboot": ["drain"]},
        windows=[{"start": f"{opens:%H:%M}", "end": f"{closes:%H:%M}", "timezone": "UTC"}],
    )
    daemon = daemons.start(cfg)
    event_id = sim.add_event("Reboot", [VM], not_before_in=7200)
    daemon.wait_log("event_waiting", event_id=event_id)
    path = daemons.write_config(cfg, "same.yaml")
    shown = wait_for(
        lambda: (s := cli("status", "--config", str(path))).stdout.count("waiting for") and s,
        what="status showing the wait",
    )
    assert (
        "(waiting for the lead: 600 s before NotBefore, the default lead; start_before is unset)"
        in shown.stdout
    ), shown.stdout
    doc = json.loads(cli("status", "--config", str(path), "--json").stdout)
    (event,) = doc["events"]
    assert (event["waiting_for"], event["lead_s"], event["lead_default"]) == (
        "start_before",
        600,
        True,
    )


def test_status_mentions_a_drain_only_for_an_event_waiting_for_one():
    """An event queued for a concurrency slot on a VM without Pacemaker was shown as starting
    "with a slot or a drain"."""
    doc = {
        "version": "0",
        "vm_name": VM,
        "poll": {"incarnation": 3},
        "events": [
            {"event_type": "Reboot", "event_id": "Q", "phase": "queued", "waiting_for": "slot"},
            {
                "event_type": "Reboot",
                "event_id": "D",
                "phase": "draining",
                "waiting_for": "cluster",
            },
        ],
    }
    text = report.status(doc, 0.0, [])
    queued, draining = (line for line in text.splitlines() if "hooks start" in line)
    assert "drain" not in queued
    assert "slot" in queued
    assert "the cluster has drained this node" in draining


# ---- the start-up record and the second daemon ------------------------------------------------


def test_the_start_up_record_names_the_provider_and_azure_alone_its_api_version(
    daemons,
    ec2,  # noqa: F811 - the fixture
    hooks,
):
    azure = daemons.start(daemons.config(vm_name=VM))
    record = azure.wait_log("daemon_starting")
    assert record["provider"] == "azure"
    assert record["api_version"] == "2020-07-01"
    azure.stop()
    daemons.started.clear()
    aws = daemons.start(aws_config(daemons, ec2, hooks), ready=False)
    record = aws.wait_log("daemon_starting")
    assert record["provider"] == "aws"
    assert "api_version" not in record, "AWS has no api-version: it was logged as 2020-07-01"


def test_a_second_daemon_finds_the_lock_before_it_opens_any_port(daemons):
    (port,) = free_ports(1)
    cfg = daemons.config(vm_name=VM, http={"listen": f"127.0.0.1:{port}"})
    first = daemons.start(cfg)
    first.wait_log("http_listening")
    second = daemons.start(cfg, ready=False, config_name="second.yaml")
    assert second.proc.wait(20) == 1
    assert "in use by another scheduledeventsd" in second.logs("state_unavailable")[0]["error"]
    names = [r.get("event") for r in second.records]
    assert "http_unavailable" not in names, "it fought the first daemon for its port first"
    assert "http_listening" not in names


# ---- what the package says it is ----------------------------------------------------------


def _descriptions() -> dict[str, str]:
    man = (ROOT / "packaging/man/scheduledeventsd.8").read_text()
    control = (ROOT / "packaging/deb/debian/control").read_text()
    spec = (ROOT / "packaging/rpm/scheduledeventsd.spec").read_text()
    unit = (ROOT / "systemd/scheduledeventsd.service").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    import scheduledeventsd  # noqa: PLC0415

    return {
        "--help": cli_module.parser().description or "",
        "man NAME": man.split(".SH NAME\n", 1)[1].split(".SH", 1)[0],
        "man DESCRIPTION": man.split(".SH DESCRIPTION\n", 1)[1].split(".SH", 1)[0],
        "unit Description=": re.search(r"^Description=(.*)$", unit, re.M).group(1),
        ".deb Description": control.split("Description:", 1)[1],
        ".rpm Summary": re.search(r"^Summary:(.*)$", spec, re.M).group(1),
        ".rpm %description": spec.split("%description", 1)[1].split("\n%", 1)[0],
        "pyproject description": re.search(r'^description = "(.*)"$', pyproject, re.M).group(1),
        "package docstring": scheduledeventsd.__doc__ or "",
    }


@pytest.mark.parametrize("place", sorted(_descriptions()))
def test_every_description_of_the_package_names_the_three_clouds(place):
    text = " ".join(_descriptions()[place].split())
    for cloud in ("Azure", "AWS", "Google Cloud"):
        assert cloud in text, f"{place}: {text!r}"


def test_the_man_page_lists_every_file_the_daemon_keeps_and_the_stale_status_rule():
    man = (ROOT / "packaging/man/scheduledeventsd.8").read_text()
    files = man.split(".SH FILES\n", 1)[1].split(".SH EXIT STATUS", 1)[0]
    for name in ("state.json", "status.json", "lock", "config.yaml", "hooks/"):
        assert name in files, name
    exit_status = " ".join(man.split(".SH EXIT STATUS\n", 1)[1].split(".SH", 1)[0].split())
    assert "the status is over 5 minutes old" in exit_status
