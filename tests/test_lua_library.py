"""The scripts' library in modules (issue 49): each part (`queueing/lua/_*.lua`) in a scope of its own, saying
what it exports (queueing/store/lualib.py). Lua 5.1 allows a function 200 locals and a closure 60 upvalues;
joined as one scope the parts had 200 top-level names, and the next one made FUNCTION LOAD fail. These
tests see the limits coming long before they bite, and see the mistakes modules make possible (a name used
where it is not in scope reads as a global, and fails only when that line runs) before any script runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from queueing.store import connection, lualib

LUA = connection.LUA_DIR
TOP_LEVEL_MAX = 120  # of Lua's 200: what the parts export, declared once for all of them
UPVALUES_MAX = 45  # of Lua's 60: the library's names one script uses
LINES_MAX = 400

KEYWORDS = {
    *("and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local", "nil"),
    *("not", "or", "repeat", "return", "then", "true", "until", "while"),
}


def code_of(source: str) -> str:
    """Lua source without its comments and with every string literal emptied (names only remain)."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        long = re.match(r"(--)?\[(=*)\[", source[i:])
        if long:
            close = "]" + long.group(2) + "]"
            end = source.find(close, i)
            end = n if end < 0 else end + len(close)
            out.append(("" if long.group(1) else '""') + "\n" * source.count("\n", i, end))
            i = end
        elif source.startswith("--", i):
            end = source.find("\n", i)
            i = n if end < 0 else end
        elif source[i] in "'\"":
            end = i + 1
            while end < n and source[end] != source[i]:
                end += 2 if source[end] == "\\" else 1
            out.append('""')
            i = end + 1
        else:
            out.append(source[i])
            i += 1
    return "".join(out)


def names_used(source: str) -> set[str]:
    """The names a piece of Lua reads or writes as variables (not a table's fields)."""
    return set(re.findall(r"(?<![.:\w])([A-Za-z_]\w*)", code_of(source))) - KEYWORDS


def declared_anywhere(source: str) -> set[str]:
    """Every name the piece declares itself, at any depth: locals, functions' parameters, loop variables."""
    code = code_of(source)
    groups = re.findall(r"\blocal\s+function\s+([A-Za-z_]\w*)", code)
    groups += re.findall(r"\blocal\s+(?!function\b)([A-Za-z_][\w, ]*)", code)
    groups += re.findall(r"\bfunction\b[^(]*\(([^)]*)\)", code)
    groups += re.findall(r"\bfor\s+([\w, ]+?)\s*(?:=|\bin\b)", code)
    return {name.strip() for group in groups for name in group.split(",") if name.strip() not in ("", "...")}


def parts() -> list[lualib.Part]:
    return connection.library_parts()


def scripts() -> dict[str, str]:
    return {
        path.relative_to(LUA).as_posix(): path.read_text()
        for path in sorted(LUA.rglob("*.lua"))
        if not path.name.startswith("_")
    }


def exported() -> set[str]:
    return {name for part in parts() for name in part.exports}


def test_the_library_s_top_level_names_stay_well_within_lua_s_limit():
    code = connection.library().code
    head = code.splitlines()[1]  # after the #!lua line: the exported names, declared once
    assert head.startswith("local ")
    declared = [name.strip() for name in head.removeprefix("local ").split(",")]
    assert set(declared) == exported()
    assert len(declared) <= TOP_LEVEL_MAX, f"{len(declared)} top-level names: group some (a part's own stay in it)"
    # What each part keeps to itself lives in its own block: at most the head and the largest part's own at once.
    own = max(len(lualib.top_level_locals(part.body)) for part in parts())
    assert len(declared) + own < 200


@pytest.mark.parametrize("name", sorted(scripts()))
def test_a_script_uses_few_enough_of_the_library_s_names(name):
    used = names_used(scripts()[name]) & exported()
    if name.count("/") == 0:
        used |= {"bind"}  # every queue script begins with bind(KEYS) (connection.library)
    assert len(used) <= UPVALUES_MAX, f"{name} closes over {len(used)} of the library's names: {sorted(used)}"


def test_no_lua_file_is_over_400_lines():
    long = {path.name: n for path in LUA.rglob("*.lua") if (n := path.read_text().count("\n")) > LINES_MAX}
    assert not long, long


def test_every_name_a_script_or_part_takes_from_another_part_is_exported():
    """A part's own names are out of sight of the others and of the scripts: used there, they would be read
    as globals (nil, and an error when that line runs). Each must be exported, or it is not in scope."""
    everyone = exported()
    for part in parts():
        others_own: set[str] = set()
        for other in parts():
            if other.name != part.name:
                others_own |= lualib.top_level_locals(other.body)
        mine = declared_anywhere(part.body) | lualib.defined(part.body)
        leaked = (names_used(part.body) & others_own) - mine - everyone
        assert not leaked, f"{part.name} uses names other parts keep to themselves: {sorted(leaked)}"
    own = set().union(*(lualib.top_level_locals(part.body) for part in parts()))
    for name, source in scripts().items():
        leaked = (names_used(source) & own) - declared_anywhere(source) - everyone
        assert not leaked, f"{name} uses names a part keeps to itself: {sorted(leaked)}"


def test_assembling_refuses_what_would_fail_only_when_a_script_runs():
    ok = lualib.Part("_a.lua", ("shared", "helper"), "--!exports: shared helper\nshared = 1\nfunction helper() end\n")
    assert lualib.assemble([ok]).startswith("local shared, helper\ndo  -- _a.lua\n")
    twice = lualib.Part("_b.lua", ("shared",), "--!exports: shared\nshared = 2\n")
    with pytest.raises(lualib.LibraryError, match=r"shared is exported by _a\.lua and _b\.lua"):
        lualib.assemble([ok, twice])
    undefined = lualib.Part("_c.lua", ("missing",), "--!exports: missing\nlocal function missing() end\n")
    with pytest.raises(lualib.LibraryError, match="exports what it does not define: missing"):
        lualib.assemble([undefined])
    shadow = lualib.Part("_d.lua", (), "local shared = 3\n")
    with pytest.raises(lualib.LibraryError, match="makes exported names local: shared"):
        lualib.assemble([ok, shadow])


def test_each_part_names_its_exports_at_its_head():
    for part in parts():
        head = Path(LUA / part.name).read_text().split("\n\n", 1)[0]
        assert "--!exports:" in head or not part.exports, part.name
