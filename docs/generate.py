"""What the document generators share: a generated part between two marker lines, and writing
(or, with --check, only comparing) each generated file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path


def between(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between the two marker lines replaced by `body`."""
    head, found, rest = text.partition(begin)
    if not found:
        raise SystemExit(f"marker not found: {begin}")
    _, found, tail = rest.partition(end)
    if not found:
        raise SystemExit(f"marker not found: {end}")
    return f"{head}{begin}\n{body}\n{end}{tail}"


def refresh(renders: Mapping[Path, Callable[[str], str]], *, check: bool) -> list[str]:
    """Each file rendered from its present text; the stale ones (written unless `check`)."""
    stale = []
    for path, render in renders.items():
        old = path.read_text(encoding="utf-8")
        new = render(old)
        if new != old:
            stale.append(str(path))
            if not check:
                path.write_text(new, encoding="utf-8")
    return stale


def report(script: str, stale: list[str], *, check: bool) -> int:
    """What every generator's main says at its end: with --check, stale files are a failure."""
    if check and stale:
        print(f"stale, run docs/{script}:", " ".join(stale))
        return 1
    print("\n".join(f"wrote {p}" for p in stale) or "up to date")
    return 0
