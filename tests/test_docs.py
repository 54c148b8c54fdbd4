"""The documentation (issue 47): the configuration page and the settings agree, the README stays a short
front door, and every relative link in it and in docs/ leads to a file that exists. The site itself is
built by bin/test (`mkdocs build --strict`, after lint and before pytest), not here: that build is what
catches a broken anchor or a page missing from mkdocs.yml's nav."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
# Where settings are read from the environment.
SETTINGS_SOURCES = (ROOT / "waitingroom_site" / "settings.py", ROOT / "waitingroom_site" / "environment.py")
# waitingroom_site/environment.py's typed readers: each takes the variable's name first.
ENV_READERS = {"envbool", "envint", "envfloat", "envlist", "envtable", "getenv"}
ENVIRON = {"os.environ", "environ"}
SKIPPED_DIRS = {".venv", "var", "tests", "node_modules", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
README_MAX_LINES = 200


def environment_names(source: str) -> set[str]:
    """Every variable name a module reads: os.environ.get("X"), os.environ["X"], os.getenv("X"), "X" in
    os.environ, and envbool/envint/envfloat/envlist/envtable("X", ...)."""
    return {name for node in ast.walk(ast.parse(source)) if (name := name_read(node)) is not None}


def name_read(node: ast.AST) -> str | None:
    """The variable this expression reads from the environment, if it is one of the ways of reading it."""
    if isinstance(node, ast.Call) and node.args:
        func, first = node.func, node.args[0]
        reader = (isinstance(func, ast.Name) and func.id in ENV_READERS) or (
            isinstance(func, ast.Attribute)
            and (
                func.attr in ENV_READERS
                or (func.attr in {"get", "setdefault", "pop"} and ast.unparse(func.value) in ENVIRON)
            )
        )
        return first.value if reader and isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ENVIRON:
        key = node.slice
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
    if isinstance(node, ast.Compare) and any(ast.unparse(c) in ENVIRON for c in node.comparators):
        left = node.left
        return left.value if isinstance(left, ast.Constant) and isinstance(left.value, str) else None
    return None


def table_variables(markdown: str) -> set[str]:
    """The variables a page's tables name: the backquoted upper-case names in each row's first cell."""
    names: set[str] = set()
    for line in markdown.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2 and not set(cells[1].strip()) <= {"-", ":"}:
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1]))
    return names


def product_sources() -> str:
    """Every .py file of the product, the tests left out."""
    texts = []
    for path in sorted(ROOT.rglob("*.py")):
        if not SKIPPED_DIRS & set(path.relative_to(ROOT).parts):
            texts.append(path.read_text())
    return "\n".join(texts)


def relative_links(markdown: str) -> list[str]:
    """The targets of a Markdown file's inline links and images that point into the repository, without their
    #anchor (fenced code and inline code left out)."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = []
    for target in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, mailto: and the like; an anchor on the same page
        targets.append(target.split("#", 1)[0])
    return targets


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_parser_finds_every_way_settings_read_the_environment() -> None:
    source = (
        'import os\nA = os.environ.get("A_ONE", "x")\nB = os.environ["B_TWO"]\nC = envint(\n    "C_THREE", 1)\n'
        'D = "D_FOUR" in os.environ\nE = os.getenv("E_FIVE")\nF = envtable("F_SIX", {})\nG = other("NOT_ME")\n'
    )
    assert environment_names(source) == {"A_ONE", "B_TWO", "C_THREE", "D_FOUR", "E_FIVE", "F_SIX"}


def test_every_variable_the_settings_read_is_on_the_configuration_page() -> None:
    read = set().union(*(environment_names(path.read_text()) for path in SETTINGS_SOURCES))
    assert len(read) > 50, "the parser found too few variables to be reading settings.py"
    missing = sorted(read - table_variables(CONFIGURATION.read_text()))
    assert not missing, f"read by the settings, missing from {CONFIGURATION.relative_to(ROOT)}'s table: {missing}"


def test_every_variable_on_the_configuration_page_is_read_by_the_code() -> None:
    documented = table_variables(CONFIGURATION.read_text())
    assert {"SECRET_KEY", "REDIS_URL", "WR_RATE_LIMITS"} <= documented
    code = product_sources()
    unread = sorted(name for name in documented if not re.search(rf"[\"']{name}[\"']", code))
    assert not unread, f"on the configuration page, read nowhere in the product's code: {unread}"


def test_the_readme_is_a_short_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_the_readme_says_where_to_read_on() -> None:
    readme = (ROOT / "README.md").read_text()
    for needed in ("bin/run", "bin/test", "bin/manage", "mkdocs serve", "LICENSE", "CHANGELOG.md", "docs/"):
        assert needed in readme, needed


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_that_exists(path: Path) -> None:
    broken = [
        target
        for target in relative_links(path.read_text())
        if target and not (ROOT / target.lstrip("/") if target.startswith("/") else path.parent / target).exists()
    ]
    assert not broken, f"{path.relative_to(ROOT)} links to files that do not exist: {broken}"


def test_the_link_reader_finds_relative_links_and_leaves_the_rest() -> None:
    markdown = (
        "[a](docs/a.md) [b](b.md#anchor) [c](https://example.com/) [d](#here) `[e](in-code.md)`\n"
        "```\n[f](in-fence.md)\n```\n![g](img/g.png)\n"
    )
    assert relative_links(markdown) == ["docs/a.md", "b.md", "img/g.png"]
