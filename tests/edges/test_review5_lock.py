"""Review of fix/trust (e3eb381): the single-instance lock (host/lock.py) stands on different
inodes depending on the directory's condition when each daemon started. A daemon that locked
the directory itself (read-only, no lock file) or the directory above (state_dir not there yet)
does not keep off a second daemon started once the lock file can be made. Each defect is an
xfail(strict) test until fix/lock2, which made them pass."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from scheduledeventsd.host.store import StateError, StateStore


def test_a_daemon_holding_the_directory_keeps_off_one_that_can_make_the_lock_file(tmp_path):
    first = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)  # what acquire() holds, case 3
    try:
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _refused(StateStore(tmp_path))
    finally:
        os.close(first)


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


def test_another_users_flock_on_the_directory_above_does_not_keep_the_daemon_off():
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    if os.geteuid() != 0:
        pytest.skip("plays another user: needs root")
    above = tempfile.mkdtemp(prefix="review5-lock-")  # not under pytest's 0700 tmp: nobody reads it
    os.chmod(above, 0o755)  # noqa: S103 - the point: a directory others can open
    blocker = os.path.join(above, "file")
    Path(blocker).write_text("")
    hold = (
        f"import fcntl, os, sys, time; fd = os.open({above!r}, os.O_RDONLY | os.O_DIRECTORY); "
        "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); time.sleep(60)"
    )
    nobody = subprocess.Popen(
        ["/usr/bin/python3", "-c", hold], user=65534, group=65534, stdout=subprocess.PIPE, text=True
    )
    try:
        assert nobody.stdout is not None
        assert nobody.stdout.readline() == "held\n"
        store = StateStore(Path(blocker) / "state")
        try:
            assert "cannot lock or create" in store.lock(), "runs degraded, its own lock"
        finally:
            store.unlock()
    finally:
        nobody.kill()
        nobody.wait()
        os.unlink(blocker)
        os.rmdir(above)


def test_a_strangers_flock_on_a_readable_state_dir_neither_keeps_it_off_nor_lets_two_run():
    """The state directory's own inode is locked too (shared, beside `lock`): a state directory
    others may read (check-config allows it) can be flocked by anyone, and such a stranger's
    lock is passed over (/proc/locks: held by another uid); `lock` still keeps a second daemon
    off. The stranger makes itself undumpable (its /proc files become root's; its uid is read
    from /proc/PID/status). Guards the design: a fix that always locked the directory would
    refuse here."""
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    if os.geteuid() != 0:
        pytest.skip("plays another user: needs root")
    state = tempfile.mkdtemp(prefix="review5-lock-")  # not under pytest's 0700 tmp
    os.chmod(state, 0o755)  # noqa: S103 - the point: a state directory others can open
    hold = (
        "import ctypes, fcntl, os, sys, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # no dump
        f"fd = os.open({state!r}, os.O_RDONLY | os.O_DIRECTORY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"
    )
    nobody = subprocess.Popen(
        ["/usr/bin/python3", "-c", hold], user=65534, group=65534, stdout=subprocess.PIPE, text=True
    )
    try:
        assert nobody.stdout is not None
        assert nobody.stdout.readline() == "held\n"
        first = StateStore(Path(state))
        assert first.lock() == ""
        try:
            _refused(StateStore(Path(state)))
        finally:
            first.unlock()
    finally:
        nobody.kill()
        nobody.wait()
        for name in os.listdir(state):
            os.unlink(os.path.join(state, name))
        os.rmdir(state)
