"""A protected site's health reports, for the adaptive outflow (settings.WR_HEALTH_REPORT): in ``local``
mode straight into Redis (services.site_health_report), in ``remote`` mode batched per process and sent to
the waiting room's health endpoint by a background thread. Reporting never slows or breaks the page: a
failed report is logged and dropped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from django.conf import settings

logger = logging.getLogger(__name__)


@dataclass
class _Batch:
    requests: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)


class HealthReporter:
    """Remote mode: this process's protected responses, sent to the waiting room's health endpoint every
    WR_HEALTH_FLUSH_SECONDS, or sooner once WR_HEALTH_FLUSH_REQUESTS are waiting, by a background thread
    (the request only appends to a list). A batch that cannot be sent is dropped: the adaptation judges
    the last few seconds, and stale figures would mislead it. Past SAMPLE_CAP response times a batch keeps
    a uniform random sample of them (the report says it stands for all its requests)."""

    SAMPLE_CAP = 2000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._batches: dict[str, _Batch] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._random = random.Random()

    def add(self, slug: str, latency_ms: float, error: bool) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child (gunicorn): its own batches and thread
                self._pid, self._batches, self._thread, self._wake = os.getpid(), {}, None, threading.Event()
            batch = self._batches.setdefault(slug, _Batch())
            batch.requests += 1
            batch.errors += int(error)
            if len(batch.latencies_ms) < self.SAMPLE_CAP:
                batch.latencies_ms.append(latency_ms)
            else:  # reservoir sampling: every response time so far has the same chance to be kept
                slot = self._random.randrange(batch.requests)
                if slot < self.SAMPLE_CAP:
                    batch.latencies_ms[slot] = latency_ms
            if batch.requests >= settings.WR_HEALTH_FLUSH_REQUESTS:
                self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, args=(self._wake,), name="wr-health", daemon=True)
                self._thread.start()

    def _run(self, wake: threading.Event) -> None:
        while True:
            wake.wait(settings.WR_HEALTH_FLUSH_SECONDS)
            wake.clear()
            try:
                self.flush()
            except Exception:  # never let the thread die: the next round tries again
                logger.exception("health report failed")

    def flush(self) -> int:
        """Send every waiting batch now; returns how many were accepted."""
        with self._lock:
            batches, self._batches = self._batches, {}
        return sum(_health_send(slug, batch) for slug, batch in batches.items())


def _health_send(slug: str, batch: _Batch) -> bool:
    if not settings.WR_API_URL.startswith(("https://", "http://")):
        return False
    body = {
        "requests": batch.requests,
        "errors": batch.errors,
        "latency_ms": [round(ms, 2) for ms in batch.latencies_ms],
    }
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{settings.WR_API_URL.rstrip('/')}/api/v1/queues/{slug}/health",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Api-Key {settings.WR_API_KEY}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=3):  # noqa: S310
            return True
    except urllib.error.HTTPError as exc:
        level = logging.ERROR if exc.code in (401, 403) else logging.WARNING
        logger.log(level, "the waiting room refused a health report for queue %s (HTTP %s)", slug, exc.code)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        logger.warning("health report for queue %s not sent: %s", slug, exc)
    return False


def health_report_mode() -> str:
    """Where protected responses are reported: local | remote | off (WR_HEALTH_REPORT, default "auto":
    local when verifying locally, else remote when WR_API_URL and WR_API_KEY are set, else off)."""
    mode = settings.WR_HEALTH_REPORT
    if mode != "auto":
        return mode
    if settings.WR_VERIFY_MODE == "local":
        return "local"
    return "remote" if settings.WR_API_URL and settings.WR_API_KEY else "off"
