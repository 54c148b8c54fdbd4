"""The locks (issue 47): requirements.lock and requirements-dev.lock are compiled by pip-compile from the declared
requirements (requirements.txt, requirements-dev.txt) and are what bin/_bootstrap.sh and the Dockerfile install,
with --require-hashes. Offline: the files are read, nothing is resolved or downloaded."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ("requirements.txt", "requirements.lock")
DEV = ("requirements-dev.txt", "requirements-dev.lock")
# Tools the product never runs; gunicorn is a comparison option only (runstack --web-server gunicorn, bench/).
DEV_ONLY = re.compile(
    r"pytest.*|mypy.*|ruff|import-linter|grimp|schemathesis|hypothesis.*|playwright|axe-playwright-python|coverage"
    r"|types-.*|.*-stubs|celery-types|daphne|aiosmtpd|gunicorn"
)
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def declared(filename: str) -> dict[str, str]:
    """Name → exact version of each requirement the file declares, following `-r other.txt`."""
    pins: dict[str, str] = {}
    for raw in (ROOT / filename).read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            pins.update(declared(line.removeprefix("-r ").strip()))
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier  # one exact pin, nothing else
        assert specifier.operator == "==", line
        pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def locked(filename: str) -> dict[str, tuple[str, list[str]]]:
    """Name → (version, hashes) of each entry of a lock that pip-compile wrote."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in (ROOT / filename).read_text().splitlines():
        if line.startswith(("#", "-")) or not line.strip():
            continue
        if not line[0].isspace():  # `name==version \`, its hashes on the lines below
            name, _, version = line.rstrip(" \\").partition("==")
            assert version and ";" not in version and "[" not in name, line
            current = canonicalize_name(name)
            entries[current] = (version, [])
        elif line.strip().startswith("--hash="):
            entries[current][1].append(line.strip().rstrip(" \\"))
    return entries


@pytest.mark.parametrize(("requirements", "lock"), [RUNTIME, DEV])
def test_every_declared_requirement_is_locked_at_its_declared_version(requirements, lock):
    pins, entries = declared(requirements), locked(lock)
    assert pins, requirements
    wrong = {name: (version, entries.get(name, ("missing",))[0]) for name, version in pins.items()}
    assert {name: pair for name, pair in wrong.items() if pair[0] != pair[1]} == {}


@pytest.mark.parametrize("lock", [RUNTIME[1], DEV[1]])
def test_every_locked_package_carries_sha256_hashes(lock):
    entries = locked(lock)
    assert len(entries) > len(declared(RUNTIME[0])), lock  # the indirect dependencies too
    assert {name for name, (_, hashes) in entries.items() if not hashes} == set()
    malformed = [digest for _, hashes in entries.values() for digest in hashes if not HASH.fullmatch(digest)]
    assert malformed == []


def test_the_runtime_lock_has_no_dev_tool_and_the_dev_lock_agrees_with_it():
    runtime, dev = locked(RUNTIME[1]), locked(DEV[1])
    assert sorted(name for name in runtime if DEV_ONLY.fullmatch(name)) == []
    assert {"pytest", "mypy", "ruff", "import-linter", "gunicorn"} <= set(dev)
    # One version of each package whichever lock installed it: bin/run and bin/test share .venv.
    assert {name: (version, dev.get(name, ("missing",))[0]) for name, (version, _) in runtime.items()} == {
        name: (version, version) for name, (version, _) in runtime.items()
    }


def test_the_installed_packages_are_the_locked_versions():
    """A stale .venv (installed before a lock changed) fails here rather than somewhere stranger."""
    stale = {}
    for name, (version, _) in locked(DEV[1]).items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if installed != version:
            stale[name] = (installed, version)
    assert stale == {}, "installed, locked; bin/test reinstalls from the lock"


def test_the_image_and_compose_run_nothing_that_needs_gunicorn():
    """gunicorn is in the dev lock only, so what the image starts must not be gunicorn."""
    for filename in ("Dockerfile", "docker-compose.yml", "docker-compose.cluster.yml"):
        assert "gunicorn" not in (ROOT / filename).read_text(), filename


def test_runstack_without_gunicorn_says_in_one_line_where_it_comes_from():
    hide_gunicorn = (
        "import sys; sys.modules['gunicorn'] = None\n"  # as in an environment from the runtime lock
        "from waitingroom_site import runstack\n"
        "sys.exit(runstack.main(['--web-server', 'gunicorn']))"
    )
    answer = subprocess.run([sys.executable, "-c", hide_gunicorn], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2
    lines = (answer.stdout + answer.stderr).strip().splitlines()
    assert len(lines) == 1 and "gunicorn is not installed" in lines[0] and "requirements-dev" in lines[0], lines
