"""What a key of the configuration is: its kind and its declaration (schema.py declares them all).

The kind selects how the walker checks a value (walker.py) and how the reference names it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Union

# A documented default: YAML-shaped data (what the shipped file shows), never a Python object.
Value = Union[None, bool, int, float, str, list["Value"], dict[str, "Value"]]


class Kind(str, enum.Enum):
    """What a key holds, as the reference names it."""

    SECTION = "mapping of the keys below"
    SECTIONS = "mapping of the keys below, or a list of such mappings"
    NAMED = "mapping of names you choose"
    LIST = "list"
    SECONDS = "seconds"
    WHOLE = "whole number"
    TEXT = "string"
    CHOICE = "one of"
    PATH = "absolute path"
    URL = "URL"
    ARGV = "argv list"
    HOOK_NAMES = "list of hook names"
    ADDRESS = "ADDRESS:PORT"
    BOOL = "true or false"
    CLOCK = "HH:MM"


@dataclass(frozen=True)
class Key:
    """One key. `path` spells a place as the reference shows it: `NAME`/`TYPE` stand for a name
    you choose, `[]` for any item of a list (`hooks.NAME[].timeout`, `webhooks[].url`)."""

    path: str
    kind: Kind
    doc: str
    default: Value = None
    low: Optional[float] = None
    high: Optional[float] = None
    choices: tuple[tuple[str, str], ...] = ()  # (value, what it means)
    example: Optional[str] = None  # for a key whose default is empty: a value worth showing
    required: bool = False  # within its section, when the section is given
    default_text: Optional[str] = None  # a default that is not a value (e.g. "as after")

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def pattern(self) -> str:
        """The path with every chosen name and list item as `*` (`hooks.*.timeout`)."""
        parts = []
        for part in self.path.split("."):
            name = part.removesuffix("[]")
            if name in ("NAME", "TYPE"):
                parts.append("*")
            else:
                parts += [name, "*"] if part.endswith("[]") else [name]
        return ".".join(parts)

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(value for value, _ in self.choices)
