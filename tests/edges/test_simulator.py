"""The simulator enforces what IMDS enforces and moves events along as the platform does."""

from __future__ import annotations

import json
import time

import pytest
import requests

from scheduledeventsd.simulators.azure import Fault, Simulator
from scheduledeventsd.simulators.scenario import (
    Scenario,
    ScenarioError,
    bundled_scenario,
    load_scenario,
)
from tests.conftest import wait_for


@pytest.fixture
def live():
    sim = Simulator(
        Scenario(vm_name="vm1", start_after_approval=0.2, started_for=0.3), rate_limit=False
    )
    sim.start()
    yield sim
    sim.stop()


def get(sim, headers=None, params="api-version=2020-07-01", path="/metadata/scheduledevents"):
    base = sim.url.rsplit("/metadata", 1)[0]
    return requests.get(
        f"{base}{path}?{params}",
        headers={"Metadata": "true", **(headers or {})},
        timeout=5,
        allow_redirects=False,
    )


def post(sim, body, headers=None):
    return requests.post(
        sim.url + "?api-version=2020-07-01",
        data=body,
        headers={"Metadata": "true", **(headers or {})},
        timeout=5,
    )


def test_requests_without_the_metadata_header_are_refused_as_imds_does(live):
    r = requests.get(live.url + "?api-version=2020-07-01", timeout=5)
    assert r.status_code == 400
    assert r.json() == {"error": "Bad request. Required metadata header not specified"}


def test_missing_or_unknown_api_version_is_refused_with_the_newest_versions(live):
    for params in ("", "api-version=2099-01-01"):
        r = get(live, params=params)
        assert r.status_code == 400
        assert "api-version" in r.json()["error"]
        assert "2020-07-01" in r.json()["newest-versions"]


def test_x_forwarded_for_and_duplicate_parameters_are_refused(live):
    assert get(live, headers={"X-Forwarded-For": "10.0.0.1"}).status_code == 400
    assert get(live, params="api-version=2020-07-01&api-version=2020-07-01").status_code == 400


def test_the_document_is_compact_json_and_older_versions_lack_newer_fields(live):
    live.add_event("Terminate", ["vm1"], duration=30)
    r = get(live)
    assert r.text.startswith('{"DocumentIncarnation":2,"Events":[{')
    assert r.json()["Events"][0]["DurationInSeconds"] == 30
    assert get(live, params="api-version=2017-11-01").json()["Events"] == [], (
        "Terminate came in 2019-01-01"
    )
    old = get(live, params="api-version=2019-04-01").json()["Events"][0]
    assert "Description" in old
    assert "EventSource" not in old
    assert "DurationInSeconds" not in old


def test_vm_name_is_answered_in_text_format_only(live):
    path = "/metadata/instance/compute/name"
    assert get(live, path=path, params="api-version=2021-02-01&format=text").text == "vm1"
    assert get(live, path=path, params="api-version=2021-02-01").status_code == 400


def test_an_approved_event_turns_started_then_leaves_the_document(live):
    event_id = live.add_event("Reboot", ["vm1"])
    assert post(live, json.dumps({"StartRequests": [{"EventId": event_id}]})).status_code == 200
    wait_for(
        lambda: (
            get(live).json()["Events"] and get(live).json()["Events"][0]["EventStatus"] == "Started"
        ),
        5,
        "Started",
    )
    assert get(live).json()["Events"][0]["NotBefore"] == ""
    wait_for(lambda: get(live).json()["Events"] == [], 5, "event to leave")
    assert live.approved(event_id)


@pytest.mark.parametrize(
    "body", [b"", b"{}", b'{"StartRequests": []}', b'{"StartRequests": [{"Id": 1}]}', b"nope"]
)
def test_malformed_start_requests_are_refused(live, body):
    assert post(live, body).status_code == 400
    assert not live.approvals


def test_more_than_five_requests_a_second_get_429():
    sim = Simulator(Scenario(vm_name="vm1"))
    sim.start()
    try:
        codes = [get(sim).status_code for _ in range(8)]
    finally:
        sim.stop()
    assert codes[:5] == [200] * 5
    assert 429 in codes[5:]


def test_faults_apply_to_the_given_number_of_requests(live):
    live.add_fault(Fault("status", status=503, count=2))
    assert [get(live).status_code for _ in range(3)] == [503, 503, 200]
    live.add_fault(Fault("garbage"))
    assert get(live).text.startswith("<html>")
    live.add_fault(Fault("redirect", status=301, location="http://elsewhere/"))
    assert get(live).headers["Location"] == "http://elsewhere/"
    live.add_fault(Fault("drop"))
    with pytest.raises(requests.ConnectionError):
        get(live)
    with pytest.raises(ValueError, match="fault kind"):
        Fault("explode")


def test_the_control_api_adds_events_and_reports_approvals(live):
    base = live.url.rsplit("/metadata", 1)[0] + "/_simulator"
    created = requests.post(
        f"{base}/events", json={"EventType": "Preempt", "not_before_in": 30}, timeout=5
    ).json()
    state = requests.get(f"{base}/state", timeout=5).json()
    assert state["events"][0]["EventId"] == created["EventId"]
    assert state["events"][0]["Resources"] == ["vm1"]
    requests.delete(f"{base}/events/{created['EventId']}", timeout=5)
    assert requests.get(f"{base}/state", timeout=5).json()["events"] == []


def test_scenario_steps_play_on_the_timeline(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "vm_name: v\nsteps:\n  - at: 0\n    add: {EventId: A, EventType: Freeze}\n"
        "  - at: 0.3\n    remove: A\n"
    )
    sim = Simulator(load_scenario(path))
    assert sim.event_ids() == ["A"]
    time.sleep(0.35)
    assert sim.event_ids() == []


def test_scenario_errors_name_the_file_and_step(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("steps:\n  - add: {}\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: steps\[0\]"):
        load_scenario(path)


def test_the_bundled_demo_scenario_loads():
    scenario = load_scenario(bundled_scenario("demo"))
    assert scenario.vm_name == "demo-vm"
    assert [s.action for s in scenario.steps] == ["add", "add", "add"]


def test_an_add_and_an_update_of_the_same_event_due_together_both_apply(tmp_path):
    """Steps used to re-enter the timeline: the update ran before the add and both were lost."""
    path = tmp_path / "s.yaml"
    path.write_text(
        "vm_name: v\nsteps:\n"
        "  - at: 0\n    add: {EventId: A, EventType: Reboot}\n"
        "  - at: 0\n    update: {EventId: A, Description: changed}\n"
    )
    sim = Simulator(load_scenario(path))
    (event,) = sim.document()["Events"]
    assert (event["EventId"], event["Description"]) == ("A", "changed")


def test_the_history_the_simulator_keeps_is_bounded():
    sim = Simulator(Scenario(vm_name="v", started_for=None))
    for _ in range(3):
        sim._approve(["X"])
        sim.add_event("Freeze", ["v"])
    assert sim.approvals.maxlen is not None
    assert sim.changes.maxlen is not None
    assert sim.requests.maxlen is not None
