"""A per-event machine's declared table, as `lifecycle` declares the phase's: (state, trigger) ->
the states it may move to, each row with one line for the docs.

The gates (gates/slot, gates/drain) each declare one and change their slice of an event only
through `Table.move`, so a move the table does not declare raises `IllegalTransitionError`, as a
phase move does; docs/lifecycle.py draws every table into the README, the man page and the SVG.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .lifecycle import IllegalTransitionError

S = TypeVar("S", bound=enum.Enum)
T = TypeVar("T", bound=enum.Enum)


@dataclass(frozen=True)
class Row(Generic[S, T]):
    sources: tuple[S, ...]
    on: T
    target: S
    does: str


@dataclass(frozen=True)
class Table(Generic[S, T]):
    """One machine's declared moves. `name` is the Tracked field it keeps (slot, drain)."""

    name: str
    what: str  # one line: what the machine is, for the docs
    rows: tuple[Row[S, T], ...]
    moves: Mapping[tuple[S, T], frozenset[S]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        moves: dict[tuple[S, T], frozenset[S]] = {}
        for r in self.rows:
            for source in r.sources:
                moves[(source, r.on)] = moves.get((source, r.on), frozenset()) | {r.target}
        object.__setattr__(self, "moves", moves)

    def check(self, source: S, on: T, target: S) -> None:
        """Raise unless the table declares `source --on--> target`."""
        targets = self.moves.get((source, on))
        if targets is None:
            raise IllegalTransitionError(
                f"{self.name} {_shown(source)}: nothing is declared for {on.value!r}"
            )
        if target not in targets:
            allowed = ", ".join(sorted(_shown(t) for t in targets))
            raise IllegalTransitionError(
                f"{self.name} {_shown(source)} --{on.value}--> {_shown(target)}: only to {allowed}"
            )


def _shown(state: enum.Enum) -> str:
    return str(state.value) or "none"


def row(sources: Iterable[S], on: T, target: S, does: str) -> Row[S, T]:
    return Row(tuple(sources), on, target, does)


# ---- what is generated from a table (docs/lifecycle.py, beside the phase's) ---------------


def markdown(table: Table[S, T]) -> str:
    """The table as the README shows it, under the phase's."""
    lines = [
        f"The `{table.name}` gate: {table.what}.",
        "",
        f"| {table.name} | what happened | next | what the daemon does |",
        "|---|---|---|---|",
    ]
    for r in table.rows:
        sources = ", ".join(f"`{_shown(s)}`" for s in r.sources)
        lines.append(f"| {sources} | {r.on.value} | `{_shown(r.target)}` | {r.does} |")
    return "\n".join(lines)


def troff(table: Table[S, T]) -> str:
    """The table as the man page shows it: one paragraph per row."""
    out = [f".TP\n.B {table.name} gate\n{table.what}."]
    for r in table.rows:
        sources = ", ".join(_shown(s) for s in r.sources)
        out.append(f".br\n{sources}: {r.on.value} \\(-> {_shown(r.target)}: {r.does}")
    return "\n".join(out)


def dot(table: Table[S, T]) -> str:
    """The table as a Graphviz cluster, drawn beside the phase's in docs/lifecycle.svg."""
    name = table.name
    lines = [f"  subgraph cluster_{name} {{", f'    label="{name} gate"; fontsize=10;']
    states = dict.fromkeys(s for r in table.rows for s in (*r.sources, r.target))
    for s in states:
        lines.append(f'    {name}_{_shown(s)} [label="{_shown(s)}"];')
    edges: dict[tuple[str, str], list[str]] = {}
    for r in table.rows:
        for s in r.sources:
            edges.setdefault((_shown(s), _shown(r.target)), []).append(r.on.value)
    for (source, target), ons in edges.items():
        label = "\\n".join(dict.fromkeys(ons))
        lines.append(f'    {name}_{source} -> {name}_{target} [label="{label}", fontsize=8];')
    lines.append("  }")
    return "\n".join(lines)
