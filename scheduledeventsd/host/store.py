"""What the daemon knows about each event, kept in one JSON file written atomically.

Each change of phase is written (temp file, fsync, rename, fsync of the directory) right after
the step that made it, so a restart does not re-run the hooks of an event already handled.
The guarantee is at least once: hooks cut off, or finished but not yet recorded, run again;
an approval may be posted twice (IMDS answers 200 for an event already approved). A state
directory that cannot be written or read does not stop the daemon: the caller keeps handling
events and reports itself degraded.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from ..config import DrainMethod
from ..engine import ClusterMark, Known, Tracked
from ..engine.gates import onward
from ..engine.lifecycle import DURABLE, PREPARED, Drain, Phase, Rule, Slot, Stage
from ..model import iso_utc, parse_event, parse_not_before
from . import lock

STATE_FILE = "state.json"
STATUS_FILE = "status.json"
_VERSION = 2  # 2 keeps each event's VM name, incarnation and stage; 1 is still read
# Phases added since the release that first wrote version 2, written as the phase that release
# reads the same way (`rebooted`: prepared on an older boot, as `interrupted` is), so a rollback
# to it keeps the state; `newer_phase` beside it gives this release (and the next) the phase
# back. A daemon reads `newer_phase` only if it knows that phase, else it uses `phase`.
# `gated` (a gate added since) is written as `waiting`: that release places it again from the
# next document and its start instant enters the gates it knows.
_WRITTEN_AS = {Phase.REBOOTED: Phase.INTERRUPTED, Phase.GATED: Phase.WAITING}
# A restore asked for (its after-hooks waiting for the answer) reads after a restart as what it
# means then, a node still marked for an event that is over (asked again): as older versions do.
_DRAIN_WRITTEN_AS = {Drain.RESTORING: Drain.DONE}


class StateError(Exception):
    """The state directory is in use by another daemon."""


def unsafe_state_dir(directory: Path, owners: Iterable[int] = ()) -> str:
    """Why the daemon's user cannot trust `directory` with its state ("" when it can, or when it
    does not exist yet: the daemon makes it 0700): whoever else can write the state can make an
    event's hooks be skipped. `run` refuses such a directory and `check-config` says so; `owners`
    are other users trusted to own it (check-config run by an operator: root, the service's)."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return ""
    except OSError:
        return ""  # not readable here: `run` reports it as it finds it (state_degraded)
    if st.st_uid not in (os.geteuid(), *owners) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"{directory} is owned by uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}: only the daemon's own user may write its state "
            f"(chown {os.geteuid()} and chmod 700 it)"
        )
    return ""


