"""The state directory's lock (host/lock.py): one daemon per directory, even when the lock
file cannot be made; `status` sees the daemon whichever way it holds it. The read-only file
system itself is played end to end (tests/system/test_trust.py)."""

from __future__ import annotations

import fcntl
import os

import pytest

from scheduledeventsd.host.store import StateError, StateStore, daemon_running


def test_a_state_dir_that_cannot_be_made_is_still_locked_against_a_second_daemon(tmp_path):
    """Under a file the directory cannot be made: the first daemon runs degraded (the problem
    returned) and holds the directory above; the second is refused. Before: the first lock
    raised NotADirectoryError and the daemon ran without any lock."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    first, second = StateStore(blocker / "state"), StateStore(blocker / "state")
    assert "cannot lock or create" in first.lock()
    with pytest.raises(StateError, match=f"{blocker / 'state'} is in use by another"):
        second.lock()
    first.unlock()
    assert second.lock()
    second.unlock()


def test_a_healthy_state_dir_is_locked_with_its_lock_file_and_no_problem(tmp_path):
    store = StateStore(tmp_path)
    assert store.lock() == ""
    assert daemon_running(tmp_path) is True
    assert oct((tmp_path / "lock").stat().st_mode & 0o777) == oct(0o600)
    store.unlock()
    assert daemon_running(tmp_path) is False


def test_status_sees_a_daemon_that_locked_the_directory_itself(tmp_path):
    """A daemon on a read-only directory with no lock file holds the directory's own inode.
    Before: `status` found no lock file and said it could not tell (None)."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert daemon_running(tmp_path) is True
    finally:
        os.close(fd)
    assert daemon_running(tmp_path) is False
