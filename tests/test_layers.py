"""The layer contracts (pyproject.toml, run by bin/test through lint-imports) hold for the product, and
they do break when a module imports across them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("queueing", "admin_dashboard", "alerts", "waitingroom_site")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(binary), "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the product's code and its contracts, to break on purpose."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_import(path: Path, line: str) -> None:
    source = path.read_text()
    head, marker, rest = source.partition("from __future__ import annotations\n")
    assert marker, path
    path.write_text(f"{head}{marker}\n{line}\n{rest}")


def test_the_product_keeps_every_layer_contract(tree):
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout
    assert "0 broken" in result.stdout


def test_a_selector_importing_services_breaks_the_layers(tree):
    add_import(tree / "queueing" / "selectors" / "tickets.py", "from .. import services  # noqa")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "queueing.selectors is not allowed to import queueing.services" in result.stdout


def test_the_store_importing_the_domain_breaks_the_layers(tree):
    add_import(tree / "queueing" / "store" / "health.py", "from .. import health  # noqa")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "queueing.store is not allowed to import queueing.health" in result.stdout


def test_a_page_reaching_the_store_breaks_the_contract(tree):
    add_import(tree / "queueing" / "views.py", "from . import store  # noqa")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "Faces reach Redis only through services and selectors BROKEN" in result.stdout


def test_models_touching_redis_break_the_contract(tree):
    add_import(tree / "queueing" / "models" / "queue.py", "import redis  # noqa")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert "Models never touch Redis BROKEN" in result.stdout
