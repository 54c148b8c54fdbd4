"""The production shape: `check --deploy` is clean with production settings; docker-compose is sound."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from waitingroom_site import devcluster, devredis, runstack

ROOT = Path(__file__).resolve().parent.parent


def manage(*args: str, env: dict[str, str], umask: int = -1) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env, capture_output=True, text=True, cwd=ROOT, umask=umask
    )


def production_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "HTTPS", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    env.update(
        DJANGO_SETTINGS_MODULE="waitingroom_site.settings",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="queue.example.com",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        WR_VAR_DIR=str(tmp_path),
    )
    return env


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_settings_refuse_to_start_without_a_secret_key(tmp_path):
    env = production_env(tmp_path)
    del env["SECRET_KEY"]
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


def test_secure_defaults_hold_without_configuration(tmp_path):
    code = (
        "from django.conf import settings as s; "
        "print(s.DEBUG, s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_HSTS_SECONDS > 0, s.X_FRAME_OPTIONS)"
    )
    result = manage("shell", "--no-imports", "-c", code, env=production_env(tmp_path))
    assert result.stdout.split() == ["False", "True", "True", "True", "True", "DENY"], result.stderr


def test_development_serves_plain_http_unless_https_is_asked_for(tmp_path):
    """Issue 47: HTTPS did not follow DEBUG, so `DEBUG=1 manage.py runserver` redirected every page to https."""
    code = (
        "from django.test import Client; from django.conf import settings as s; "
        "answer = Client(HTTP_HOST='queue.example.com').get('/api/docs/'); "
        "print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, answer.status_code)"
    )
    env = {k: v for k, v in production_env(tmp_path).items() if k != "SECRET_KEY"}
    result = manage("shell", "--no-imports", "-c", code, env=dict(env, DEBUG="1"))
    assert result.stdout.split() == ["False", "False", "0", "200"], result.stdout + result.stderr
    result = manage("shell", "--no-imports", "-c", code, env=dict(env, DEBUG="1", HTTPS="1"))
    assert result.stdout.split() == ["True", "True", "31536000", "301"], result.stdout + result.stderr


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0.35", "0.35"),
        ("", "0.2"),
        ("0", "0.0"),
        ("a fifth", "must be a number"),
        ("1", "from 0 up to 1"),
        ("-0.1", "from 0 up to 1"),
        ("nan", "finite"),
    ],
)
def test_the_wait_estimate_s_default_crowd_share_is_read_from_the_environment_and_a_bad_one_stops_the_start(
    tmp_path, value, said
):
    env = {**production_env(tmp_path), "WR_WALK_PRIOR_SHARE": value}
    result = manage(
        "shell", "--no-imports", "-c", "from django.conf import settings as s; print(s.WR_WALK_PRIOR_SHARE)", env=env
    )
    assert said in result.stdout + result.stderr
    assert (result.returncode == 0) is said[0].isdigit(), result.stderr


def test_compose_runs_redis_with_aof_postgres_web_worker_and_beat():
    services = compose()["services"]
    assert {"redis", "postgres", "web", "ws", "worker", "beat", "migrate", "proxy"} <= set(services)
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["web"]["deploy"]["replicas"] >= 2
    web = services["web"]["command"]
    assert web[0] == "granian" and web[-1] == "waitingroom_site.web:application"
    assert web[web.index("--interface") + 1] == "asgi"
    assert services["ws"]["command"][:2] == ["uvicorn", "waitingroom_site.asgi:application"]
    supervised = ["python", "-m", "waitingroom_site.runstack", "--only"]
    assert services["worker"]["command"][:5] == [*supervised, "worker"]
    assert services["beat"]["command"][:5] == [*supervised, "beat"]
    for name, children in (("worker", ["worker", "jobs"]), ("beat", ["beat"])):  # what the supervisor runs
        args = runstack._parse(services[name]["command"][3:])
        assert args.only == [name]
        assert list(runstack.commands(args, "w@%h")) == children
    # The worker container: the admission ticks' own Celery worker and queue, and one for every other task
    # (issue 50: periodic jobs filled the one worker's slots and the ticks stopped).
    ran = runstack.commands(runstack._parse(services["worker"]["command"][3:]), "w@%h", "tasks")
    assert ran["worker"][ran["worker"].index("-Q") + 1] == "tasks-ticks" and "w@%h" in ran["worker"]
    assert ran["worker"][ran["worker"].index("--concurrency") + 1] == "4"
    assert ran["jobs"][ran["jobs"].index("-Q") + 1] == "tasks" and "jobs-w@%h" in ran["jobs"]
    assert "replicas" not in services["beat"].get("deploy", {})  # exactly one beat


def test_compose_app_services_share_one_image_and_point_at_redis_and_postgres():
    services = compose()["services"]
    for name in ("web", "ws", "worker", "beat", "migrate"):
        service = services[name]
        assert service["image"] == "waitingroom:latest" and service["build"] == "."
        env = service["environment"]
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        assert env["CACHE_URL"] == "redis://redis:6379/1"  # Django's cache apart from the live state
        assert env["DATABASE_URL"].startswith("postgres://") and "@postgres:5432/" in env["DATABASE_URL"]
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")
        assert ":${POSTGRES_PASSWORD:?" in env["DATABASE_URL"]
    for name in ("web", "ws", "worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["redis"]["condition"] == depends["postgres"]["condition"] == "service_healthy"


def test_compose_refuses_to_start_without_a_database_password():
    """No default password anywhere: without POSTGRES_PASSWORD compose stops, naming it."""
    services = compose()["services"]
    password = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert password == "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    text = (ROOT / "docker-compose.yml").read_text()
    uses = re.findall(r"\$\{POSTGRES_PASSWORD[^}]*\}", text)
    assert len(uses) >= 2 and set(uses) == {password}
    for name in ("web", "ws", "worker", "beat", "migrate"):
        with pytest.raises(AssertionError, match="POSTGRES_PASSWORD is required"):
            interpolate(services[name]["environment"]["DATABASE_URL"], {"SECRET_KEY": "x"})


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable substitution for the forms the file uses: ${VAR}, ${VAR:-default}, ${VAR:?error}."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        if env.get(name):
            return env[name]
        assert op != ":?", f"{name} is required"
        return arg if op == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


@pytest.mark.parametrize(
    "operator_hosts", [None, "queue.example.com,www.queue.example.com", ".example.com", "*"], ids=str
)
def test_the_web_healthcheck_passes_against_the_web_command_with_the_compose_environment(
    tmp_path, operator_hosts, settings
):
    """Start the web service's own command (granian, one worker, on a free port) with the environment
    compose gives it (Redis pointed at the test's), then run its healthcheck as Docker would: it must pass
    for the operator's hosts. The check asks /readyz: with the web's Redis gone it fails."""
    assert web_healthcheck_passes(tmp_path, operator_hosts, settings.REDIS_URL)


def test_the_web_healthcheck_fails_while_the_web_cannot_reach_redis(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = probe.getsockname()[1]
    assert not web_healthcheck_passes(tmp_path, None, f"redis://127.0.0.1:{nobody}/0", retries=1)


def web_healthcheck_passes(tmp_path: Path, operator_hosts: str | None, redis_url: str, retries: int = 0) -> bool:
    web = compose()["services"]["web"]
    operator = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "POSTGRES_PASSWORD": secrets.token_urlsafe(16),
        **({"ALLOWED_HOSTS": operator_hosts} if operator_hosts else {}),
    }
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "HTTPS", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    env.update({name: interpolate(str(value), operator) for name, value in web["environment"].items()})
    assert env["REDIS_URL"] == "redis://redis:6379/0" and env["PROMETHEUS_MULTIPROC_DIR"] == "/run/metrics"
    assert "/run/metrics" in web["tmpfs"]  # a fresh, empty directory at every start of the container
    (tmp_path / "metrics").mkdir(exist_ok=True)
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        WR_VAR_DIR=str(tmp_path),
        REDIS_URL=redis_url,
        CACHE_URL=redis_url,
        WR_REDIS_PREFIX=f"wrdeploy{secrets.token_hex(4)}",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"),
    )
    assert env["HTTPS"] == "1" and env["BEHIND_PROXY"] == "1"  # production: SSL redirect, proxy headers

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = web["command"]
    command = list(command)
    assert (command[command.index("--host") + 1], command[command.index("--port") + 1]) == ("0.0.0.0", "8000")  # noqa: S104
    command[command.index("--host") + 1], command[command.index("--port") + 1] = "127.0.0.1", str(port)
    command[command.index("--workers") + 1] = "1"
    check = web["healthcheck"]["test"]
    assert check[0] == "CMD" and "127.0.0.1:8000/readyz" in check[-1]
    check = [part.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for part in check[1:]]

    server = subprocess.Popen(
        [str(Path(sys.executable).parent / command[0]), *command[1:]],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the web server did not start"
                time.sleep(0.2)
        # As Docker runs it: every `interval`, unhealthy only after `retries` failures in a row (a worker
        # still importing Django on a loaded machine can miss the check's 3 s timeout once).
        for _ in range(retries or web["healthcheck"]["retries"]):
            result = subprocess.run([sys.executable, *check[1:]], env=env, capture_output=True, text=True, timeout=20)
            if result.returncode == 0:
                return True
            time.sleep(2)
        assert "503" in result.stderr, result.stderr  # not ready (not a refused connection or a 400)
        return False
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("role", ["worker", "beat"])
def test_the_worker_and_beat_healthchecks_tell_stalled_from_alive(role, settings):
    """The compose health check, run as Docker would with the service's environment (Redis pointed at the
    test's): unhealthy while the marks are stale, healthy once the role has left a fresh one."""
    from queueing import services as engine

    service = compose()["services"][role]
    check = service["healthcheck"]["test"]
    assert check[:4] == ["CMD", "python", "-m", "waitingroom_site.liveness"]
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DJANGO_SETTINGS_MODULE")}
    operator = {"SECRET_KEY": "x", "POSTGRES_PASSWORD": "x"}
    env.update({name: interpolate(str(value), operator) for name, value in service["environment"].items()})
    env.update(REDIS_URL=settings.REDIS_URL, WR_REDIS_PREFIX=settings.WR_REDIS_PREFIX)

    def healthy() -> bool:
        result = subprocess.run([sys.executable, *check[2:]], env=env, capture_output=True, text=True, timeout=30)
        return result.returncode == 0

    now = time.time()
    engine.beat_alive_mark(now=now - 120)
    engine.worker_alive_mark(f"worker@{socket.gethostname()}", now=now - 120)
    if role == "worker":
        engine.beat_alive_mark(now=now)  # ticks are sent; this worker ran none for two minutes
    assert not healthy()
    engine.beat_alive_mark()
    engine.worker_alive_mark(f"worker@{socket.gethostname()}")
    assert healthy()


APP_SERVICES = ("web", "ws", "worker", "beat")  # the processes that touch the live state


def compose_merged(*names: str) -> dict:
    """The files merged as `docker compose -f a.yml -f b.yml` merges them, for what these files hold: mappings
    merged key by key, anything else in a later file replacing the earlier one's. (Compose merges some lists,
    ports and volumes, by key instead: the assertion keeps the override from setting a list on a service
    the base file defines, so this merge and compose's agree.)"""
    files = [yaml.safe_load((ROOT / name).read_text()) for name in names]
    for later in files[1:]:
        for name, service in later.get("services", {}).items():
            if name in files[0]["services"]:
                assert all(isinstance(value, dict) for value in service.values()), (name, service)

    def merge(base: object, override: object) -> object:
        if isinstance(base, dict) and isinstance(override, dict):
            return {key: merge(base[key], value) if key in base else value for key, value in override.items()} | {
                key: value for key, value in base.items() if key not in override
            }
        return override

    merged: dict = files[0]
    for later in files[1:]:
        merged = merge(merged, later)  # type: ignore[assignment]
    return merged


def cluster_compose() -> dict:
    return compose_merged("docker-compose.yml", "docker-compose.cluster.yml")


def cluster_nodes(services: dict) -> dict[str, dict]:
    """The services that run a redis-server in cluster mode, by name."""
    return {
        name: service
        for name, service in services.items()
        if service.get("command", [""])[0] == "redis-server" and "--cluster-enabled" in service["command"]
    }


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def compose_unescaped(text: str) -> str:
    """What compose hands the container for a value of the file: `$$` is a literal `$`. A lone `$` would be
    compose's own interpolation (a variable of the host, empty if unset), never the shell's."""
    assert re.search(r"(?<!\$)\$(?!\$)", text.replace("$$", "")) is None, "an unescaped $ in " + text
    return text.replace("$$", "$")


def test_the_cluster_variant_runs_six_nodes_in_cluster_mode_with_an_append_only_file_each():
    services = cluster_compose()["services"]
    nodes = cluster_nodes(services)
    assert len(nodes) == 6
    addresses, volumes = set(), set()
    for service in nodes.values():
        command = service["command"]
        assert flag(command, "--cluster-enabled") == "yes"
        assert flag(command, "--appendonly") == "yes"
        assert int(flag(command, "--cluster-node-timeout")) <= 5000  # small: a replica takes over in seconds
        assert service["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
        (volume,) = service["volumes"]
        assert volume.endswith(":/data")  # the append-only file and nodes.conf (the image's working directory)
        volumes.add(volume.split(":")[0])
        addresses.add(service["networks"]["redis-cluster"]["ipv4_address"])
    assert len(volumes) == len(addresses) == 6  # a volume and a fixed address each
    subnet = cluster_compose()["networks"]["redis-cluster"]["ipam"]["config"][0]
    network, handed_out = ipaddress.ip_network(subnet["subnet"]), ipaddress.ip_network(subnet["ip_range"])
    for address in map(ipaddress.ip_address, addresses):  # fixed, in the subnet, never handed to another
        assert address in network and address not in handed_out
    assert "redis" in services and "--cluster-enabled" not in services["redis"]["command"]  # still standalone


def test_the_cluster_create_service_names_all_six_nodes_with_one_replica_each():
    services = cluster_compose()["services"]
    nodes = cluster_nodes(services)
    create = services["redis-cluster-create"]
    shell, dash_c, script, _name, *addresses = create["command"]
    assert (shell, dash_c) == ("sh", "-c")
    script = compose_unescaped(script)
    assert 'redis-cli --cluster create "$@" --cluster-replicas 1 --cluster-yes' in script
    fixed = {
        f"{node['networks']['redis-cluster']['ipv4_address']}:{flag(node['command'], '--port')}"
        for node in nodes.values()
    }
    assert len(addresses) == 6 and set(addresses) == fixed  # CLUSTER MEET takes addresses, not names
    # Made once: a cluster already ok is left alone (the check comes before the create).
    assert script.index("cluster_state:ok") < script.index("--cluster create")
    assert create["depends_on"] == {name: {"condition": "service_healthy"} for name in nodes}
    assert create["restart"] == "no" and "redis-cluster" in create["networks"]


def test_the_app_services_keep_the_standalone_redis_and_get_the_cluster_for_the_live_state():
    services = cluster_compose()["services"]
    nodes = cluster_nodes(services)
    for name in APP_SERVICES:
        service = services[name]
        env = service["environment"]
        named = [part.rpartition(":") for part in env["REDIS_CLUSTER_NODES"].split(",")]
        assert {host for host, _, _ in named} == set(nodes), name  # every node, and nothing else
        for host, _, port in named:
            assert port == flag(nodes[host]["command"], "--port")
        # The channel layer, the Celery broker and the cache stay on the standalone Redis.
        assert env["REDIS_URL"] == "redis://redis:6379/0" and env["CACHE_URL"] == "redis://redis:6379/1"
        assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")  # the base file's environment is kept
        depends = service["depends_on"]
        assert depends["redis-cluster-create"]["condition"] == "service_completed_successfully"
        assert depends["redis"]["condition"] == "service_healthy"  # the base file's dependencies are kept
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert {"default", "redis-cluster"} <= set(service["networks"])  # the nodes' network and the others'
    assert services["worker"]["environment"]["WR_WORKER_NAME"] == "worker@%h"
    assert services["web"]["command"] == compose()["services"]["web"]["command"]  # nothing else changed
    assert "REDIS_CLUSTER_NODES" not in compose()["services"]["web"]["environment"]  # one Redis stays the default


def test_the_cluster_create_script_makes_the_cluster_once_and_then_leaves_it_alone(tmp_path):
    """The create service's own script, run by sh against six redis-servers started with the nodes' own
    command (free ports on 127.0.0.1): it makes a cluster of three masters, each with a replica; run again,
    it finds the cluster made and changes nothing."""
    services = cluster_compose()["services"]
    node_command = next(iter(cluster_nodes(services).values()))["command"]
    ports = devcluster.free_ports(6)
    processes = []
    try:
        for port in ports:
            command = [devredis.server_binary(), *node_command[1:]]
            command[command.index("--port") + 1] = str(port)
            (tmp_path / str(port)).mkdir()
            command += ["--bind", "127.0.0.1", "--dir", str(tmp_path / str(port)), "--daemonize", "no"]
            processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True))
        for port in ports:
            deadline = time.monotonic() + 30
            while not devredis.answers(f"redis://127.0.0.1:{port}/0"):
                assert time.monotonic() < deadline, f"no node on {port}"
                time.sleep(0.05)
        shell, dash_c, script, name, *_ = services["redis-cluster-create"]["command"]
        run = [shell, dash_c, compose_unescaped(script), name, *(f"127.0.0.1:{port}" for port in ports)]

        first = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "[OK] All 16384 slots covered" in first.stdout
        cluster = devcluster.LocalCluster(tmp_path, processes=dict(zip(ports, processes, strict=True)))
        assert cluster.healthy() and len(cluster.master_ports()) == 3

        def current_epoch() -> list[str]:
            return re.findall(r"cluster_current_epoch:(\d+)", cluster.info(ports[0], "cluster", "info"))

        made = current_epoch()

        again = subprocess.run(run, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "made already" in again.stdout and "--cluster" not in again.stdout
        assert "Performing hash slots allocation" not in again.stdout
        assert current_epoch() == made
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)


