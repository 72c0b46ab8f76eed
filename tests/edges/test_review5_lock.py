"""Review of fix/trust (e3eb381): the single-instance lock (host/lock.py) stands on different
inodes depending on the directory's condition when each daemon started. A daemon that locked
the directory itself (read-only, no lock file) or the directory above (state_dir not there yet)
does not keep off a second daemon started once the lock file can be made. Each defect is an
xfail(strict) test."""

from __future__ import annotations

import fcntl
import os

import pytest

from scheduledeventsd.host.store import StateError, StateStore


@pytest.mark.xfail(
    strict=True,
    reason="review5: the first daemon holds the directory's inode (read-only then), the second "
    "(the file system writable again) makes `lock` and holds that: two daemons",
)
def test_a_daemon_holding_the_directory_keeps_off_one_that_can_make_the_lock_file(tmp_path):
    first = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # what acquire() holds, case 3
    try:
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _refused(StateStore(tmp_path))
    finally:
        os.close(first)


@pytest.mark.xfail(
    strict=True,
    reason="review5: the first daemon holds the directory above (state_dir could not be made); "
    "once state_dir exists, the second locks its lock file: two daemons",
)
def test_a_daemon_holding_the_directory_above_keeps_off_one_started_once_it_exists(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    first = StateStore(blocker / "state")
    assert "cannot lock or create" in first.lock()  # holds tmp_path
    try:
        blocker.unlink()
        (blocker / "state").mkdir(parents=True)  # the admin (or StateDirectory=) makes it
        _refused(StateStore(blocker / "state"))
    finally:
        first.unlock()


def _refused(second: StateStore) -> None:
    try:
        with pytest.raises(StateError, match="in use by another"):
            second.lock()
    except BaseException:
        second.unlock()  # it took a lock: not left held for the next test
        raise
