"""Reading the environment for settings.py: typed variables that refuse a value they cannot read
(ImproperlyConfigured, at start), the installation file that bin/run leaves for every other command of the
same checkout, and the files that keep a development install's generated secrets."""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


def envtable(name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """A table of settings per name, with JSON in the environment changing only the entries it names: an
    object (`{"join": {...}}` replaces the join entry, `{"join": null}` turns it off) or null for none.
    ImproperlyConfigured, naming the variable, for anything else."""
    value = os.environ.get(name, "").strip()
    if not value:
        return dict(defaults)
    try:
        changes = json.loads(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON object ({exc}), not {value!r}") from exc
    if not isinstance(changes, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object of entries, not {value!r}")
    for key, entry in changes.items():
        if entry is not None and not isinstance(entry, dict):
            raise ImproperlyConfigured(f"{name}: the entry {key!r} must be an object or null, not {entry!r}")
    return {**defaults, **changes}


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


INSTALLATION_FILE = "installation.env"
# What bin/run decided for its installation and every other process of the same checkout must agree on:
# where the live state is and under which keys, the broker's keys and queue, the database. Nothing that
# relaxes security (HTTPS=0, a generated secret) is kept here: bin/manage asks for those itself, as bin/run
# does. The file is this user's only (a URL may carry a password).
INSTALLATION_NAMES = (
    "REDIS_URL",
    "REDIS_CLUSTER_NODES",
    "WR_REDIS_PREFIX",
    "CELERY_KEY_PREFIX",
    "CELERY_TASK_DEFAULT_QUEUE",
    "CELERY_BROKER_URL",
    "CHANNEL_LAYER_URL",
    "CACHE_URL",
    "DATABASE_URL",
)
_LINE = re.compile(r"([A-Z][A-Z0-9_]*)=(.*)")


def installation_read(path: Path) -> dict[str, str]:
    """The variables kept in an installation file (KEY=value lines; '#' comments), or ImproperlyConfigured
    in one line naming the file when it cannot be read or holds something else. {} when there is none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ImproperlyConfigured(f"{path}: cannot read this installation's settings ({reason}).") from exc
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.fullmatch(line.strip())
        if match is None or match[1] not in INSTALLATION_NAMES:
            raise ImproperlyConfigured(f"{path}, line {number}: not one of this installation's settings: {line!r}.")
        found[match[1]] = match[2]
    return found


def installation_environment(var_dir: Path) -> dict[str, str]:
    """One installation, one namespace (issue 47): what bin/run kept in var/installation.env applies to
    every process started from the same checkout (manage.py, a Celery command, a shell), so that each acts
    on the running installation's Redis keys, broker and database. The process's own environment wins
    over the file, and a process given SECRET_KEY (a deployment, never bin/run's development install,
    whose secret is generated) does not read it at all. Returns what the file supplied."""
    supplied: dict[str, str] = {}
    if os.environ.get("SECRET_KEY"):
        return supplied
    for name, value in installation_read(var_dir / INSTALLATION_FILE).items():
        if name not in os.environ:
            os.environ[name] = value
            supplied[name] = value
    return supplied


def installation_write(var_dir: Path, env: dict[str, str]) -> Path:
    """Keep what the run decided (the INSTALLATION_NAMES set in `env`) for the other commands of the
    checkout; written whole and then moved into place, so a reader never sees half of it."""
    path = var_dir / INSTALLATION_FILE
    lines = [
        "# This installation's settings, written by bin/run at each start; read by every process of this",
        "# checkout (manage.py, celery) whose environment does not set them. Edit the environment, not this file.",
    ]
    lines += [f"{name}={env[name]}" for name in INSTALLATION_NAMES if env.get(name)]
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write("\n".join(lines) + "\n")
    partial.replace(path)
    return path


def tick_queue_name(default_queue: str) -> str:
    """The admission tick's own Celery queue, beside the default one (settings.celery_queues; runstack runs a
    worker for each)."""
    return f"{default_queue}-ticks"


def celery_queues(default: str) -> tuple[str, tuple[Any, ...], dict[str, dict[str, str]]]:
    """The admission tick's own Celery queue (issue 50: periodic jobs that filled every worker slot, ~37,000
    turn notices, stopped the ticks): its name, the queues a worker started without -Q consumes (both), and
    the route. runstack runs a worker for each, so no other job can take the tick's slots."""
    from kombu import Queue as TaskQueue

    ticks = tick_queue_name(default)
    return ticks, (TaskQueue(default), TaskQueue(ticks)), {"queueing.tasks.admission_tick": {"queue": ticks}}


def ws_origin(base: str) -> list[str]:
    """The websocket server's origin for the pages' connect-src: that origin alone, where ws: and wss: let
    a page connect anywhere (issue 50). On the page's own host, 'self' covers ws and wss (CSP Level 3)."""
    parts = urlsplit(base)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        return []
    return [f"{parts.scheme}://{parts.netloc}"]