def test_the_proxy_config_forwards_to_the_web_service():
    services = compose()["services"]
    mount = services["proxy"]["volumes"][0].split(":")[0]
    config = (ROOT / mount).read_text()
    assert "server web:8000" in config and "proxy_pass http://web" in config
    websockets = config[config.index("location /ws/") :].split("}")[0]
    assert "proxy_pass http://ws" in websockets and "Upgrade $http_upgrade" in websockets
    # The proxy adds the client's address, and the app believes it from the compose network only.
    assert config.count("X-Forwarded-For $proxy_add_x_forwarded_for") >= 2
    # Issue 50, item 10: every private range was trusted, so a client reaching the app from one (another
    # container, a host on the same private network) wrote its own X-Forwarded-For. Only nginx's address is.
    network = compose()["networks"]["default"]["ipam"]["config"][0]
    proxy_address = services["proxy"]["networks"]["default"]["ipv4_address"]
    subnet, dynamic = ipaddress.ip_network(network["subnet"]), ipaddress.ip_network(network["ip_range"])
    assert ipaddress.ip_address(proxy_address) in subnet and ipaddress.ip_address(proxy_address) not in dynamic
    for name in ("web", "ws", "worker", "beat"):
        trusted = services[name]["environment"]["WR_TRUSTED_PROXIES"]
        assert trusted == f"${{WR_TRUSTED_PROXIES:-{proxy_address}}}", (name, trusted)
    ws = services["ws"]["command"]
    assert ws[ws.index("--forwarded-allow-ips") + 1] == f"${{WR_TRUSTED_PROXIES:-{proxy_address}}}"
    metrics = services["web"]["environment"]["WR_METRICS_NETWORKS"]
    assert metrics == f"${{WR_METRICS_NETWORKS:-{subnet},127.0.0.0/8}}"