class StateStore:
    def __init__(self, directory: Path, *, read_only: bool = False) -> None:
        """`read_only` (a dry run beside the service): a bad file is reported, never moved."""
        self.path = directory / STATE_FILE
        self.read_only = read_only
        self._lock: lock.Held | None = None
        self._saved: tuple[Known, Optional[ClusterMark]] | None = None
        self.cluster_mark: Optional[ClusterMark] = None  # as `load` found it
        self.mark_unrecorded = False  # an older file, with a node drained for an event
        self.repaired: tuple[str, ...] = ()  # what `load` dropped to read the file (state_repaired)

    def lock(self) -> str:
        """Two daemons on one state directory would both run every hook: refuse the second,
        whatever the directory's condition (lock.py). And one that others can write: whoever
        can write the state can make hooks be skipped. Returns why the directory cannot be
        written ("" if it can): the daemon runs on, degraded, holding the lock all the same."""
        made = ""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            made = f"{self.path.parent}: cannot lock or create: {e}"
        unsafe = unsafe_state_dir(self.path.parent)
        if unsafe:
            raise StateError(unsafe)
        try:
            self._lock, problem = lock.acquire(self.path.parent)
        except lock.InUseError as e:
            raise StateError(str(e)) from None
        return made or problem

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def load(self) -> tuple[Known, str]:
        """What was saved, and why it could not be used if so (then it starts empty).

        An absent file is a first start; one that cannot be decoded is moved aside for
        inspection, never deleted.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}, ""
        except IsADirectoryError:
            return {}, self._move_aside("is a directory")
        except UnicodeDecodeError as e:
            return {}, self._move_aside(f"not UTF-8: {e.reason}")
        except OSError as e:
            # Unreadable is not absent: the first save must not overwrite what it may hold.
            return {}, self._move_aside(f"cannot read: {e.strerror or e}")
        repairs: list[str] = []
        try:
            raw = json.loads(text)
            known, mark = _decode(raw, repairs), _decode_mark(raw)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            return {}, self._move_aside(str(e) or type(e).__name__)
        # Repaired: the next save writes what was read, not the file as it was.
        self._saved = (known, mark) if not repairs else None
        self.cluster_mark, self.repaired = mark, tuple(repairs)
        self.mark_unrecorded = "cluster_mark" not in raw and any(
            t.drain in (Drain.ASKED, Drain.DONE) for t in known.values()
        )
        return known, ""

    def _move_aside(self, problem: str) -> str:
        if self.read_only:
            return f"{self.path}: {problem}; left as it is (dry run)"
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        aside = self.path.with_name(f"{STATE_FILE}.corrupt-{stamp}")
        try:
            os.replace(self.path, aside)
        except OSError as e:
            return f"{self.path}: {problem}; could not move it aside: {e}"
        return f"{self.path}: {problem}; moved to {aside}, starting with no state"

    def save(self, known: Known, mark: Optional[ClusterMark] = None) -> None:
        """Write `known` (the engine chose what is durable) and the cluster mark this daemon
        set, unless it is what was last written; raise OSError if it cannot."""
        durable = (dict(known), mark)
        if self._saved is not None and durable == self._saved:
            return
        encoded = _encode(durable[0])
        encoded["cluster_mark"] = (  # null: none (absent: a file from before marks were kept)
            None if mark is None else {"method": mark.method.value, "attribute": mark.attribute}
        )
        data = json.dumps(encoded, indent=1, sort_keys=True).encode()
        write_atomically(self.path, data, durable=True)
        self._saved = durable

    def save_status(self, document: Mapping[str, Any]) -> None:
        """The status document, for `scheduledeventsd status` without HTTP: atomic, but not
        fsynced (it is rewritten within a minute, and a crash makes it stale, not wrong)."""
        data = json.dumps(document, indent=1, sort_keys=True).encode()
        write_atomically(self.path.with_name(STATUS_FILE), data, durable=False)


def daemon_running(directory: Path) -> Optional[bool]:
    """Whether a daemon holds `directory`'s lock (None: cannot tell, e.g. not root)."""
    try:
        return lock.held(directory)
    except OSError:
        return None


