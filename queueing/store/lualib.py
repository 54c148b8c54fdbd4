"""The shared part of the scripts' library, assembled from modules (`lua/_*.lua`), each with its own scope.

Lua 5.1 lets a function (the library's chunk is one) hold 200 locals at a time and a closure 60
upvalues. When the parts were joined as one scope, every helper of every part was a top-level local: 200,
the limit, and one more name made FUNCTION LOAD fail. Now each part says what it gives the others and
the scripts in its `--!exports:` lines; the library declares those names once, at its head, and each part
runs in a `do ... end` block of its own, so its other names are its own and end with it. A part defines
what it exports without `local` (`function name(...)`, `NAME = value`); anything else it defines is
local to it. Exported names may be used by any part, in any order: they are declared before all of them.

`assemble` checks what a mistake here would otherwise turn into a script that fails at its first call (a
name read as a global) or a library that does not load: an exported name no part defines, two parts
exporting one name, a part that makes an exported name local again (the others would see nil).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

EXPORTS = re.compile(r"^--!exports:(.*)$", re.MULTILINE)
# What a part's own definitions look like at its top level: a function, or an assignment (one name or several).
_DEFINED = re.compile(r"^(?:function\s+([A-Za-z_]\w*)|([A-Za-z_][\w, ]*?)\s*=[^=])", re.MULTILINE)
_LOCALS = re.compile(r"^local\s+(?:function\s+)?([A-Za-z_][\w, ]*)", re.MULTILINE)


class Part(NamedTuple):
    name: str  # the file's name
    exports: tuple[str, ...]
    body: str


class LibraryError(ValueError):
    """The parts do not make a library (what is wrong, and in which part)."""


def part_read(path: Path) -> Part:
    body = path.read_text()
    names = tuple(name for line in EXPORTS.findall(body) for name in line.split())
    return Part(path.name, names, body)


def defined(body: str) -> set[str]:
    """The names a part defines at its top level without `local` (its exports, when it is right)."""
    names: set[str] = set()
    for function, assigned in _DEFINED.findall(body):
        names.update([function] if function else [name.strip() for name in assigned.split(",")])
    return names


def top_level_locals(body: str) -> set[str]:
    names: set[str] = set()
    for declared in _LOCALS.findall(body):
        names.update(name.strip() for name in declared.split(",") if name.strip())
    return names


def assemble(parts: Sequence[Part]) -> str:
    """The library's shared code: the exported names declared once, then each part in a scope of its own."""
    owner: dict[str, str] = {}
    for part in parts:
        for name in part.exports:
            if name in owner:
                raise LibraryError(f"{name} is exported by {owner[name]} and {part.name}")
            owner[name] = part.name
    for part in parts:
        missing = set(part.exports) - defined(part.body)
        if missing:
            raise LibraryError(f"{part.name} exports what it does not define: {', '.join(sorted(missing))}")
        shadowed = top_level_locals(part.body) & set(owner)
        if shadowed:
            raise LibraryError(f"{part.name} makes exported names local: {', '.join(sorted(shadowed))}")
    head = f"local {', '.join(owner)}" if owner else ""
    return "\n".join([head, *(f"do  -- {part.name}\n{part.body}\nend" for part in parts)])
