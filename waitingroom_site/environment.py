"""Reading the environment for settings.py: typed variables that refuse a value they cannot read
(ImproperlyConfigured, at start), and the files that keep a development install's generated secrets."""

from __future__ import annotations

import math
import os
import secrets
import warnings
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def envbool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), not {value!r}")


def envint(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, not {value!r}") from exc


def envfloat(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, not {value!r}") from exc
    if not math.isfinite(number):
        raise ImproperlyConfigured(f"{name} must be a finite number, not {value!r}")
    return number


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def private_file(path: Path) -> None:
    """Make `path` readable and writable by this user only (it holds secrets), creating it if missing.

    Created with that mode, so there is no moment when others may read it; an older file is narrowed.
    """
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    if path.stat().st_mode & 0o077:
        try:
            path.chmod(0o600)
        except PermissionError:  # another user's file: say so rather than refuse to start
            warnings.warn(f"{path} is readable by other users; make it mode 600.", stacklevel=2)


def generated_secret(path: Path) -> str:
    """Development only: a key kept in `path` (this user's only) so sessions and tickets survive restarts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        private_file(path)
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50))
    return path.read_text().strip()