def read_status(directory: Path) -> dict[str, Any]:
    """What the daemon last wrote to `directory`/status.json; OSError or ValueError if none."""
    raw = json.loads((directory / STATUS_FILE).read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError("not a status document")
    return raw


def write_atomically(path: Path, data: bytes, *, durable: bool, mode: Optional[int] = None) -> None:
    """Readers see the old file or the new one, never half of one (temp file, rename); with
    `durable`, both the data and the rename are fsynced. The temp file has an unpredictable
    name and is created exclusively (mkstemp: O_EXCL, so never through a symlink someone
    planted in a directory they own), and its mode is set on the descriptor, not by path.
    `mode` defaults to 0600 for durable state, 0644 otherwise (whatever the umask)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode if mode is not None else 0o600 if durable else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _encode(known: Mapping[str, Tracked]) -> dict[str, Any]:
    return {
        "version": _VERSION,
        "events": [
            {
                "phase": _WRITTEN_AS.get(t.phase, t.phase).value,
                **({"newer_phase": t.phase.value} if t.phase in _WRITTEN_AS else {}),
                "event": t.event.to_json(),
                "boot_id": t.boot_id,
                "rule": t.rule.value,
                "stage": t.stage.value,
                "slot": t.slot.value,
                "drain": _DRAIN_WRITTEN_AS.get(t.drain, t.drain).value,
                "provider": t.event.provider,
                "notice": t.event.notice,
                "vm_name": t.vm_name,
                "incarnation": t.incarnation,
                "prepared": t.prepared,
                **({"gates": dict(t.gates)} if t.gates else {}),  # every other gate's slice
                **({"gated": t.gated} if t.gated else {}),  # the gate that holds it
                **({"left": True} if t.left else {}),  # left, its stage owed (returned)
                **({"unmarking": True} if t.unmarking else {}),  # put back: its undo waits
                # the NotBefore it was prepared for, which may have moved since (postponed)
                **({"prepared_for": iso_utc(t.prepared_for)} if t.prepared_for else {}),
            }
            for t in known.values()
        ],
    }


def _decode_mark(raw: dict[str, Any]) -> Optional[ClusterMark]:
    """The Pacemaker mark this daemon set and has not taken off yet (absent: none)."""
    entry = raw.get("cluster_mark")
    if entry is None:
        return None
    attribute = entry["attribute"]
    if not isinstance(attribute, str):
        raise TypeError("cluster_mark.attribute must be a string")
    return ClusterMark(DrainMethod(entry["method"]), attribute)


def _readable_gates(
    event_id: str, gates: dict[str, str], phase: Phase, gated: str, repairs: list[str]
) -> tuple[dict[str, str], Phase, str]:
    """A gate's slice in a state no step can read (a gate the engine knows, a state its table
    does not have: hand-edited, or another release's) is dropped here, at the edge, and said in
    `repairs`, never raised in a step; an event that gate held waits again, placed by the next
    document, as a release without the gate reads it (_WRITTEN_AS). Unknown gates are kept."""
    kept = dict(gates)
    for name, value in gates.items():
        states = onward.states_of(name)
        if states is None or value in states:
            continue
        del kept[name]
        shown = ", ".join(repr(s) for s in sorted(states) if s)
        repair = f"{event_id}: gates.{name}: {value[:40]!r} is not a state of that gate ({shown})"
        if phase is Phase.GATED and gated == name:
            phase, gated = Phase.WAITING, ""
            repair += "; the event it held waits again, placed by the next document"
        repairs.append(f"{repair}; dropped")
    return kept, phase, gated


def _flag(entry: dict[str, Any], key: str) -> bool:
    """A true-or-false field of an event, false where an older file has none."""
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise TypeError(f"{key} must be true or false")
    return value


def _decode(raw: Any, repairs: Optional[list[str]] = None) -> Known:  # noqa: ANN401 - file contents
    """The events saved; what had to be repaired to read them is added to `repairs`."""
    repairs = [] if repairs is None else repairs
    version = raw.get("version") if isinstance(raw, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > _VERSION:
        raise ValueError(
            f"a version {version} state file, written by a newer scheduledeventsd "
            f"(this one reads versions 1 to {_VERSION})"
        )
    if version not in (1, _VERSION):
        raise ValueError(f"not a version 1 or {_VERSION} state file")
    known: dict[str, Tracked] = {}
    for entry in raw["events"]:
        event = parse_event(entry["event"])
        provider, notice = entry.get("provider", "azure"), entry.get("notice", "")
        if not isinstance(provider, str) or not isinstance(notice, str):
            raise TypeError("provider and notice must be strings")
        event = replace(event, provider=provider, notice=notice)
        boot, name = entry.get("boot_id", ""), entry.get("vm_name", "")
        incarnation = entry.get("incarnation", 0)
        if not isinstance(boot, str) or not isinstance(name, str):
            raise TypeError("boot_id and vm_name must be strings")
        if isinstance(incarnation, bool) or not isinstance(incarnation, int):
            raise TypeError("incarnation must be an integer")
        gates = entry.get("gates", {})  # absent before there were gates of this kind
        if not isinstance(gates, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in gates.items()
        ):
            raise TypeError("gates must map each gate's name to its state")
        gated = entry.get("gated", "")
        if not isinstance(gated, str):
            raise TypeError("gated must be a gate's name")
        newer = entry.get("newer_phase")
        known_phases = {p.value for p in Phase}
        phase = Phase(newer if newer in known_phases else entry["phase"])
        if phase not in DURABLE:
            raise ValueError(f"phase {phase.value} is never stored")
        gates, phase, gated = _readable_gates(event.event_id, gates, phase, gated, repairs)
        prepared = entry.get("prepared", phase in PREPARED)  # older files: as its phase says
        if not isinstance(prepared, bool):
            raise TypeError("prepared must be true or false")
        left = _flag(entry, "left")  # absent in older files: it had not left
        unmarking = _flag(entry, "unmarking")  # absent in older files: its undo did not wait
        prepared_for = entry.get("prepared_for", "")  # absent in older files: its NotBefore
        if not isinstance(prepared_for, str):
            raise TypeError("prepared_for must be a time")
        known[event.event_id] = Tracked(
            event,
            phase,
            boot_id=boot,
            rule=Rule(entry.get("rule", "")),
            stage=Stage(entry.get("stage", "before")),
            slot=Slot(entry.get("slot", "")),
            drain=Drain(entry.get("drain", "")),
            vm_name=name,
            incarnation=incarnation,
            prepared=prepared,
            prepared_for=parse_not_before(prepared_for),
            gates=tuple(sorted((k, v) for k, v in gates.items() if v)),
            gated=gated,
            left=left,
            unmarking=unmarking,
        )
    return known
