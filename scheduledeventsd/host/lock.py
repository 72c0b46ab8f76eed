"""One daemon per state directory, whatever the directory's condition: two would both run every
hook and both approve. Every daemon takes, exclusive unless said, each of these that it can:

1. `lock` in the directory, made 0600 (as every release did), or opened read-only when it
   cannot be made or written (a file system remounted read-only: flock needs no write access).
   No other user can open it, so its lock is never a stranger's;
2. the directory's own inode (an O_RDONLY|O_DIRECTORY descriptor), shared when (1) is held,
   exclusive when it is not (a read-only file system with no `lock` in it yet): so a daemon that
   could make `lock` still meets one that started when it could not. An inode, so a bind mount
   or another mount namespace of the same directory meets the same lock;
3. when the directory does not exist and cannot be made: the nearest directory above it that
   exists. There is no state to keep, but hooks would still run twice. A daemon started once the
   directory exists meets it there: it refuses to start while a process of its own user holds
   an exclusive flock on a directory above its state directory (/proc/locks).

A directory's lock can be taken by anyone who can open the directory (a state directory others
can read, /var/lib): one still held after the retries by no process of the daemon's user
(/proc/locks: `FLOCK ... pid maj:min:inode`, the uid from /proc/PID/status; a pid gone or not
visible is not ours) is a stranger's and is passed over, so no other user can keep the daemon
off. The prices, both in degraded cases only: on a read-only directory with no `lock`, such a
stranger leaves the daemon with no lock; a process of the daemon's own user holding an
exclusive flock above the state directory (a daemon whose state directory is above this one,
read-only) keeps it off. Not a fixed-path lock in /run: it needs root (or a RuntimeDirectory=
per unit), a name per state directory, and would not meet across mount namespaces.

flock, not fcntl (POSIX) locks: an exclusive fcntl lock needs a descriptor open for writing,
and closing any other descriptor of the file in the process drops it; a flock belongs to its
open file, read-only or not.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_FILE = "lock"
LOCK_TRIES = 10  # 0.1 s apart
LOCKS = Path("/proc/locks")


class InUseError(Exception):
    """Another daemon holds the lock."""


class Held:
    """The descriptors holding the lock of one state directory: closed together."""

    def __init__(self, fds: list[int]) -> None:
        self.fds = fds

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


def acquire(directory: Path) -> tuple[Held, str]:
    """The descriptors holding the lock that stands for `directory`, and why the lock file could
    not be made or opened for writing ("" when it could: the directory is healthy). InUseError if
    another daemon holds it; OSError if nothing on the way could be opened."""
    held = Held([])
    try:
        problem = _take_all(directory, held)
    except BaseException:
        held.close()
        raise
    return held, problem


def _take_all(directory: Path, held: Held) -> str:
    path, problem, failed = directory / LOCK_FILE, "", None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        problem, failed = f"{directory}: cannot lock or create: {e}", e
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
    if fd >= 0:
        held.fds.append(fd)
        _take(directory, fd, fcntl.LOCK_EX, stranger_may_hold=False)
    below = [p for p in (directory, *directory.parents) if p.is_dir()][:1]
    if not below:
        raise failed or FileNotFoundError(f"{directory}: no directory above it")
    try:
        dir_fd = os.open(below[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        if fd >= 0:
            return problem
        raise failed or OSError(f"{directory}: cannot open") from None
    held.fds.append(dir_fd)
    mode = fcntl.LOCK_SH if fd >= 0 else fcntl.LOCK_EX
    _take(directory, dir_fd, mode, stranger_may_hold=True)
    for above in below[0].parents:  # a daemon started before `directory` could be made
        if _held_by_us(above, exclusive_only=True):
            raise InUseError(f"{directory} is in use by another scheduledeventsd (holds {above})")
    return problem


def _take(directory: Path, fd: int, mode: int, *, stranger_may_hold: bool) -> None:
    """Flock `fd`, waiting out `status` (it holds a shared lock for an instant, maybe as an
    operator who can read the directory); a lock that only strangers still hold then is passed
    over where they may hold it (see the module's docstring)."""
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if attempt < LOCK_TRIES - 1:
                time.sleep(0.1)
            elif stranger_may_hold and not _held_by_us(fd, exclusive_only=False):
                return
            else:
                raise InUseError(f"{directory} is in use by another scheduledeventsd") from None
        else:
            return
    raise AssertionError("unreachable")  # pragma: no cover


def _held_by_us(target: Path | int, *, exclusive_only: bool) -> bool:
    """Whether /proc/locks shows a flock on `target`'s inode held by a process of our user.
    Unreadable /proc/locks: assume so (refusing beats two daemons). A directory above is
    matched on device and inode; the directory we are blocked on by inode alone (btrfs shows a
    subvolume's device in stat, not the one /proc/locks prints)."""
    try:
        st = os.stat(target)
        text = LOCKS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return True
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:"
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "->": a waiter, not a holder
            continue
        exact = fields[5] == f"{device}{st.st_ino}"
        if not (exact or (not exclusive_only and fields[5].endswith(f":{st.st_ino}"))):
            continue
        if exclusive_only and fields[3] != "WRITE":
            continue
        if _euid(fields[4]) == os.geteuid():
            return True
    return False


def _euid(pid: str) -> int | None:
    """The effective uid of `pid` from its status (the owner of its /proc files is root once it
    made itself undumpable: a stranger could pass for root), None if gone or not visible."""
    try:
        with open(f"/proc/{int(pid)}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
    return None


def held(directory: Path) -> bool:
    """Whether a daemon holds the lock of `directory` (a shared, non-blocking try, released at
    once; the daemon's own lock waits out such a moment). OSError: cannot tell."""
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # a daemon on a read-only directory locks the directory
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
