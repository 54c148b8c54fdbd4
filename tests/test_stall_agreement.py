"""The product's `admission.stalled` webhook and the shipped Prometheus rule `WaitingRoomAdmissionStalled` agree
on what a stall is (issue 47, items 9 and 12): the same situations, fed to both, fire both or neither.

Seen before: the rule fired in every healthy pre-queue (the metrics said state="open" there), while the webhook
fired for a full site, which the rule leaves out. Each situation is one queue's live figures as
selectors.queue_stats_get gives them; the Prometheus side gets exactly what the metrics export of those
figures (waitingroom_site.metrics), minute by minute, and runs the shipped rule in promtool; the webhook side
gets the same figures through alerts.services into alerts.events.observe."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts import events, names, services
from queueing import health
from waitingroom_site import metrics

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "alerts.yml"
MINUTES = 10
STALL_SECONDS = 300  # the rule: no admission in 3 minutes, for 2 minutes
THRESHOLDS = health.Thresholds(p95_ms=1000.0, error_rate=0.05, min_requests=20)


def stats(minute: int, **situation: Any) -> dict[str, Any]:
    """A queue's live figures at `minute` of a situation (the keys queue_stats_get gives)."""
    figures: dict[str, Any] = {
        "slug": situation["slug"],
        "mode": "tracked",
        "state": situation.get("state", "open"),
        "phase": situation.get("phase", "open"),
        "waiting": situation.get("waiting", 500),
        "waiting_away": situation.get("away", 0),
        "head_position": 1,
        "admitted": 0,
        "active": situation.get("in_use", 100),
        "capacity": situation.get("capacity", 1000),
        "capacity_in_use": situation.get("in_use", 100),
        "outflow_per_minute_configured": 60.0,
        "outflow_per_minute_observed": 0.0,
        "outflow_per_minute_effective": situation.get("outflow", 60.0),
        "site_health": {"window_seconds": 60, "requests": 0, "errors": 0, "p95_latency_ms": None},
        "totals": {"admitted": 100 + minute * situation.get("admitted_a_minute", 0), "joined": 1000},
        "epoch": 1,
        "viewers": 0,
    }
    return figures


SITUATIONS: list[dict[str, Any]] = [
    {"slug": "stuck"},  # people waiting, room, an outflow, nobody let in: the one real stall
    {"slug": "moving", "admitted_a_minute": 60},
    {"slug": "full", "capacity": 100, "in_use": 100},  # a full site: nobody can be let in, no fault
    {"slug": "prequeue", "phase": "prequeue", "schedule": "prequeue"},  # waiting for the draw
    {"slug": "notyet", "phase": "before_prequeue", "schedule": "before_prequeue", "waiting": 0},
    {"slug": "paused", "state": "paused", "phase": "paused"},
    {"slug": "closed", "state": "closed", "phase": "closed"},
    {"slug": "nooutflow", "outflow": 0.0},  # the adaptive outflow at 0, or the operator's
    {"slug": "allaway", "waiting": 40, "away": 40},  # everyone parked as away: nobody to let in
    {"slug": "unlimited", "capacity": 0, "in_use": 5000},  # no capacity limit: room always, so a stall too
]


def webhook_stalled(situation: dict[str, Any]) -> bool:
    """Whether a hook watching the queue every minute is left told `admission.stalled` at minute 10."""
    rules = events.Rules(waiting_threshold=None, stall_seconds=STALL_SECONDS)
    seen: dict[str, Any] = {}
    stalled = False
    for minute in range(MINUTES + 1):
        figures = services.figures_from_stats(
            stats(minute, **situation),
            state=situation.get("state", "open"),
            schedule=situation.get("schedule", "running"),
            thresholds=THRESHOLDS,
        )
        seen, told = events.observe(seen, figures, rules, now=1_000_000.0 + 60 * minute)
        for name, _ in told:
            stalled = {names.STALLED: True, names.RESUMED: False}.get(name, stalled)
    return stalled


def exported_series(situation: dict[str, Any]) -> dict[str, list[float]]:
    """What /metrics says of the situation each minute, as promtool's input series."""
    series: dict[str, list[float]] = defaultdict(list)
    for minute in range(MINUTES + 1):
        for family in metrics._queue_families([stats(minute, **situation)]):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted({**sample.labels, "instance": "web"}.items()))
                series[f"{sample.name}{{{labels}}}"].append(sample.value)
    return series


def promtool_agrees(tmp_path: Path, expected: dict[str, bool]) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool (Debian's prometheus package) is missing: bin/test installs it")
    inputs = [
        {"series": name, "values": " ".join(f"{v:g}" for v in values)}
        for situation in SITUATIONS
        for name, values in exported_series(situation).items()
    ]
    alerts = [
        {
            "exp_labels": {"queue": slug, "instance": "web", "severity": "critical"},
            "exp_annotations": {
                "summary": f"Queue {slug}: 500 waiting and nobody admitted for 5 minutes",
                "description": "Check the beat and the workers (python -m waitingroom_site.liveness beat|worker) "
                "and Redis.",
            },
        }
        for slug, stalled in expected.items()
        if stalled
    ]
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": f"{MINUTES}m", "alertname": "WaitingRoomAdmissionStalled", "exp_alerts": alerts}
                ],
            }
        ],
    }
    (tmp_path / "agreement.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run(
        [binary, "test", "rules", "agreement.test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


def test_the_webhook_and_the_prometheus_rule_call_the_same_situations_a_stall(tmp_path):
    verdicts = {situation["slug"]: webhook_stalled(situation) for situation in SITUATIONS}
    assert [slug for slug, stalled in verdicts.items() if stalled] == ["stuck", "unlimited"]  # the webhook says
    checked = promtool_agrees(tmp_path, verdicts)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_agreement_check_can_fail(tmp_path):
    """promtool answers the question asked: a verdict the rule does not share fails it."""
    verdicts = {situation["slug"]: situation["slug"] in ("stuck", "full") for situation in SITUATIONS}
    checked = promtool_agrees(tmp_path, verdicts)
    assert checked.returncode != 0 and "full" in checked.stdout + checked.stderr
