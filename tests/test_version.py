"""The product's one version (issue 47): `[project] version` in pyproject.toml, told by /readyz, by the
metric waitingroom_build_info, in the dashboard's footer and the admin's header; and the files a project
people may use ships: the Apache-2.0 LICENSE and a CHANGELOG in Keep a Changelog's form."""

from __future__ import annotations

import platform
import re
import tomllib
from pathlib import Path

import django
import pytest
from prometheus_client.parser import text_string_to_metric_families

from waitingroom_site import metrics
from waitingroom_site.version import VERSION

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db


def pyproject_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def build_info_samples(text: str) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "waitingroom_build_info" and sample.value == 1
    ]


def test_the_version_is_pyprojects_and_looks_like_one():
    assert pyproject_version() == VERSION
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[-.]?\w+)*", VERSION)


def test_readyz_tells_the_version_beside_its_checks(client):
    answer = client.get("/readyz")
    assert answer.status_code == 200
    body = answer.json()
    assert body["version"] == pyproject_version()
    assert body["status"] == "ready" and body["checks"]["redis"]["ok"]


def test_a_scrape_has_exactly_one_build_info_sample_with_the_versions(client):
    answer = client.get("/metrics")
    assert answer.status_code == 200
    text = answer.content.decode()
    assert build_info_samples(text) == [
        {"version": pyproject_version(), "python": platform.python_version(), "django": django.get_version()}
    ]
    assert len(re.findall(r"^waitingroom_build_info\{", text, re.M)) == 1


def test_in_multiprocess_mode_the_build_info_is_still_one_sample(tmp_path, monkeypatch):
    """Many processes share the directory; the build is told once, by the process that answers."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    samples = build_info_samples(metrics.exposition().decode())
    assert [labels["version"] for labels in samples] == [pyproject_version()]


def test_the_dashboard_footer_and_the_admin_header_show_the_version(client, staff_user):
    client.force_login(staff_user)
    line = f"Waiting Room {pyproject_version()}"
    dashboard = client.get("/dashboard/")
    assert dashboard.status_code == 200
    assert re.search(rf"<footer[^>]*>{re.escape(line)}</footer>", dashboard.content.decode())
    admin = client.get("/admin/")
    assert admin.status_code == 200 and line in admin.content.decode()


def test_the_license_is_the_apache_license_2_0_in_full():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "9. Accepting Warranty or Additional Liability." in text
    assert "END OF TERMS AND CONDITIONS" in text
    with (ROOT / "pyproject.toml").open("rb") as file:
        assert tomllib.load(file)["project"]["license"] == "Apache-2.0"


def test_the_changelog_keeps_a_changelog_with_the_version_released():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text
    headings = re.findall(r"^## \[(.+?)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert headings[0] == ("Unreleased", "")
    released = headings[1:]
    assert released and all(date for _, date in released)
    assert pyproject_version() in [version for version, _ in released]
    assert all(
        heading in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
        for heading in re.findall(r"^### (.+)$", text, re.M)
    )
