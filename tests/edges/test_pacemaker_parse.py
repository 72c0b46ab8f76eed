"""What the cluster's tools say, read without a cluster: crm_mon's XML (as Pacemaker 2.1 writes
it), crm_simulate's plan, and the judgements on them (may this node drain, is it drained)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduledeventsd.config import DrainMethod, Pacemaker
from scheduledeventsd.coordination.pacemaker import (
    READY,
    ClusterError,
    is_ready,
    parse_status,
    still_here,
    transitions,
    why_not_drain,
)
from scheduledeventsd.engine.lifecycle import Drain, Phase
from scheduledeventsd.host.store import StateStore
from tests.engine.test_engine import Tracked, event


def node(name, online="true", standby="false", health="green", **extra):
    attrs = " ".join(f'{k}="{v}"' for k, v in extra.items())
    return (
        f'<node name="{name}" id="1" online="{online}" standby="{standby}" maintenance="false" '
        f'pending="false" unclean="false" health="{health}" shutdown="false" {attrs}/>'
    )


def resource(rid, on=(), role="Started", active="true", **extra):
    attrs = " ".join(f'{k}="{v}"' for k, v in extra.items())
    nodes = "".join(f'<node name="{n}" id="1" cached="true"/>' for n in on)
    return (
        f'<resource id="{rid}" resource_agent="ocf:pacemaker:Dummy" role="{role}" '
        f'active="{active}" managed="true" {attrs}>{nodes}</resource>'
    )


def status(nodes, resources="", quorum="true", attributes=""):
    return f"""<pacemaker-result api-version="2.25" request="crm_mon --output-as=xml">
  <summary>
    <current_dc present="true" version="2.1.5" name="node2" id="2" with_quorum="{quorum}"/>
  </summary>
  <nodes>{"".join(nodes)}</nodes>
  <resources>{resources}</resources>
  <node_attributes>{attributes}</node_attributes>
  <status code="0" message="OK"/>
</pacemaker-result>"""


THREE = [node("node1"), node("node2"), node("node3")]


def test_a_reading_gives_quorum_nodes_and_where_each_resource_runs():
    view = parse_status(
        status(THREE, resource("d1", ["node1"]) + resource("d2", ["node2"]) + resource("d3"))
    )
    assert view.quorate
    assert set(view.nodes) == {"node1", "node2", "node3"}
    assert view.active == {"node1": ("d1",), "node2": ("d2",)}
    assert view.moving == ()


def test_resources_in_groups_and_clones_are_read_too():
    members = resource("a", ["node1"]) + resource("b", ["node1"])
    group = f'<group id="g" number_resources="2">{members}</group>'
    clone = f'<clone id="c">{resource("x", ["node2"])}{resource("x", ["node1"])}</clone>'
    view = parse_status(status(THREE, group + clone))
    assert view.active["node1"] == ("a", "b", "x")


def test_a_start_or_stop_under_way_is_moving():
    view = parse_status(
        status(
            THREE, resource("d1", ["node2"], role="Starting") + resource("d2", pending="Stopping")
        )
    )
    assert view.moving == ("d1", "d2")
    assert still_here(view, "node1") == ("d1", "d2"), "not drained while anything moves"


def test_no_dc_or_no_quorum_is_not_quorate():
    assert not parse_status(status(THREE, quorum="false")).quorate
    assert not parse_status(status(THREE).replace('present="true"', 'present="false"')).quorate


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not xml",
        "<pacemaker-result/>",
        '<!DOCTYPE x [<!ENTITY a "aaaa">]><pacemaker-result>&a;</pacemaker-result>',
    ],
)
def test_an_answer_that_is_no_cluster_is_a_cluster_error(text):
    with pytest.raises(ClusterError):
        parse_status(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_is_a_view_or_a_cluster_error(text):
    with contextlib.suppress(ClusterError):
        parse_status(text)


SIMULATE = """Current cluster status:
  * Node List:
    * Node node1: online (health is RED)
    * Online: [ node2 node3 ]

Transition Summary:
  * Move       d1     ( node1 -> node2 )
  * Start      d4     (          node3 )

