"""What only this machine can say about a path the configuration names: a program root will
run (its file and every directory above it private to root; the configuration file itself,
which says what runs, too), a secret readable by root alone, a directory to write into.
Skipped with `check_files=False` (the documented defaults on a machine without them)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from .walker import Checker


def check_executable(c: Checker, where: str, path: str) -> str:
    """The path to run: the real file behind any symlink, checked, with every directory above
    it, so that no one but root can replace what was checked before it runs."""
    if not os.path.isabs(path):
        c.fail(where, f"must be an absolute path (no PATH lookup, no shell), got {path!r}")
        return path
    if not c.check_files:
        return path
    return check_trusted(c, where, path, executable=True)


def check_argument(c: Checker, where: str, arg: str) -> str:
    """An argument naming an existing file (`[/usr/bin/python3, /opt/app/drain.py]`) is code
    root runs as much as argv[0]: checked the same way, and the checked real file is passed."""
    if not c.check_files or not os.path.isabs(arg) or not os.path.isfile(arg):
        return arg
    return check_trusted(c, where, arg, executable=False)


def check_trusted(c: Checker, where: str, path: str, *, executable: bool) -> str:
    real, problem = untrusted(path, executable=executable)
    if problem:
        c.fail(where, problem)
    return real


HOOK = ("the hook", "the daemon runs it as root")
CONFIG = ("the configuration", "it says what the daemon runs as root")


def untrusted(
    path: str, *, executable: bool = False, what: tuple[str, str] = HOOK
) -> tuple[str, str]:
    """The real file behind `path` and why root cannot trust it ("" when it can): someone
    other than root (or the daemon's own user) could change it, or replace it through a
    directory on its way. `what` names the file and why it matters, for the problem's text."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        return path, f"{path}: {e.strerror.lower() if e.strerror else e}"
    shown = path if real == os.path.abspath(path) else f"{path} (-> {real})"
    if not stat.S_ISREG(st.st_mode):
        return real, f"{shown}: not a regular file"
    if executable and not os.access(real, os.X_OK):
        return real, f"{shown}: not executable"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return real, f"{shown}: writable by group or others; {what[1]}"
    if st.st_uid not in (0, os.geteuid()):
        return real, f"{shown}: owned by uid {st.st_uid}, not root; {what[1]}"
    given = os.path.abspath(path)  # a link: whoever can write its directory can repoint it
    linked = untrusted_directories(given, what) if given != real else ""
    return real, untrusted_directories(real, what) or linked


def untrusted_directories(real: str, what: tuple[str, str] = HOOK) -> str:
    """Whoever can write a directory on the path can swap the file for their own. A
    root-owned sticky directory (/tmp) is fine: others cannot replace root's entry in it."""
    for directory in reversed(Path(real).parents):
        try:
            st = os.stat(directory)
        except OSError as e:
            return f"{directory}: {e.strerror.lower() if e.strerror else e}"
        if st.st_uid not in (0, os.geteuid()):
            return (
                f"{real}: its directory {directory} is owned by uid {st.st_uid}, who could "
                f"replace {what[0]}; {what[1]}"
            )
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and not st.st_mode & stat.S_ISVTX:
            return (
                f"{real}: its directory {directory} is writable by group or others, who could "
                f"replace {what[0]}; {what[1]}"
            )
    return ""


def check_state_dir(c: Checker, text: str) -> Path:
    """A state directory that exists as something else (a file) can hold neither the state
    nor its lock: refused here, not run on without either. Absent: the daemon makes it;
    unreadable or read-only: the daemon runs degraded (a disk fault, not a config error)."""
    path = Path(text)
    if c.check_files and os.path.lexists(path) and not path.is_dir():
        c.fail(
            "state_dir", f"{path}: not a directory; the daemon keeps its state and its lock in it"
        )
    return path


def check_textfile(c: Checker, text: Optional[str]) -> Optional[Path]:
    """An absolute path (checked by its kind) the daemon replaces as root: a .prom file in an
    existing directory, never a symbolic link."""
    if text is None:
        return None
    where = "metrics_textfile"
    path = Path(text)
    if path.suffix != ".prom":
        c.fail(
            where,
            f"must be an absolute path ending in .prom (node_exporter reads no other), "
            f"got {text!r}",
        )
        return None
    if c.check_files and not path.parent.is_dir():
        c.fail(where, f"{path.parent}: no such directory")
    elif c.check_files and path.is_symlink():
        c.fail(
            where,
            f"{path} is a symbolic link: the daemon writes as root and replaces the file, so "
            "it must be a plain file (or absent)",
        )
    return path


def check_readable(c: Checker, where: str, text: Optional[str], *, secret: bool) -> Optional[Path]:
    """An absolute path (checked by its kind) to a file the daemon can read; a secret must be
    private to root."""
    if text is None:
        return None
    if c.check_files:
        try:
            st = os.stat(text)
            with open(text, "rb"):
                pass
        except OSError as e:
            c.fail(where, f"{text}: {e.strerror.lower() if e.strerror else e}")
            return None
        if not stat.S_ISREG(st.st_mode):
            c.fail(where, f"{text}: not a regular file")
        elif secret and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            c.fail(where, f"{text}: readable by group or others; it holds a secret (chmod 600)")
    return Path(text)
