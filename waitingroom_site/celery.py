"""The Celery app: admission ticks and cleanup run here, scheduled by django-celery-beat.

The beat notes in Redis each admission tick it sends, so a worker that stops running them while they are
sent is seen as stalled (waitingroom_site/liveness.py), not confused with a beat that stopped sending.
"""

import logging
import os
import time
from typing import Any

from celery import Celery
from celery.signals import (
    after_task_publish,
    beat_init,
    before_task_publish,
    task_failure,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
)

from queueing import instruments, logcontext

from . import kombu_patches, orphans

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")
kombu_patches.apply()  # a worker survives a Redis restart (see the module)

app = Celery("waitingroom")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

TICK_TASK = "queueing.tasks.admission_tick"
log = logging.getLogger(__name__)
_in_beat = False


@beat_init.connect
def _beat_started(**_: Any) -> None:
    global _in_beat
    _in_beat = True


@worker_init.connect
def _worker_started(**_: Any) -> None:
    """Once its parent (bin/run's supervisor) is gone, a worker's warm shutdown is bounded (orphans)."""
    from django.conf import settings

    orphans.exit_when_orphaned(settings.WR_WORKER_ORPHAN_GRACE_SECONDS)


@worker_process_init.connect
def _pool_process_started(**_: Any) -> None:
    """A pool process ends when its worker's main process is gone, however that went (orphans)."""
    orphans.die_with_parent()


@after_task_publish.connect
def _tick_sent(sender: str | None = None, **_: Any) -> None:
    if not _in_beat or sender != TICK_TASK:
        return
    from queueing import services

    try:
        services.beat_alive_mark()
    except Exception:  # the tick went out; a missing mark only makes the beat look stalled later
        log.warning("could not note the tick sent in Redis", exc_info=True)


@before_task_publish.connect
def _carry_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """A task published while a request is served carries its id (README "Logs"); every task the time it
    was sent (its lag, README "Metrics")."""
    if headers is None:
        return
    request_id = logcontext.current("request_id")
    if request_id:
        headers["request_id"] = request_id
    headers["sent_at"] = time.time()


@task_prerun.connect
def _task_context(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """Each task's lines carry the id of the request that caused it, or else the task's own id."""
    request = getattr(task, "request", None)
    carried = _header(request, "request_id")
    logcontext.bind(request_id=str(carried or task_id or ""), queue="", ticket="")
    _started[task_id or ""] = time.perf_counter()
    sent_at = _header(request, "sent_at")
    if getattr(task, "name", "") == TICK_TASK and isinstance(sent_at, int | float):
        instruments.tick_lag().observe(max(0.0, time.time() - sent_at))


def _header(request: Any, name: str) -> Any:
    """A header the task's message carries (Celery sets it on the request, or keeps it in its headers)."""
    return getattr(request, name, None) or (getattr(request, "headers", None) or {}).get(name)


_started: dict[str, float] = {}  # task id: when it started (perf_counter), until it ends


@task_postrun.connect
def _task_context_end(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    logcontext.bind(request_id="", queue="", ticket="")
    started = _started.pop(task_id or "", None)
    if started is None:
        return
    name, seconds = str(getattr(task, "name", "") or "unknown"), time.perf_counter() - started
    instruments.task_ran(name, seconds)
    if name == TICK_TASK:
        instruments.tick_seconds().observe(seconds)


@task_failure.connect
def _task_failed(sender: Any = None, **_: Any) -> None:
    instruments.task_failures.labels(str(getattr(sender, "name", "") or "unknown")).inc()
