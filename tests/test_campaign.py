"""The crash campaign, short (50 kills) for every test run; `make crash-campaign` runs 500.

What each kill may break, and the invariants checked afterwards, are in tests/campaign.py.
"""

from __future__ import annotations

import os

import pytest

from tests.campaign import Campaign

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
