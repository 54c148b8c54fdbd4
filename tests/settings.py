"""Test settings: the real settings plus an isolated Redis database and key prefix per test process."""

import os
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

os.environ.setdefault("SECRET_KEY", "tests-only-" + "x" * 50)
os.environ.setdefault("HTTPS", "0")

from waitingroom_site.environment import celery_queues
from waitingroom_site.settings import *  # noqa: F403
from waitingroom_site.settings import REDIS_URL as _BASE_REDIS_URL
from waitingroom_site.settings import caches, channel_layers


def _with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


# Our own database number (never flushed: tests delete only keys under their own prefix).
REDIS_URL = _with_db(_BASE_REDIS_URL, os.environ.get("WR_TEST_REDIS_DB", "15"))
CELERY_BROKER_URL = REDIS_URL
# A process a test starts (a second protected site, say) is given its run (WR_TEST_RUN_ID): its keys, its cache.
_RUN_ID = os.environ.get("WR_TEST_RUN_ID") or uuid.uuid4().hex[:8]
WR_REDIS_PREFIX = f"wrt{_RUN_ID}"
CHANNEL_LAYERS = channel_layers(REDIS_URL, WR_REDIS_PREFIX)
CACHE_URL = REDIS_URL
CACHES = caches(CACHE_URL, WR_REDIS_PREFIX)  # under the run's prefix: cleaned up with its keys
CELERY_TASK_DEFAULT_QUEUE = f"wrt{_RUN_ID}"
WR_ALERT_PRIVATE_TARGETS = True  # the tests' receivers listen on 127.0.0.1 (test_alerts checks it off)
WR_TICK_QUEUE, CELERY_TASK_QUEUES, CELERY_TASK_ROUTES = celery_queues(CELERY_TASK_DEFAULT_QUEUE)

STATIC_ROOT = Path(tempfile.gettempdir()) / "waitingroom-test-static"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
# The websocket server's collector freeze is for long-running servers (the stack tests run it); the
# test process itself keeps Python's ordinary collection (test_consumers checks the freeze directly).
WR_WS_GC_FREEZE_SECONDS = 0
WR_WS_REPORT_SECONDS = 0  # so is the event loop's watch (tests/test_loopwatch.py checks it)
# No limits unless a test sets them (tests/test_ratelimit.py): many tests join and poll from one address
# far faster than any visitor would.
WR_RATE_LIMITS = {}
WR_DEMO = True
# The live state on the tests' own Redis Cluster only where a test asks for it (conftest.live_state, which
# also names it to the processes a test spawns).
REDIS_CLUSTER_NODES = os.environ.get("WR_TEST_CLUSTER_NODES", "")
# Turn notices by e-mail are offered (tests that send them point EMAIL_* at their own SMTP server).
WR_NOTIFY_BY_EMAIL = True
