"""YAML as the configuration is read: safe, no duplicate keys, no aliases, no lone surrogates,
YAML 1.2 booleans and integers, at most MAX_FILE bytes; a constructor's own error is a problem
with its line and column, never a traceback."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from .settings import ConfigError
from .walker import bounded

_SURROGATE = re.compile("[\ud800-\udfff]")

MAX_FILE = 1 << 20  # bytes of a config file


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a root daemon's config that hides mistakes.
    Aliases are refused: a few hundred bytes of nested `*a` expand to gigabytes (a 474-byte
    file made a 122 MB error message), and a config has no need of them."""

    def compose_node(self, parent: Optional[yaml.Node], index: int) -> Optional[yaml.Node]:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not allowed in the configuration: write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> str:
        """A `"\\ud800"` escape makes a lone surrogate: no argv, environment, journal field or
        file can carry it (a hook given one fails to start); refused where it is written."""
        value = super().construct_scalar(node)
        if isinstance(value, str) and not value.isascii() and _SURROGATE.search(value):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "a surrogate escape (\\ud800 to \\udfff) is no character and cannot be "
                "encoded: write the character itself (or \\U and its 8 hex digits)",
                node.start_mark,
            )
        return value


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:  # noqa: ANN401
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # `[a]: b` (found by atheris): a list or mapping as a key
            raise yaml.constructor.ConstructorError(
                None, None, f"a {type(key).__name__} cannot be a key", key_node.start_mark
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _construct_timestamp(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:  # noqa: ANN401
    """`api_version: 2020-13-01` looks like a date to YAML; PyYAML then raises a bare
    ValueError (a traceback from check-config, found by the fuzzer's seeds)."""
    try:
        return loader.construct_yaml_timestamp(node)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"{bounded(str(node.value))!r} looks like a date or time but is not one; "
            "quote it to mean text",
            node.start_mark,
        ) from None


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)
# YAML 1.2 booleans only: under YAML 1.1 a webhook's `on:` key would be the boolean True, and
# `yes`, `no`, `off` would not be the strings they look like. No base-60 integers either: a
# window's `end: 23:00` would be the number 82800.
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _INT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
# Integers as YAML 1.2 reads them: `010` is ten, as it reads (YAML 1.1 made it octal 8, so a
# `timeout: 010` was 8 s and `08` was a string); octal is written `0o10`.
_UniqueKeyLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|0o[0-7]+|[-+]?[0-9][0-9_]*|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """Leading zeros are decimal; 0x, 0o, 0b say their base (see the resolver above)."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    digits = text.lstrip("+-")
    sign = -1 if text.startswith("-") else 1
    return sign * int(digits, 0 if digits[:2] in ("0x", "0o", "0b") else 10)


_UniqueKeyLoader.add_constructor(_INT, _construct_int)


def parse_yaml(text: str) -> Any:  # noqa: ANN401 - YAML
    """YAML as the config is read: safe, no duplicate keys, no aliases, YAML 1.2 booleans."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # `[[[[...` thousands deep (found by atheris)
        raise yaml.YAMLError("nested too deeply to be a configuration") from None
    except (ValueError, OverflowError) as e:  # a constructor's own error, never a traceback
        raise yaml.YAMLError(f"not a value YAML can hold: {bounded(str(e))}") from None


def read_bounded(path: Path) -> str:
    """At most MAX_FILE bytes: a config is a few kilobytes, and SIGHUP reads it on the loop."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        raise ConfigError([f"{path}: larger than {MAX_FILE // 1024} KiB; not a configuration"])
    return data.decode("utf-8")


def read(path: Path, reader: Optional[Callable[[Path], str]] = None) -> Any:  # noqa: ANN401
    """The YAML value of a config file; a file that cannot be read, is no UTF-8 text or no YAML
    is one problem, with its line and column where YAML says them."""
    source = str(path)
    try:
        text = (reader or read_bounded)(path)
    except OSError as e:
        raise ConfigError([f"{source}: cannot read: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError([f"{source}: not UTF-8 text: {e.reason}"]) from None
    try:
        return parse_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "YAML"
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{source}: {where}: {bounded(problem)}"]) from None
