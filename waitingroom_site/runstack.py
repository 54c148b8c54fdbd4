"""Run the whole product on one machine: web (gunicorn), websockets (uvicorn), a Celery worker and Celery
beat, plus an embedded Redis when no other is available. Ctrl-C (or SIGTERM) stops them all, in order,
and waits for them.

    python -m waitingroom_site.runstack [--setup] [--host 127.0.0.1] [--port 8000] [--ws-port 8001]

--setup first migrates, collects static files and creates the demo queue and staff login.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import devredis

BASE_DIR = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def _manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([PYTHON, str(BASE_DIR / "manage.py"), *args], env=env, check=True, cwd=BASE_DIR)


def _bin(name: str) -> str:
    candidate = Path(PYTHON).parent / name
    return str(candidate) if candidate.exists() else name


def commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """What runs, by name. Web is gunicorn (WSGI): Django under an ASGI server costs more per request
    here, since its ASGI handler runs each request in a thread (bench/RESULTS.md)."""
    procs = {
        "web": [
            _bin("gunicorn"),
            "waitingroom_site.wsgi",
            *("--bind", f"{args.host}:{args.port}"),
            *("--workers", str(args.web_workers)),
            *("--worker-class", args.web_worker_class),
            *("--threads", str(args.web_threads)),
            *("--keep-alive", "5"),
            *("--graceful-timeout", "5"),
            *(("--access-logfile", "-") if args.access_log else ()),
        ],
        # Websockets only: the pages learn its address from WR_WS_BASE_URL (the API's ws_url).
        "ws": [
            _bin("uvicorn"),
            "waitingroom_site.asgi:application",
            *("--host", args.host),
            *("--port", str(args.ws_port)),
            # Events are a few hundred bytes: compressing them saves little and costs two zlib contexts
            # (tens of KB) and CPU per socket (bench/RESULTS.md, push latency).
            *("--ws-per-message-deflate", "false"),
            *("--log-level", "warning"),
            "--no-access-log",
        ],
        "worker": [
            _bin("celery"),
            "-A",
            "waitingroom_site",
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            str(args.worker_concurrency),
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"worker-{os.getpid()}@%h",
        ],
        "beat": [_bin("celery"), "-A", "waitingroom_site", "beat", "--loglevel", "INFO", "--pidfile="],
    }
    return {name: cmd for name, cmd in procs.items() if name not in args.skip}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="migrate, collect static, create the demo")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    # Sync workers, one more than the cores: the best throughput and tail latency measured here
    # (threads in a worker hand the GIL back and forth around every Redis call; bench/RESULTS.md).
    parser.add_argument(
        "--web-workers", type=int, default=int(os.environ.get("WEB_WORKERS", (os.cpu_count() or 1) + 1))
    )
    parser.add_argument("--web-threads", type=int, default=int(os.environ.get("WEB_THREADS", "1")))
    parser.add_argument("--web-worker-class", default=os.environ.get("WEB_WORKER_CLASS", "sync"))
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--ws-port", type=int, default=int(os.environ.get("WS_PORT", "0")) or None)
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument("--skip", action="append", default=[], choices=["web", "ws", "worker", "beat"])
    parser.add_argument("--var-dir", default=os.environ.get("WR_VAR_DIR", str(BASE_DIR / "var")))
    args = parser.parse_args(argv)
    if args.ws_port is None:
        args.ws_port = args.port + 1

    var_dir = Path(args.var_dir)
    var_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, WR_VAR_DIR=str(var_dir))
    children: dict[str, subprocess.Popen[bytes]] = {}

    redis_url = devredis.resolve()
    if redis_url is None:
        process, redis_url = devredis.start_embedded(var_dir / "redis", daemonize=False)
        assert process is not None
        children["redis"] = process
        print(f"[runstack] started an embedded Redis at {redis_url} (data in {var_dir / 'redis'})", flush=True)
    env["REDIS_URL"] = redis_url
    env.setdefault("WR_WS_BASE_URL", f"ws://{args.host}:{args.ws_port}")

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    code = 0
    try:
        if args.setup:
            _manage("migrate", "--noinput", "-v", "0", env=env)
            _manage("collectstatic", "--noinput", "-v", "0", env=env)
            _manage("setup_demo", env=env)
        for name, cmd in commands(args).items():
            # Own sessions: a Ctrl-C reaches only this supervisor, which then stops each child in turn.
            children[name] = subprocess.Popen(cmd, env=env, cwd=BASE_DIR, start_new_session=True)
        print(
            f"[runstack] Waiting Room on http://{args.host}:{args.port}/  (Redis {redis_url})\n"
            f"[runstack]   waiting page: http://{args.host}:{args.port}/q/demo/   websockets: {env['WR_WS_BASE_URL']}\n"
            f"[runstack]   join:  curl -X POST http://{args.host}:{args.port}/api/v1/queues/demo/join\n"
            f"[runstack]   admin: http://{args.host}:{args.port}/admin/   API docs: /api/docs/\n"
            "[runstack] Ctrl-C stops everything.",
            flush=True,
        )
        while not stopping:
            for name, child in children.items():
                if child.poll() is not None:
                    print(f"[runstack] {name} exited with {child.returncode}; stopping.", flush=True)
                    code = child.returncode or 1
                    stopping = True
                    break
            time.sleep(0.2)
    except subprocess.CalledProcessError as exc:
        print(f"[runstack] setup failed: {exc}", flush=True)
        code = exc.returncode or 1
    finally:
        _stop_all(children)
    return code


def _stop_all(children: dict[str, subprocess.Popen[bytes]]) -> None:
    # Web first (no new work), then websockets, beat and worker, Redis last.
    first = ("web", "ws", "beat", "worker")
    order = [n for n in first if n in children] + [n for n in children if n not in first]
    for name in order:
        child = children[name]
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    print("[runstack] stopped.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
