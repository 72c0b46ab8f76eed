"""The soak, short (two minutes) for every test run; `make soak` runs an hour (tests/soak.py).

It runs beside the campaigns and the Pacemaker cluster (`make test`'s second pytest, a worker
of its own), not after them: one daemon polling once a second uses about 2 % of a core over
the two minutes (measured: 2.5 s of CPU for pytest, the daemon and its hooks together), and
nothing it asserts is a time limit that load could break (the last two events of ours are not
counted, five seconds are left for the rest). Marker `soak`: `-m "not soak"` leaves it out.
"""

from __future__ import annotations

import pytest

from tests.soak import soak

pytestmark = pytest.mark.soak


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
