"""AWS through the same hooks: the real daemon against the simulated EC2 metadata service
(IMDSv2 tokens, spot and scheduled-event notices), and the mapping without a network."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduledeventsd.config import loader
from scheduledeventsd.config.provider import Provider, detect
from scheduledeventsd.engine import Phase, Tracked
from scheduledeventsd.host.store import StateStore, read_status
from scheduledeventsd.model import SCHEDULED, STARTED
from scheduledeventsd.providers import aws
from scheduledeventsd.simulators.aws import INSTANCE_ID, AwsSimulator, aws_time
from tests.conftest import DaemonFactory, Hooks, cli, wait_for

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture
def ec2() -> Any:
    simulator = AwsSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


def aws_config(daemons: DaemonFactory, ec2: AwsSimulator, hooks: Hooks, **extra: Any) -> dict:
    recorder = {n: hooks.recorder(n) for n in ("before", "after", "cancelled", "spot")}
    return {
        "provider": "aws",
        "metadata": {"url": ec2.url, "poll_interval": 0.25, "timeout": 2, "first_call_timeout": 5},
        "state_dir": str(daemons.state_dir),
        "hooks": {name: [{"command": [path]}] for name, path in recorder.items()},
        "events": {
            "Reboot": {"before": ["before"], "after": ["after"], "cancelled": ["cancelled"]},
            "Preempt": ["spot"],
        },
        **extra,
    }


def _status(state_dir: Path) -> Any:
    try:
        return read_status(state_dir)
    except (OSError, ValueError):
        return None


def stdin_of(hooks: Hooks, name: str) -> dict[str, Any]:
    return json.loads((hooks.out / f"{name}.stdin").read_text())


def env_of(hooks: Hooks, name: str) -> dict[str, str]:
    lines = (hooks.out / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_spot_notice_runs_the_preempt_hooks_with_aws_own_words_and_posts_nothing(
    daemons, ec2, hooks
):
    daemon = daemons.start(aws_config(daemons, ec2, hooks))
    daemon.wait_log("vm_name")
    assert daemon.logs("vm_name")[0]["vm_name"] == INSTANCE_ID, "the instance id is its name"
    ec2.spot("terminate", in_seconds=120)
    daemon.wait_log("hook_finished", hook="spot", timeout=10)
    env = env_of(hooks, "spot")
    assert env["SCHEDULED_EVENT_PROVIDER"] == "aws"
    assert env["SCHEDULED_EVENT_TYPE"] == "Preempt"
    assert env["SCHEDULED_EVENT_RESOURCES"] == INSTANCE_ID
    notice = stdin_of(hooks, "spot")
    assert notice["Provider"] == "aws"
    assert notice["ProviderNotice"]["action"] == "terminate"
    assert notice["NotBefore"] == notice["ProviderNotice"]["time"]
    skipped = daemon.wait_log("approval_skipped")
    assert "aws takes no approval" in skipped["reason"]
    status = wait_for(lambda: _status(daemons.state_dir), 10, "status.json")
    assert status["provider"] == "aws"
    assert not [r for r in ec2.requests if r.method not in ("GET", "PUT")], "nothing posted"


def test_a_scheduled_reboot_runs_before_hooks_then_after_hooks_once_completed(daemons, ec2, hooks):
    daemon = daemons.start(aws_config(daemons, ec2, hooks))
    event_id = ec2.schedule("system-reboot", in_seconds=3600)
    daemon.wait_log("hook_finished", hook="before", timeout=10)
    assert env_of(hooks, "before")["SCHEDULED_EVENT_ID"] == event_id
    assert stdin_of(hooks, "before")["ProviderNotice"]["Code"] == "system-reboot"
    ec2.set_state(event_id, "completed")  # AWS keeps it listed, marked
    daemon.wait_log("hook_finished", hook="after", timeout=10)
    assert hooks.order() == ["before", "after"]
    daemon.polls_seen(ec2)
    assert hooks.order() == ["before", "after"], "once"


def test_a_canceled_event_runs_the_cancelled_hooks(daemons, ec2, hooks):
    daemon = daemons.start(aws_config(daemons, ec2, hooks))
    event_id = ec2.schedule("instance-stop", in_seconds=3600)  # a Redeploy: none configured
    unhandled = daemon.wait_log("event_unhandled", timeout=10)
    assert unhandled["event_type"] == "Redeploy"
    second = ec2.schedule("instance-reboot", in_seconds=3600)
    daemon.wait_log("hook_finished", hook="before", timeout=10)
    ec2.set_state(second, "canceled")
    daemon.wait_log("hook_finished", hook="cancelled", timeout=10)
    assert event_id != second


def test_an_expired_token_is_replaced_and_polling_goes_on_unbroken(daemons, ec2, hooks):
    daemon = daemons.start(aws_config(daemons, ec2, hooks))
    issued = ec2.tokens_issued
    ec2.expire_tokens()
    wait_for(lambda: ec2.tokens_issued > issued, 10, "a new token")
    ec2.spot("stop", in_seconds=120)
    daemon.wait_log("hook_finished", hook="spot", timeout=10)
    assert not daemon.logs("poll_failed"), "a 401 is answered with a new token, not a failure"


def test_a_spot_notice_while_a_reboots_hooks_run_is_handled_at_once(daemons, ec2, hooks):
    slow = hooks.make("slow", 'echo slow >> "$OUT/order"; sleep 3')
    cfg = aws_config(daemons, ec2, hooks)
    cfg["hooks"]["before"] = [{"command": [slow]}]
    daemon = daemons.start(cfg)
    ec2.schedule("system-reboot", in_seconds=3600)
    daemon.wait_log("hook_started", hook="before", timeout=10)
    ec2.spot("terminate", in_seconds=120)
    daemon.wait_log("hook_finished", hook="spot", timeout=5)
    assert not daemon.logs("hook_finished", hook="before"), "the spot hooks did not wait"


def test_503s_are_retried_with_backoff(daemons, ec2, hooks):
    daemon = daemons.start(aws_config(daemons, ec2, hooks))
    ec2.fail_next(503, 503)
    daemon.wait_log("poll_failed", timeout=10)
    daemon.wait_log("poll_recovered", timeout=10)


def test_provider_auto_reads_the_dmi_data_and_check_config_says_why(tmp_path, ec2):
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump({"dmi_dir": str(dmi), "hooks": {}, "events": {}, "approve": "always"})
    )
    done = cli("check-config", "--config", str(path))
    assert done.returncode == 0, done.stderr
    assert f"provider:  aws (provider: auto, {dmi}/sys_vendor='Amazon EC2')" in done.stdout
    assert "metadata:  http://169.254.169.254 every" in done.stdout
    assert "warning: approve: aws takes no approval" in done.stderr


@pytest.mark.parametrize(
    ("files", "provider"),
    [
        ({"sys_vendor": "Amazon EC2"}, Provider.AWS),
        ({"sys_vendor": "Xen", "product_version": "4.11.amazon"}, Provider.AWS),
        ({"sys_vendor": "Google", "product_name": "Google Compute Engine"}, Provider.GCP),
        (
            {
                "sys_vendor": "Microsoft Corporation",
                "chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77",
            },
            Provider.AZURE,
        ),
        ({"sys_vendor": "QEMU"}, Provider.AZURE),
        ({}, Provider.AZURE),
    ],
)
def test_the_provider_is_read_from_dmi_and_azure_when_it_names_no_cloud(tmp_path, files, provider):
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    assert detect(tmp_path).provider is provider


def test_the_mapping_of_every_maintenance_code():
    items = [
        {"Code": code, "EventId": f"e-{code}", "NotBefore": aws_time(NOW + 600), "State": "active"}
        for code in aws.CODES
    ]
    doc = aws.document_of(None, json.dumps(items).encode(), vm_name="i-1", now=NOW)
    assert {e.event_id: e.event_type for e in doc.events} == {
        "e-instance-reboot": "Reboot",
        "e-system-reboot": "Reboot",
        "e-system-maintenance": "Freeze",
        "e-instance-stop": "Redeploy",
        "e-instance-retirement": "Terminate",
    }
    assert {e.status for e in doc.events} == {SCHEDULED}
    assert all(e.not_before.timestamp() == NOW + 600 for e in doc.events)


def test_started_canceled_completed_and_unreadable_notices():
    items = [
        {
            "Code": "system-reboot",
            "EventId": "past",
            "NotBefore": aws_time(NOW - 1),
            "State": "active",
        },
        {
            "Code": "system-reboot",
            "EventId": "off",
            "NotBefore": aws_time(NOW + 9),
            "State": "canceled",
        },
        {
            "Code": "system-reboot",
            "EventId": "done",
            "NotBefore": aws_time(NOW + 9),
            "State": "completed",
        },
        {"Code": "volcano", "EventId": "x", "NotBefore": aws_time(NOW), "State": "active"},
        "garbage",
    ]
    body = json.dumps(items).encode()
    doc = aws.document_of(b'{"action": 1}', body, vm_name="i-1", now=NOW)
    assert {e.event_id: e.status for e in doc.events} == {"past": STARTED, "done": STARTED}
    assert len(doc.skipped) == 3
    again = aws.document_of(None, body, vm_name="i-1", now=NOW, completed_shown={"done"})
    assert [e.event_id for e in again.events] == ["past"], "a completed event leaves"
    assert again.incarnation != doc.incarnation


def test_completed_events_are_remembered_only_while_aws_still_lists_them(ec2):
    """Suspected in issue 26, confirmed: the client remembered every completed event it had
    listed Started once, for the life of the daemon (200 events here: 200 kept). It remembers
    those the answer still lists, and each is still listed Started once only."""
    client = aws.AwsClient(ec2.url, 2, 5)
    try:
        for n in range(200):
            event_id = ec2.schedule(in_seconds=600)
            assert [e.status for e in client.fetch_document().events] == [SCHEDULED]
            ec2.set_state(event_id, "completed")
            assert [e.status for e in client.fetch_document().events] == [STARTED], n
            assert client.fetch_document().events == (), "listed Started once, then gone"
            ec2.remove(event_id)  # AWS drops old completed events from the list
            client.fetch_document()
        assert len(client._completed) == 0
        kept = ec2.schedule(in_seconds=600)
        client.fetch_document()
        ec2.set_state(kept, "completed")
        client.fetch_document()
        assert client._completed == {kept}, "still listed: still remembered"
        assert client.fetch_document().events == ()
    finally:
        client.close()


def test_an_unreadable_notice_alone_is_a_new_document_so_its_skip_is_logged():
    """Found with issue 26 #5: the incarnation counted events only, so a notice that cannot be
    read, with nothing else changed, was never news: the engine logs event_skipped only for a
    new incarnation."""
    empty = aws.document_of(None, None, vm_name="i-1", now=NOW)
    unreadable = aws.document_of(b'{"action": "stop"}', None, vm_name="i-1", now=NOW)
    assert unreadable.events == ()
    assert unreadable.skipped
    assert unreadable.incarnation != empty.incarnation


@settings(max_examples=300, deadline=None)
@given(st.none() | st.binary(max_size=300), st.none() | st.binary(max_size=300))
def test_any_bytes_are_a_document_never_an_exception(spot, scheduled):
    aws.document_of(spot, scheduled, vm_name="i-1", now=NOW)


def test_an_aws_config_without_a_provider_specific_url_gets_aws_endpoint():
    cfg = loader.parse({"provider": "aws", "hooks": {}, "events": {}}, "t.yaml", check_files=False)
    assert cfg.metadata.url == "http://169.254.169.254"
    assert cfg.provider is Provider.AWS


def test_a_rebalance_recommendation_is_its_own_type_run_only_when_configured(daemons, ec2, hooks):
    cfg = aws_config(daemons, ec2, hooks)
    cfg["hooks"]["rebalance"] = [{"command": [hooks.recorder("rebalance")]}]
    cfg["events"]["Rebalance"] = ["rebalance"]
    daemon = daemons.start(cfg)
    ec2.rebalance()
    daemon.wait_log("hook_finished", hook="rebalance", timeout=10)
    env = env_of(hooks, "rebalance")
    assert env["SCHEDULED_EVENT_TYPE"] == "Rebalance"
    assert "noticeTime" in stdin_of(hooks, "rebalance")["ProviderNotice"]


def test_the_events_command_reads_aws_notices_too(tmp_path, ec2):
    ec2.spot("terminate", in_seconds=300)
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "provider": "aws",
                "metadata": {"url": ec2.url},
                "state_dir": str(tmp_path / "state"),
                "hooks": {},
                "events": {},
            }
        )
    )
    table = cli("events", "--config", str(path))
    assert table.returncode == 0, table.stderr
    assert f"this VM is {INSTANCE_ID}" in table.stdout
    assert "Preempt" in next(line for line in table.stdout.splitlines() if "spot-" in line)


def test_keys_that_mean_nothing_on_aws_are_warned_about_not_refused():
    raw = {
        "provider": "aws",
        "approve": "always",
        "metadata": {"api_version": "2020-07-01"},
        "hooks": {},
        "events": {},
    }
    cfg = loader.parse(raw, "t.yaml", check_files=False)
    assert cfg.warnings == (
        "approve: aws takes no approval through its metadata service: nothing is posted, events "
        "proceed at their own time (hooks, after-hooks and everything else work)",
        "metadata.api_version: Azure's alone; aws ignores it",
    )
    assert loader.parse({**raw, "provider": "azure"}, "t.yaml", check_files=False).warnings == ()


def test_the_state_file_keeps_whose_notice_an_event_was(tmp_path):
    """After a reboot the after-hooks run from the state file: they still get the cloud's words."""
    spot = b'{"action": "stop", "time": "2026-11-26T12:02:00Z"}'
    (event,) = aws.document_of(spot, None, vm_name="i-1", now=NOW).events
    store = StateStore(tmp_path)
    store.lock()
    try:
        store.save({event.event_id: Tracked(event, Phase.APPROVED)})
        loaded, problem = store.load()
    finally:
        store.unlock()
    assert problem == ""
    kept = loaded[event.event_id].event
    assert (kept.provider, json.loads(kept.notice)) == ("aws", json.loads(spot))
