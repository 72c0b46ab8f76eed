"""The crash campaign, short (50 kills) for every test run; `make crash-campaign` runs 500.

What each kill may break, and the invariants checked afterwards, are in tests/campaign.py.
"""

from __future__ import annotations

import os

import pytest

from tests.campaign import Campaign, FleetCampaign
from tests.etcd_cluster import Cluster
from tests.soak import soak

pytestmark = [pytest.mark.campaign, pytest.mark.xdist_group(name="campaign")]


@pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and bind mounts need root")
def test_fifty_kills_lose_and_double_nothing(tmp_path):
    seed = int.from_bytes(os.urandom(2), "big")
    report = Campaign(tmp_path, seed=seed).run(kills=50)
    summary = dict(report.summary(), seed=seed)  # `python -m tests.campaign --seed` replays it
    assert report.violations == [], summary
    assert report.kills >= 50
    assert len(report.killed_after) >= 4, f"kill moments too few to mean much: {summary}"
    assert report.approvals, summary
    assert report.after_runs, summary
    assert report.cancelled_runs, summary
    assert report.reboots, summary


def test_two_minutes_of_churn_with_everything_on_leak_nothing_and_miss_nothing(tmp_path):
    result = soak(120, tmp_path, every=5.0)
    summary = result.summary()
    assert result.missed == [], summary
    assert result.doubled == [], summary
    assert len(result.ours) >= 20, summary
    assert result.webhooks >= len(result.ours) - 3, summary
    warm, last = result.samples[len(result.samples) // 2], result.samples[-1]
    assert last.fds <= warm.fds + 2, summary
    assert last.threads <= warm.threads + 2, summary
    assert last.rss_mb - warm.rss_mb < 3, summary


@pytest.mark.skipif(os.geteuid() != 0, reason="namespaces and bind mounts need root")
def test_twenty_kills_among_three_vms_sharing_events_never_rush_one(tmp_path):
    seed = int.from_bytes(os.urandom(2), "big")
    with Cluster(tmp_path / "etcd") as cluster:
        report = FleetCampaign(tmp_path, seed, cluster).run(kills=20)
    summary = dict(report.summary(), seed=seed)
    assert report.violations == [], summary
    assert report.approvals >= 3, summary
    assert report.events["failing"] or report.events["shared"], summary
