"""Finding a Redis for bin/run and bin/test: REDIS_URL, else 127.0.0.1:6379 if it answers, else an
embedded redis-server (Debian's, Redis 7.0 or later) with its data under var/."""

from __future__ import annotations

import pytest
import redis

from waitingroom_site import devredis


def test_redis_url_wins(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://example.invalid:1/3")
    assert devredis.resolve() == "redis://example.invalid:1/3"


def test_a_local_redis_that_answers_is_used(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(devredis, "answers", lambda url, timeout=0.5: url == devredis.DEFAULT_LOCAL)
    assert devredis.resolve() == devredis.DEFAULT_LOCAL


def test_without_either_an_embedded_one_is_needed(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(devredis, "answers", lambda url, timeout=0.5: False)
    assert devredis.resolve() is None


def test_the_embedded_redis_is_one_with_redis_functions_and_an_older_one_is_refused(tmp_path):
    binary = devredis.server_binary()
    assert devredis.server_version(binary) >= (7, 0)
    old = tmp_path / "redis-server"
    old.write_text("#!/bin/sh\necho 'Redis server v=6.2.9 sha=00000000:0 malloc=libc bits=64'\n")
    old.chmod(0o755)
    assert devredis.server_version(str(old)) == (6, 2, 9)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", str(tmp_path))
        with pytest.raises(RuntimeError, match=r"7\.0 or later"):
            devredis.server_binary()


def test_the_embedded_redis_starts_keeps_an_append_only_file_and_stops(tmp_path):
    process, url = devredis.start_embedded(tmp_path, daemonize=False)
    assert process is not None
    try:
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.set("probe", "1")
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("dir")["dir"] == str(tmp_path.resolve())
        client.close()
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert not devredis.answers(url)


def test_stop_only_kills_a_redis_server(tmp_path):
    (tmp_path / "redis.pid").write_text("1")  # pid 1 is not a redis-server
    devredis.stop_embedded(tmp_path)
    assert not (tmp_path / "redis.pid").exists()


def test_answers_detects_a_live_server(settings):
    assert devredis.answers(settings.REDIS_URL)
    assert not devredis.answers("redis://127.0.0.1:1/0")
