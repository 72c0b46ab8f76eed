"""`scheduledeventsd fleet`: the fleet view as text or JSON with its exit status, and
`fleet free VM`, an operator's free of a held slot (the reading and freeing: coordination/fleet.py).

Exit status: 0; 1 when a slot is held by a VM whose daemon is silent and whose hold ends in more
than `ttl` (a VM still down: an alert, or a slot to free); 2 when etcd cannot be read, no etcd
is configured, or a free finds nothing to free.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..config import Config, Etcd, schema

if TYPE_CHECKING:  # etcd's client (requests) only when the command runs: cli.py imports this
    from ..coordination import fleet

EXIT_DOWN = 1
EXIT_FAILED = 2
FREED = "slot_freed_by_operator"  # the name both sides log it with

Say = Callable[[str], None]


def add_parser(sub: Any, add_config: Callable[[argparse.ArgumentParser], None]) -> None:  # noqa: ANN401 - argparse's private subparsers type
    p = sub.add_parser(
        "fleet",
        help="who holds each group's slots, who waits, shared events; `fleet free VM`",
        description="Read etcd with this daemon's configuration and credentials and show, per "
        "concurrency group, its max, the VMs holding its slots (event, since, whether their "
        "daemon is alive, when the hold ends) and the VMs waiting (event, why, since), then the "
        "shared events with how many VMs are ready. `fleet free VM` frees the slots VM holds "
        "(--group: in that group only), logged as slot_freed_by_operator here and by that VM's "
        "daemon. Exit 1 if a slot is held by a VM whose daemon is silent and whose hold ends in "
        "more than ttl (a VM still down); 2 if etcd cannot be read, or the VM holds no slot.",
    )
    p.add_argument("action", nargs="?", choices=("free",), metavar="free", help="free a slot")
    p.add_argument("vm", nargs="?", metavar="VM", help="the VM whose slots are freed")
    p.add_argument("--group", metavar="GROUP", help="only this group")
    add_config(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def usage(args: argparse.Namespace) -> bool:
    """`free` and VM come together or not at all (said, when not)."""
    if (args.action is None) == (args.vm is None):
        return True
    print("error: usage: scheduledeventsd fleet [free VM] [--group GROUP]", file=sys.stderr)
    return False


def run(config: Config, args: argparse.Namespace) -> int:
    def err(line: str) -> None:
        print(line, file=sys.stderr)

    return command(config, free=args.vm, group=args.group, as_json=args.json, out=print, err=err)


def command(
    config: Config, *, free: Optional[str], group: Optional[str], as_json: bool, out: Say, err: Say
) -> int:
    """The view (`free` None) or the free of `free`'s slots; what it says goes to out/err."""
    from ..coordination import fleet  # noqa: PLC0415 - see above
    from ..coordination.etcd import EtcdError  # noqa: PLC0415

    etcd = config.coordination.etcd if config.coordination is not None else None
    if etcd is None:
        err("error: no coordination.etcd in the configuration: no fleet to show")
        return EXIT_FAILED
    try:
        if free is not None:
            return _free(etcd, free, group, as_json=as_json, out=out, err=err)
        groups = (
            {lim.group: lim.max for lim in config.concurrency.limits} if config.concurrency else {}
        )
        default_ttl = int(schema.number("concurrency.ttl"))
        ttl = config.concurrency.ttl if config.concurrency else default_ttl
        view = fleet.read(etcd, groups, ttl)
    except EtcdError as e:
        err(f"error: etcd at {', '.join(etcd.endpoints)}: {e.kind}: {e.detail}")
        return EXIT_FAILED
    if group is not None:
        view = dataclasses.replace(view, groups=tuple(g for g in view.groups if g.name == group))
    out(json.dumps(as_document(view), indent=2) if as_json else text(view))
    return EXIT_DOWN if view.down() else 0


def _free(etcd: Etcd, vm: str, group: Optional[str], *, as_json: bool, out: Say, err: Say) -> int:
    from ..coordination import fleet  # noqa: PLC0415 - see above

    freed = fleet.free(etcd, vm, group)
    if not freed:
        where = f" in group {group}" if group is not None else ""
        err(f"error: {vm} holds no slot{where}: nothing freed")
        return EXIT_FAILED
    for f in freed:
        fields = {"vm": vm, "group": f.group, "slot": f.slot, "event_id": f.event}
        if as_json:
            out(json.dumps({"event": FREED, **fields}))
        else:
            out(FREED + " " + " ".join(f"{k}={v}" for k, v in fields.items()))
    return 0


def as_document(view: fleet.View) -> dict[str, Any]:
    return {
        "ttl": view.ttl,
        "groups": [
            {
                "group": g.name,
                "max": g.max,
                "held": len(g.holders),
                "holders": [dataclasses.asdict(h) for h in g.holders],
                "waiting": [dataclasses.asdict(w) for w in g.waiting],
            }
            for g in view.groups
        ],
        "shared_events": [
            {
                "event_id": e.event_id,
                "ready": len(e.ready),
                "ready_vms": list(e.ready),
                "failed_vms": list(e.failed),
            }
            for e in view.events
        ],
        "down": [{"group": name, "vm": h.vm, "ends_in": h.ends_in} for name, h in view.down()],
    }


def _ends(seconds: Optional[int]) -> str:
    return "never (no lease)" if seconds is None else f"in {seconds}s"


def text(view: fleet.View) -> str:
    lines = []
    for g in view.groups:
        most = "?" if g.max is None else str(g.max)
        lines.append(f"group {g.name}: {len(g.holders)} of {most} slot(s) held")
        for h in g.holders:
            daemon = "alive" if h.alive else "SILENT"
            lines.append(
                f"  held    slot {h.slot}  {h.vm}  event {h.event or '?'}  since {h.since or '?'}"
                f"  daemon {daemon}  hold ends {_ends(h.ends_in)}"
            )
        for w in g.waiting:
            lines.append(
                f"  waiting {w.vm}  event {w.event or '?'}  since {w.since or '?'}: {w.why}"
            )
    if not view.groups:
        lines.append("no group: no slot held or asked for")
    for e in view.events:
        failed = f", failed: {', '.join(e.failed)}" if e.failed else ""
        lines.append(
            f"shared event {e.event_id}: {len(e.ready)} VM(s) ready"
            f" ({', '.join(e.ready) or 'none'}){failed}"
        )
    for name, h in view.down():
        lines.append(
            f"DOWN: {h.vm} holds slot {h.slot} of {name}, its daemon silent, the hold ending "
            f"{_ends(h.ends_in)} (more than ttl {view.ttl}s): a VM still down; "
            f"`scheduledeventsd fleet free {h.vm}` lets the next VM go"
        )
    return "\n".join(lines)
