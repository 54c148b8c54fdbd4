"""The Celery app: admission ticks and cleanup run here, scheduled by django-celery-beat.

The beat notes in Redis each admission tick it sends, so a worker that stops running them while they are
sent is seen as stalled (waitingroom_site/liveness.py), not confused with a beat that stopped sending.
"""

import logging
import os
from typing import Any

from celery import Celery
from celery.signals import after_task_publish, beat_init

from . import kombu_patches

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


@after_task_publish.connect
def _tick_sent(sender: str | None = None, **_: Any) -> None:
    if not _in_beat or sender != TICK_TASK:
        return
    from queueing import services

    try:
        services.beat_alive_mark()
    except Exception:  # the tick went out; a missing mark only makes the beat look stalled later
        log.warning("could not note the tick sent in Redis", exc_info=True)