def test_the_dockerfile_installs_the_locked_requirements_and_runs_as_a_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements.lock" in dockerfile
    assert "collectstatic" in dockerfile and "\nUSER " in dockerfile
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            assert "==" in line, line


def test_the_rate_limits_in_the_environment_change_only_the_entries_they_name(tmp_path):
    """Issue 47: WR_RATE_LIMITS replaced the whole table, so lifting the join limit with {"join": null}
    silently removed the status, staff, auth and protected limits too."""
    code = "from django.conf import settings as s; import json; print(json.dumps(s.WR_RATE_LIMITS, sort_keys=True))"
    env = production_env(tmp_path)
    defaults = json.loads(manage("shell", "--no-imports", "-c", code, env=env).stdout)
    lifted = manage("shell", "--no-imports", "-c", code, env=dict(env, WR_RATE_LIMITS='{"join": null}'))
    assert json.loads(lifted.stdout) == {**defaults, "join": None}, lifted.stderr
    assert defaults["status"] and defaults["auth"] and defaults["protected"] and defaults["staff"]
    for wrong in ("[1]", '{"join": 5}', "{join: null}"):
        refused = manage("check", env=dict(env, WR_RATE_LIMITS=wrong))
        assert refused.returncode != 0 and "WR_RATE_LIMITS" in refused.stderr, (wrong, refused.stderr)


