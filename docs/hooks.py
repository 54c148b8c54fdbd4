"""MkDocs hooks (mkdocs.yml `hooks:`): the API reference page is rendered from the OpenAPI schema that
`manage.py spectacular` writes to docs/api/openapi.yaml. bin/test writes it afresh before every build;
a first `mkdocs serve` or `mkdocs build` in a checkout without one writes it here."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "docs" / "api" / "openapi.yaml"


def schema_write(path: Path = SCHEMA) -> None:
    """The API's OpenAPI schema as the code describes it. Settings need a secret and a data folder: a
    throwaway secret and an empty folder, so no installation's files (var/installation.env) are read."""
    with tempfile.TemporaryDirectory() as var_dir:
        env = {**os.environ, "SECRET_KEY": "docs-build-only", "WR_VAR_DIR": var_dir, "LOG_LEVEL": "WARNING"}
        subprocess.run([sys.executable, "manage.py", "spectacular", "--file", str(path)], cwd=ROOT, env=env, check=True)


def on_pre_build(config: Any) -> None:
    # Only when missing: rewriting it on every build would wake `mkdocs serve`'s watcher again and again.
    if not SCHEMA.exists():
        schema_write()
