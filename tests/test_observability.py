"""What operators load into their own tools (issue 17): the alerting rules (promtool check and promtool's
unit tests of them), the Prometheus scrape config, the Grafana dashboard; every metric they name is one the
product exports; compose runs them (profile `monitoring`) and keeps /metrics from the public."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram

from queueing import instruments
from waitingroom_site import metrics

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "waitingroom.json"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool (Debian's prometheus package) is missing: bin/test installs it")
    return subprocess.run([binary, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)


def test_the_alerting_rules_pass_promtools_check_and_their_unit_tests():
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout
    tested = promtool("test", "rules", "alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_rules_unit_tests_fail_when_an_alert_is_wrong(tmp_path):
    """The unit tests can fail: the same tests against a rule that never fires."""
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "WaitingRoomAdmissionStalled":
            rule["expr"] = "vector(0) > 1"
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(PROMETHEUS / "alerts.test.yml", tmp_path)
    binary = shutil.which("promtool") or "promtool"
    failed = subprocess.run([binary, "test", "rules", "alerts.test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert failed.returncode != 0 and "WaitingRoomAdmissionStalled" in failed.stdout + failed.stderr


def test_the_scrape_config_is_valid_and_loads_the_rules():
    checked = promtool("check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "alerts.yml" in checked.stdout


def exported() -> set[str]:
    """Every series name the product can export: the processes' metrics (instruments.py) and the queues'."""
    names: set[str] = set()
    made = [value for value in vars(instruments).values() if isinstance(value, Counter | Gauge | Histogram)]
    made += [instruments.sockets_open(), instruments.tick_seconds(), instruments.tick_lag()]
    for metric in made:
        base = metric._name
        if isinstance(metric, Counter):
            names.add(f"{base}_total")
        elif isinstance(metric, Histogram):
            names.update(f"{base}_{suffix}" for suffix in ("bucket", "sum", "count"))
        else:
            names.add(base)
    queue = f"{instruments.NAMESPACE}_queue"
    names.update(f"{queue}_{name}" for name, _, _ in metrics.QUEUE_GAUGES)
    names.update(f"{queue}_{name}_total" for name, _, _ in metrics.QUEUE_COUNTERS)
    names.update(f"{queue}_{name}" for name in ("outflow_per_minute", "state", "average_wait_seconds"))
    names.update({f"{queue}_expiries_total", "waitingroom_redis_up", "waitingroom_scrape_read_seconds"})
    names.add("waitingroom_beat_last_tick_timestamp_seconds")
    return names


def named(text: str) -> set[str]:
    return set(re.findall(r"\bwaitingroom_[a-z_]+\b", text))


def test_every_metric_the_rules_and_the_dashboard_name_is_one_the_product_exports():
    known = exported()
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    rules = named("\n".join(rule["expr"] for group in groups for rule in group["rules"]))
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions += [item["expr"] for item in dashboard["annotations"]["list"]]
    used = named("\n".join(expressions))
    assert rules and used
    assert rules <= known, rules - known
    assert used <= known, used - known
    # The dashboard shows every family the product exports, but for the few that only alerts use.
    bases = {re.sub(r"_(bucket|sum|count)$", "", name) for name in known}
    shown = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used | rules}
    assert bases - shown <= {"waitingroom_scrape_read_seconds"}, bases - shown


def test_the_dashboard_is_grafana_json_on_a_chosen_prometheus_with_a_queue_filter():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {item["name"]: item for item in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["queue"]["includeAll"] and "label_values(waitingroom_queue_waiting, queue)" in str(variables)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 15
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_keeps_metrics_per_container_serves_them_inside_and_runs_prometheus_and_grafana_on_request():
    services = compose()["services"]
    for name in ("web", "ws", "worker", "beat"):
        service = services[name]
        assert "/run/metrics" in service["tmpfs"], name  # empty at every start: no stale process files
        assert service["environment"]["PROMETHEUS_MULTIPROC_DIR"] == "/run/metrics", name
    for name in ("worker", "beat"):  # no web server of their own: the supervisor serves theirs
        env = services[name]["environment"]
        assert env["WR_METRICS_PORT"] == "9100" and env["WR_METRICS_ADDRESS"] == "0.0.0.0"  # noqa: S104
        assert "9100" in services[name]["expose"] and "ports" not in services[name]  # never published
    scrape = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    targets = {
        (name, config["port"])
        for job in scrape["scrape_configs"]
        for config in job["dns_sd_configs"]
        for name in config["names"]
    }
    assert targets == {("web", 8000), ("ws", 8001), ("worker", 9100), ("beat", 9100)}
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    assert all(port.startswith("127.0.0.1:") for port in prometheus["ports"] + grafana["ports"])
    for service in (prometheus, grafana):
        for volume in service["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    provisioned = ROOT / "deploy/grafana/provisioning"
    datasource = yaml.safe_load((provisioned / "datasources/prometheus.yml").read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and datasource["type"] == "prometheus"


def test_the_public_proxy_refuses_metrics():
    config = (ROOT / "deploy/nginx.conf").read_text()
    refusal = re.search(r"location ~ \^/metrics/\?\$ \{\s*return 404;\s*\}", config)
    assert refusal is not None
    assert config.index("location ~ ^/metrics") < config.index("location / {")
    # and its pattern is the path Django serves them on, by default
    assert re.match(r"^/metrics/?$", "/metrics") and metrics_path_default() == "metrics"


def metrics_path_default() -> str:
    text = (ROOT / "waitingroom_site/settings.py").read_text()
    found = re.search(r'WR_METRICS_PATH = os.environ.get\("WR_METRICS_PATH", "(\w+)"\)', text)
    assert found is not None
    return found.group(1)