def test_compose_runs_the_redis_version_the_tests_run():
    """Compose's Redis images (the standalone one, the cluster's nodes and its create service) are pinned to a
    full version whose major.minor is the redis-server's the tests run against (Debian's)."""
    tested = devredis.server_version(devredis.server_binary())[:2]
    services = cluster_compose()["services"]
    images = {name: service["image"] for name, service in services.items() if "redis:" in service.get("image", "")}
    assert {"redis", "redis-cluster-create", *cluster_nodes(services)} <= set(images), images
    for name, image in images.items():
        pinned = re.fullmatch(r"redis:(\d+)\.(\d+)\.(\d+)(-alpine)?", image)
        assert pinned is not None, (name, image)  # no floating tag: what runs is what was tested
        assert (int(pinned.group(1)), int(pinned.group(2))) == tested, (name, image, tested)


def test_compose_runs_alertmanager_on_request_and_prometheus_sends_it_the_alerts():
    services = compose()["services"]
    alertmanager = services["alertmanager"]
    assert alertmanager["profiles"] == services["prometheus"]["profiles"] == ["monitoring"]
    assert re.fullmatch(r"prom/alertmanager:v\d+\.\d+\.\d+", alertmanager["image"]), alertmanager["image"]
    assert all(port.startswith("127.0.0.1:") and port.endswith(":9093") for port in alertmanager["ports"])
    # The config it is started with is the file mounted there: the shipped one unless ALERTMANAGER_CONFIG
    # names the operator's own.
    config_flag = next(arg for arg in alertmanager["command"] if arg.startswith("--config.file="))
    mounted = {volume.removesuffix(":ro").rpartition(":")[2]: volume for volume in alertmanager["volumes"]}
    source = mounted[config_flag.removeprefix("--config.file=")].removesuffix(":ro").rpartition(":")[0]
    assert interpolate(source, {}) == "./deploy/alertmanager/alertmanager.yml"
    assert interpolate(source, {"ALERTMANAGER_CONFIG": "./mine.yml"}) == "./mine.yml"
    assert (ROOT / interpolate(source, {})).is_file()
    assert not any(arg.startswith("--web.listen-address") for arg in alertmanager["command"])  # :9093 then
    # Prometheus's alerting block names that service on that port.
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = [
        target
        for manager in scrape["alerting"]["alertmanagers"]
        for static in manager["static_configs"]
        for target in static["targets"]
    ]
    assert targets == ["alertmanager:9093"]
    assert any(volume.startswith("./deploy/prometheus:") for volume in services["prometheus"]["volumes"])
