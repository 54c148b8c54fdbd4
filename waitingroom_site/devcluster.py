"""A local Redis Cluster from the redis-server binary, for tests and benchmarks (README "Redis Cluster"):
masters and their replicas on free ports on 127.0.0.1, each node in a directory of its own, created with
`redis-cli --cluster create` as an operator would, and stopped by process id.

    python -m waitingroom_site.devcluster start --dir var/cluster   # prints REDIS_CLUSTER_NODES's value
    python -m waitingroom_site.devcluster stop --dir var/cluster    # stops the nodes it started

No persistence (a killed master's replica takes over: the failover is what the tests exercise).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .devredis import answers, server_binary

BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(count: int) -> list[int]:
    """`count` ports free on 127.0.0.1 whose bus ports (+10000) are free too."""
    found: list[int] = []
    while len(found) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + BUS_OFFSET < 65536 and port not in found and _port_free(port + BUS_OFFSET):
            found.append(port)
    return found


@dataclass
class LocalCluster:
    """`masters` masters with `replicas` replicas each; `node_timeout_ms` is the cluster-node-timeout (how
    long a master may be unreachable before its replica is promoted)."""

    directory: Path
    masters: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1000
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ports(self) -> list[int]:
        return sorted(self.processes)

    @property
    def nodes(self) -> str:
        """REDIS_CLUSTER_NODES's value: every node, host:port, comma-separated."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self, timeout: float = 30) -> LocalCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            while len(self.processes) < self.masters * (1 + self.replicas):
                self._start_node(free_ports(1)[0], timeout)
            ports = self.ports
            create = ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{port}" for port in ports)]
            create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
            self._wait(self.healthy, timeout, "the cluster to be ok on every node")
        except BaseException:
            self.stop()
            raise
        (self.directory / "nodes.json").write_text(json.dumps({str(p): proc.pid for p, proc in self.processes.items()}))
        return self

    def _start_node(self, port: int, timeout: float) -> None:
        """Start a node on `port`, if it is still free: another process may have taken it since it was
        found free (tests run side by side), and then the node that answers there is not this one."""
        process = self._spawn(port)
        deadline = time.monotonic() + timeout
        while not answers(f"redis://127.0.0.1:{port}/0"):
            if process.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if process.poll() is None and f"process_id:{process.pid}" in self.info(port, "info", "server"):
            self.processes[port] = process
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        if time.monotonic() > deadline:
            raise RuntimeError(f"A cluster node did not start on port {port}; see {self.directory / str(port)}")

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        command = [
            server_binary(),
            *("--bind", "127.0.0.1", "--port", str(port), "--dir", str(node_dir)),
            *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            *("--cluster-node-timeout", str(self.node_timeout_ms)),
            *("--appendonly", "no", "--save", ""),
            *("--logfile", str(node_dir / "redis.log"), "--daemonize", "no"),
        ]
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)

    @staticmethod
    def _wait(ready: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise RuntimeError(f"Timed out waiting for {what}")
            time.sleep(0.1)

    def info(self, port: int, *args: str) -> str:
        done = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=5)
        return done.stdout

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok with every slot assigned, and sees the others' roles agree."""
        for port, process in self.processes.items():
            if process.poll() is not None:
                continue
            info = self.info(port, "cluster", "info")
            if "cluster_state:ok" not in info or "cluster_slots_assigned:16384" not in info:
                return False
        return True

    def master_ports(self) -> list[int]:
        """The ports of the nodes serving slots now (as a live node sees it)."""
        for port, process in self.processes.items():
            if process.poll() is None:
                lines = self.info(port, "cluster", "nodes").splitlines()
                return sorted(
                    int(line.split()[1].split("@")[0].rsplit(":", 1)[1])
                    for line in lines
                    if "master" in line.split()[2] and "fail" not in line.split()[2] and len(line.split()) > 8
                )
        return []

    def kill(self, port: int) -> None:
        """SIGKILL one node (a crash)."""
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def stop_dir(directory: Path) -> None:
    """Stop the nodes a `start` run left under `directory` (by the process ids it wrote)."""
    found = directory / "nodes.json"
    if not found.exists():
        return
    for pid in json.loads(found.read_text()).values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)
    found.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    if args.action == "stop":
        stop_dir(args.dir)
        return
    if shutil.which("redis-cli") is None:
        sys.exit("No redis-cli: install Redis 7.0 or later (Debian: apt-get install redis-server).")
    cluster = LocalCluster(args.dir).start()
    for process in cluster.processes.values():
        process.returncode = 0  # left running: `stop` ends them
    print(cluster.nodes)


if __name__ == "__main__":
    main()
