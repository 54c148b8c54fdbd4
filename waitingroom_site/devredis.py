"""Find a Redis for a local run or a test run: REDIS_URL if set; else 127.0.0.1:6379 if it answers; else
an embedded redis-server (Debian's, 7.0 or later) started under var/.

Used by `python -m waitingroom_site.runstack` and by bin/test:

    python -m waitingroom_site.devredis start --dir var/redis-test   # prints the URL to use
    python -m waitingroom_site.devredis stop --dir var/redis-test    # stops it, if it started one
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import redis

DEFAULT_LOCAL = "redis://127.0.0.1:6379/0"


def answers(url: str, timeout: float = 0.5) -> bool:
    """True if a Redis server at `url` replies to PING (plain socket: works before Django loads)."""
    parts = urlsplit(url)
    try:
        if parts.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(parts.path)
        else:
            sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=timeout)
        with sock:
            sock.settimeout(timeout)
            if parts.password:
                user = parts.username or "default"
                sock.sendall(f"AUTH {user} {parts.password}\r\n".encode())
                sock.recv(64)
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def cluster_node(url: str) -> bool:
    """Whether the Redis at `url` runs in cluster mode: then it cannot be REDIS_URL (Celery's Redis broker
    and the channel layer speak to one server; the live state goes to a cluster by REDIS_CLUSTER_NODES)."""
    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            return bool(client.info("cluster").get("cluster_enabled"))
    except (redis.RedisError, OSError):
        return False


# The scripts are a Redis Functions library (queueing/store/connection.py): FUNCTION LOAD came in 7.0.
MINIMUM_VERSION = (7, 0)


def server_version(binary: str) -> tuple[int, ...]:
    """The version a redis-server binary reports ("Redis server v=7.0.15 sha=..."), as numbers."""
    output = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", output)
    if not found:
        raise RuntimeError(f"{binary} --version said {output.strip()!r}: not a redis-server")
    return tuple(int(part) for part in found.groups())


def server_binary() -> str:
    """Debian's redis-server (bin/_bootstrap.sh installs it when it is missing), Redis 7.0 or later."""
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("No redis-server: install Redis 7.0 or later (Debian: apt-get install redis-server).")
    if server_version(found) < MINIMUM_VERSION:
        raise RuntimeError(f"{found} is Redis {'.'.join(map(str, server_version(found)))}; 7.0 or later is needed.")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def embedded_command(directory: Path, port: int, *, daemonize: bool) -> list[str]:
    """The redis-server command line of an embedded Redis keeping its data (AOF) in `directory`."""
    directory = directory.resolve()
    return [
        server_binary(),
        *("--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory)),
        *("--appendonly", "yes", "--save", ""),
        *("--logfile", str(directory / "redis.log"), "--pidfile", str(directory / "redis.pid")),
        *("--daemonize", "yes" if daemonize else "no"),
    ]


def wait_until_it_answers(url: str, directory: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not answers(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"The embedded Redis did not start; see {directory / 'redis.log'}")
        time.sleep(0.05)


def start_embedded(
    directory: Path, *, daemonize: bool, port: int | None = None, preexec_fn: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[bytes] | None, str]:
    """Start a redis-server keeping its data (AOF) in `directory`; returns (process, url)."""
    directory.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    command = embedded_command(directory, port, daemonize=daemonize)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec_fn)
    url = f"redis://127.0.0.1:{port}/0"
    wait_until_it_answers(url, directory)
    (directory / "url").write_text(url)
    if daemonize:
        process.wait()
        return None, url
    return process, url


def resolve() -> str | None:
    """The Redis to use, or None when an embedded one must be started."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    if answers(DEFAULT_LOCAL):
        return DEFAULT_LOCAL
    return None


def stop_embedded(directory: Path) -> None:
    pidfile = directory / "redis.pid"
    if not pidfile.exists():
        return
    try:
        pid = int(pidfile.read_text().strip())
        # A stale pidfile's number may belong to another process by now: only stop a redis-server.
        if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    pidfile.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", default="var/redis")
    args = parser.parse_args()
    directory = Path(args.dir)
    if args.action == "stop":
        stop_embedded(directory)
        return
    url = resolve()
    if url is not None:
        print(url)
        return
    _, url = start_embedded(directory, daemonize=True)
    print(url, file=sys.stdout)


if __name__ == "__main__":
    main()
