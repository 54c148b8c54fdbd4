"""The product's version: `[project] version` in pyproject.toml, the one place it is written (CHANGELOG.md
tells what each version brought). Read once, at import; the product is run from its checkout or its
image (which copies pyproject.toml), never installed as a package, so there is no package metadata to ask.

Told in /readyz's answer, in the metric `waitingroom_build_info` and in the footers of the dashboard and
the admin."""

from __future__ import annotations

import platform
import tomllib
from pathlib import Path
from typing import Final

import django

PYPROJECT: Final = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _read_version() -> str:
    with PYPROJECT.open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


VERSION: Final = _read_version()


def build_info() -> dict[str, str]:
    """What this process runs: the product's version and its Python's and Django's."""
    return {"version": VERSION, "python": platform.python_version(), "django": django.get_version()}
