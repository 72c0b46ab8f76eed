"""One daemon per state directory, whatever the directory's condition: two would both run every
hook and both approve. The lock is an exclusive flock, taken on the first of these that opens:

1. `lock` in the directory, made 0600 (as every release did): no other user can open it, so
   no one can hold it to keep the daemon off;
2. that file opened read-only, when it cannot be made or written (a file system remounted
   read-only): flock needs no write access;
3. the directory itself, an O_RDONLY|O_DIRECTORY descriptor (a read-only file system with no
   `lock` in it yet): it is the directory's inode that is locked, so a bind mount or another
   mount namespace of the same directory meets the same lock;
4. the nearest directory above it that exists, when it does not exist and cannot be made:
   there is no state to keep, but hooks would still run twice.

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


class InUseError(Exception):
    """Another daemon holds the lock."""


def acquire(directory: Path) -> tuple[int, str]:
    """A descriptor holding the lock that stands for `directory`, and why the lock file could
    not be made or opened for writing ("" when it could: the directory is healthy). InUseError if
    another daemon holds it; OSError if nothing on the way could be opened."""
    fd, problem = _open(directory)
    for attempt in range(LOCK_TRIES):  # `status` may hold it for an instant (daemon_running)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if attempt == LOCK_TRIES - 1:
                os.close(fd)
                raise InUseError(f"{directory} is in use by another scheduledeventsd") from None
            time.sleep(0.1)
        except OSError:
            os.close(fd)
            raise
        else:
            return fd, problem
    raise AssertionError("unreachable")  # pragma: no cover


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


def _open(directory: Path) -> tuple[int, str]:
    path = directory / LOCK_FILE
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), ""
    except OSError as e:
        problem = f"{directory}: cannot lock or create: {e}"
        failed = e
    with_file = [(path, os.O_RDONLY)]
    above = [p for p in (directory, *directory.parents) if p.is_dir()][:1]
    for candidate, flags in [*with_file, *((p, os.O_RDONLY | os.O_DIRECTORY) for p in above)]:
        try:
            return os.open(candidate, flags | os.O_CLOEXEC), problem
        except OSError:
            continue
    raise failed