Executing Cluster Transition:
  * Resource action: d1 stop on node1
"""


def test_the_plan_is_read_from_the_transition_summary_only():
    assert transitions(SIMULATE) == (
        "Move       d1     ( node1 -> node2 )",
        "Start      d4     (          node3 )",
    )
    settled = (
        SIMULATE.split("Transition Summary:", maxsplit=1)[0]
        + "Transition Summary:\n\nExecuting Cluster Transition:\n"
    )
    assert transitions(settled) == ()


def test_a_node_may_drain_while_enough_others_stay_online_and_healthy():
    view = parse_status(status(THREE))
    assert why_not_drain(view, "node1", (), 1) is None
    assert why_not_drain(view, "node1", (), 2) is None
    assert why_not_drain(view, "node1", (), 3) == "too_few_healthy"


def test_nodes_the_same_event_takes_away_do_not_count_as_staying():
    view = parse_status(status(THREE))
    assert why_not_drain(view, "node1", ("node2",), 1) is None
    assert why_not_drain(view, "node1", ("NODE2", "node3"), 1) == "too_few_healthy"


def test_offline_standby_or_red_nodes_do_not_count_as_staying():
    view = parse_status(
        status([node("node1"), node("node2", online="false"), node("node3", health="red")])
    )
    assert why_not_drain(view, "node1", (), 1) == "too_few_healthy"
    view = parse_status(status([node("node1"), node("node2", standby="true"), node("node3")]))
    assert why_not_drain(view, "node1", (), 1) is None
    assert why_not_drain(view, "node1", (), 2) == "too_few_healthy"


def test_no_quorum_or_an_unknown_node_never_drains():
    assert why_not_drain(parse_status(status(THREE, quorum="false")), "node1", (), 0) == "no_quorum"
    assert why_not_drain(parse_status(status(THREE)), "node9", (), 0) == "node_unknown"


def attributes(name, value):
    return f'<node name="{name}"><attribute name="{READY}" value="{value}"/></node>'


@pytest.mark.parametrize("method", list(DrainMethod))
def test_a_named_node_is_ready_when_marked_empty_settled_and_done_with_this_event(method):
    settings_ = Pacemaker(method=method)
    marked = (
        node("node2", health="red")
        if method is DrainMethod.HEALTH
        else node("node2", standby="true")
    )
    ready = status([node("node1"), marked], attributes=attributes("node2", "E1"))
    assert is_ready(parse_status(ready), "node2", settings_, "E1")
    assert not is_ready(parse_status(ready), "node2", settings_, "E2"), "done with another event"
    unmarked = status([node("node1"), node("node2")], attributes=attributes("node2", "E1"))
    assert not is_ready(parse_status(unmarked), "node2", settings_, "E1")
    busy = status(
        [node("node1"), marked], resource("d1", ["node2"]), attributes=attributes("node2", "E1")
    )
    assert not is_ready(parse_status(busy), "node2", settings_, "E1")
    assert not is_ready(parse_status(ready), "vm-not-in-the-cluster", settings_, "E1")


def test_the_drain_is_kept_in_the_state_file(tmp_path):
    store = StateStore(tmp_path)
    store.lock()
    try:
        store.save({"E1": Tracked(event(), Phase.DRAINING, drain=Drain.ASKED)})
        loaded, problem = store.load()
    finally:
        store.unlock()
    assert problem == ""
    assert loaded["E1"].drain is Drain.ASKED


def test_the_fuzzers_crm_mon_seed_is_read_as_pacemaker_2_1_writes_it():
    """The seed tests/fuzz.py starts from is a real reading (trimmed), so it must parse."""
    text = (Path(__file__).parents[1] / "seeds" / "cluster" / "crm_mon.xml").read_text()
    view = parse_status(text)
    assert view.quorate
    assert view.active == {"node2": ("d1",), "node3": ("d2",)}
    assert view.moving == ("d2",)
    assert view.attributes == {"node2": {READY: "E1"}}
    assert why_not_drain(view, "node1", (), 1) is None
    assert why_not_drain(view, "node1", (), 2) == "too_few_healthy", "node3 is offline"
