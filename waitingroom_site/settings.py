"""Settings for Waiting Room, read from environment variables (12-factor).

Every setting has a secure default: without configuration the site runs with DEBUG off, HTTPS-only
cookies, HSTS and an SSL redirect. `bin/run` sets HTTPS=0 for a local, plain-HTTP demo. The README lists
every variable.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.crypto import salted_hmac

from waitingroom_site import apischema
from waitingroom_site.environment import (
    celery_queues,
    envbool,
    envfloat,
    envint,
    envlist,
    envtable,
    generated_secret,
    installation_environment,
    private_file,
    ws_origin,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("WR_VAR_DIR", BASE_DIR / "var"))
# One installation, one namespace: a command run beside bin/run (bin/manage, manage.py, celery) takes the
# Redis, key prefix, broker and database that bin/run kept in var/installation.env, unless its environment
# says otherwise (docs/configuration.md). A deployment (SECRET_KEY set) never reads that file.
INSTALLATION_SUPPLIED = installation_environment(VAR_DIR)

DEBUG = envbool("DEBUG", False)
# Development (DEBUG=1) serves plain HTTP unless HTTPS=1 says otherwise; production is HTTPS-only.
HTTPS = envbool("HTTPS", not DEBUG)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and not envbool("WR_ALLOW_GENERATED_SECRET", False):
        raise ImproperlyConfigured("SECRET_KEY must be set (or DEBUG=1 for development).")
    SECRET_KEY = generated_secret(VAR_DIR / "secret_key")
# Keys from before a rotation: what they signed (sessions, visitor cookies, tickets) is still accepted;
# nothing new is signed with them.
SECRET_KEY_FALLBACKS = envlist("SECRET_KEY_FALLBACKS", "")

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "rest_framework_api_key",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "channels",
    "waitingroom_site",
    "queueing",
    "admin_dashboard",
    "alerts",
]

MIDDLEWARE = [
    # First: its request id (README "Logs") is in every line logged while the request is served.
    "waitingroom_site.requestid.RequestIdMiddleware",
    # Times every request Django answers, by route (README "Metrics"; the hot path times its own).
    "waitingroom_site.metrics.MetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Serves the visitor hot path (status polls) without sessions, auth, CSRF or static machinery.
    "waitingroom_site.fastpath.FastPathMiddleware",
    # Every page (not the hot path's JSON above): Content-Security-Policy, below.
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The visitor's language (README "Languages"): the switcher's cookie, else Accept-Language.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Redis away (or a sign-out the session cache could not record): 503 and Retry-After, not 500.
    "waitingroom_site.unavailable.RedisUnavailableMiddleware",
    # Last, as django-axes asks: turns a locked-out login into its 429 page.
    "axes.middleware.AxesMiddleware",
]

# Content Security Policy (django-csp): scripts only from this site's own files (no inline script, no
# eval anywhere: the pages keep their data in attributes), websockets to wherever WR_WS_BASE_URL points.
# Inline styles stay allowed (Django admin and the API docs use style attributes); scripts are the risk.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],  # and the websocket server's origin, below (WR_WS_BASE_URL)
        "worker-src": ["'self'", "blob:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# django-axes first: it refuses a locked-out login before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "waitingroom_site.urls"
WSGI_APPLICATION = "waitingroom_site.wsgi.application"
ASGI_APPLICATION = "waitingroom_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"),
        conn_max_age=envint("DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, beat) share the file: wait for locks instead of failing. A
    # transaction that reads, then writes, while another process writes fails at once ("database is
    # locked") whatever the timeout, unless it takes the write lock when it begins (IMMEDIATE); WAL lets
    # readers carry on meanwhile.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=20, transaction_mode="IMMEDIATE", init_command="PRAGMA journal_mode=WAL;"
    )
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    _test_db = os.environ.get("WR_TEST_DB_PATH")
    if _test_db:
        DATABASES["default"]["TEST"] = {"NAME": _test_db}
    # The file holds the access tokens' private signing keys: this user's only, from its first byte (SQLite
    # gives its -wal and -shm files the same mode). No folder, no file: Django reports that as before.
    _db_file = Path(DATABASES["default"]["NAME"])
    if str(_db_file) != ":memory:" and not str(_db_file).startswith("file:") and _db_file.parent.is_dir():
        private_file(_db_file)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en"
# The visitor-facing pages' languages (complete catalogs under locale/; Arabic for the right-to-left layout).
LANGUAGES = [
    ("en", "English"),
    ("de", "Deutsch"),
    ("fr", "Français"),
    ("es", "Español"),
    ("ar", "العربية"),
]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "static"))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

LOGIN_URL = "/admin/login/"

# --- Security: secure by default, relaxed only by HTTPS=0 for a local plain-HTTP run. ---
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS and envbool("SECURE_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31536000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS and envbool("SECURE_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
if envbool("BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    USE_X_FORWARDED_HOST = True
# The SSL redirect must not hit the health check a load balancer makes over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
# /readyz reports the beat stale after this long without an admission tick (as the liveness command does).
WR_LIVENESS_STALE_SECONDS = float(os.environ.get("WR_LIVENESS_STALE_SECONDS", "30"))
# A Celery worker whose parent (bin/run's supervisor) is gone ends itself after this long, its warm shutdown
# unfinished or not (waitingroom_site/orphans.py); 0: never.
WR_WORKER_ORPHAN_GRACE_SECONDS = float(os.environ.get("WR_WORKER_ORPHAN_GRACE_SECONDS", "10"))
# Prometheus metrics (README "Metrics"): the path on every web process ('' for none); who may read it: a
# peer address in these networks, or a request with `Authorization: Bearer <WR_METRICS_TOKEN>`.
WR_METRICS_PATH = os.environ.get("WR_METRICS_PATH", "metrics").strip("/")
WR_METRICS_NETWORKS = envlist("WR_METRICS_NETWORKS", "127.0.0.0/8,::1/128")
WR_METRICS_TOKEN = os.environ.get("WR_METRICS_TOKEN", "")
if WR_METRICS_PATH:  # Prometheus scrapes over plain HTTP inside the network, as a load balancer's probe does
    SECURE_REDIRECT_EXEMPT.append(rf"^{re.escape(WR_METRICS_PATH)}$")

# --- Redis: all live queue state, the Celery broker and (later) the channel layer. ---
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
# The live state on a Redis Cluster instead (README "Redis Cluster"): its nodes, host:port,comma-separated.
# REDIS_URL then names a standalone Redis for what a cluster does not carry: the channel layer, and by
# default the Celery broker and Django's cache.
REDIS_CLUSTER_NODES = os.environ.get("REDIS_CLUSTER_NODES", "").strip()
# On a cluster, each web process keeps its completions this long and, when it sees the cluster's epoch
# move on (it looks every WR_FAILOVER_CHECK_SECONDS), makes them again: those a failover lost free their
# slots then, not at their sessions' ends (queueing/services/completions.py). 0 keeps none.
WR_COMPLETION_REPLAY_SECONDS = envint("WR_COMPLETION_REPLAY_SECONDS", 60)
WR_FAILOVER_CHECK_SECONDS = float(os.environ.get("WR_FAILOVER_CHECK_SECONDS", "1"))
WR_REDIS_PREFIX = os.environ.get("WR_REDIS_PREFIX", "wr")


def channel_layers(redis_url: str, prefix: str) -> dict[str, Any]:
    # Pub/sub: a group send is one PUBLISH whatever the group's size (queueing/realtime.py says why).
    # Pub/sub channels ignore Redis database numbers, so the prefix keeps installations apart.
    return {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [redis_url], "prefix": f"{prefix}:ws:"},
        }
    }


CHANNEL_LAYER_URL = os.environ.get("CHANNEL_LAYER_URL", "") or REDIS_URL
CHANNEL_LAYERS = channel_layers(CHANNEL_LAYER_URL, WR_REDIS_PREFIX)


def redis_database(url: str, db: int) -> str:
    """The same Redis server, another database number."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def caches(url: str, prefix: str) -> dict[str, Any]:
    """Django's cache on Redis (django-redis, hiredis parser). What it holds is recomputed on a miss (README
    "Caches"), so an unreachable cache is a miss (IGNORE_EXCEPTIONS, logged), never an error or a way in."""
    return {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": f"{prefix}:cache",
            "TIMEOUT": 300,
            "OPTIONS": {
                "PARSER_CLASS": "redis._parsers.hiredis._HiredisParser",
                "SOCKET_CONNECT_TIMEOUT": 1,
                "SOCKET_TIMEOUT": 1,
                "IGNORE_EXCEPTIONS": True,
            },
        }
    }


# A database of its own on the live state's server unless CACHE_URL says otherwise: an operator may flush
# the cache (FLUSHDB) without touching a queue.
CACHE_URL = os.environ.get("CACHE_URL", "") or redis_database(REDIS_URL, envint("CACHE_REDIS_DB", 1))
CACHES = caches(CACHE_URL, WR_REDIS_PREFIX)
DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True
# Staff sessions: in the database, read through the cache (a flushed cache loses no session).
SESSION_ENGINE = "waitingroom_site.sessions"
SESSION_CACHE_SECONDS = envint("SESSION_CACHE_SECONDS", 300)  # the cache's copy of a session, at most

# --- Waiting room behaviour. ---
# Tickets: HS256 (cheap to verify on every poll); a key of its own, derived from SECRET_KEY if unset.
WR_TICKET_SIGNING_KEY = os.environ.get("WR_TICKET_SIGNING_KEY", "")
WR_TICKET_LIFETIME = timedelta(hours=envint("WR_TICKET_LIFETIME_HOURS", 24))
# Access tokens: Ed25519 keys in the database; a new key is published this long before it signs,
# so that protected sites caching the JWKS see it first.
WR_KEY_PUBLISH_LEAD = timedelta(seconds=envint("WR_KEY_PUBLISH_LEAD_SECONDS", 600))
WR_KEY_CACHE_SECONDS = envint("WR_KEY_CACHE_SECONDS", 30)
# How long a finished ticket still answers `completed`/`expired` (instead of forgetting it).
WR_TERMINAL_RETENTION_SECONDS = envint("WR_TERMINAL_RETENTION_SECONDS", 900)
# Public base for websocket URLs handed to clients; empty means "same host as the request".
WR_WS_BASE_URL = os.environ.get("WR_WS_BASE_URL", "")
# Alert webhooks to private, loopback or link-local addresses (a receiver on this host or its network): off,
# so that a hook cannot reach the servers around this one (issue 50).
WR_ALERT_PRIVATE_TARGETS = envbool("WR_ALERT_PRIVATE_TARGETS", False)


# connect-src: the websocket server's origin alone, not ws: and wss: (issue 50; environment.ws_origin)
CONTENT_SECURITY_POLICY["DIRECTIVES"]["connect-src"] += ws_origin(WR_WS_BASE_URL)
WR_VISITOR_COOKIE = "wr_visitor"
WR_ACCESS_COOKIE_PREFIX = "wr_access_"
WR_ACCESS_QUERY_PARAM = "wr_access"
# A protected site's secret per browser (HttpOnly): an admission's session is bound to the first browser
# that redeems its link (queueing/middleware.py).
WR_BROWSER_COOKIE = "wr_browser"
# require_queue_access: "local" (same project: checks Redis), "remote" (HTTP call to WR_API_URL
# with WR_API_KEY) or "offline" (JWKS signature check only).
WR_VERIFY_MODE = os.environ.get("WR_VERIFY_MODE", "local")
WR_API_URL = os.environ.get("WR_API_URL", "")
WR_API_KEY = os.environ.get("WR_API_KEY", "")
# What the middleware keeps in Django's cache (this alias): remote verdicts for at most WR_VERIFY_CACHE_SECONDS
# (a revoked token is refused within that time), the JWKS for five minutes.
WR_CACHE_ALIAS = os.environ.get("WR_CACHE_ALIAS", "default")
WR_VERIFY_CACHE_SECONDS = envint("WR_VERIFY_CACHE_SECONDS", 5)
WR_WAITING_PAGE_URL = os.environ.get("WR_WAITING_PAGE_URL", "/q/{slug}/")
# require_queue_access reports the protected site's response times and errors (adaptive outflow):
# "auto" (local when WR_VERIFY_MODE is local, else remote when WR_API_URL and WR_API_KEY are set),
# "local", "remote" (batched: every WR_HEALTH_FLUSH_SECONDS or WR_HEALTH_FLUSH_REQUESTS) or "off".
WR_HEALTH_REPORT = os.environ.get("WR_HEALTH_REPORT", "auto")
# The demo protected pages (/demo/...): on for bin/run (it sets WR_DEMO=1) and in DEBUG, off in production.
WR_DEMO = envbool("WR_DEMO", DEBUG)
# One admitted visitor's requests count towards the site's health at most once per this many seconds
# (per process), so nobody can steer the adaptive outflow by reloading a protected page.
WR_HEALTH_SOURCE_SECONDS = envint("WR_HEALTH_SOURCE_SECONDS", 5)
# Per-address limits count an IPv6 client by its network of this many bits (one subscriber holds a /64).
WR_IPV6_PREFIX = envint("WR_IPV6_PREFIX", 64)
WR_HEALTH_FLUSH_SECONDS = envint("WR_HEALTH_FLUSH_SECONDS", 2)
WR_HEALTH_FLUSH_REQUESTS = envint("WR_HEALTH_FLUSH_REQUESTS", 500)
# Admission tick leadership lease; ticks run every second.
WR_LEADER_TTL_MS = envint("WR_LEADER_TTL_MS", 3000)
WR_ADMIT_MAX_PER_CALL = envint("WR_ADMIT_MAX_PER_CALL", 1000)
# How often the leader's tick makes a queue's estimate model (its looks and the table of waits polls read)
# while people wait in line: every 4 s, a crowded queue's tick about a quarter of the Redis time of a model
# every tick (1), for estimates about as true in the simulator's sales (docs/estimates.md). Polls read a table
# up to 5.5 s old: above 5, polls work their waits out between two.
WR_MODEL_SECONDS = envint("WR_MODEL_SECONDS", 4)
WR_CLEANUP_CHUNK = envint("WR_CLEANUP_CHUNK", 500)
# Ticket sequence numbers are reserved in the database this many at a time (one write per block), so
# that after Redis loses a queue's state numbering resumes above every number issued (SPEC 3.6).
WR_SEQ_BLOCK = envint("WR_SEQ_BLOCK", 100_000)
# After such a loss, nobody new is admitted for this long (at most a session's length) while the sessions
# that were live verify again and take their slots back first: capacity holds across the loss.
WR_RESTORE_HOLD_SECONDS = envint("WR_RESTORE_HOLD_SECONDS", 60)
# Wait estimates: the share of a crowd taken to walk away in its first 40 s by a new queue while none of the
# operator's queues has a record of its own (queueing/services/recovery.py walk_prior); 0: nobody does.
WR_WALK_PRIOR_SHARE = envfloat("WR_WALK_PRIOR_SHARE", 0.2)
if not 0 <= WR_WALK_PRIOR_SHARE < 1:
    raise ImproperlyConfigured(f"WR_WALK_PRIOR_SHARE must be a share from 0 up to 1, not {WR_WALK_PRIOR_SHARE}")
# Websocket servers: how often long-lived objects are frozen out of the garbage collector's sight (0 turns
# the freeze off), and how often one full collection runs over everything while the server holds sockets
# (0: only when it holds none). queueing.wscollector.Collector.
WR_WS_GC_FREEZE_SECONDS = envint("WR_WS_GC_FREEZE_SECONDS", 2)
WR_WS_GC_FULL_SECONDS = envint("WR_WS_GC_FULL_SECONDS", 0)
# Websocket servers: how often each logs its worst event-loop pause and what it holds (queueing/loopwatch.py;
# a warning when a pause reached 250 ms). 0 turns the watch off.
WR_WS_REPORT_SECONDS = envint("WR_WS_REPORT_SECONDS", 60)
# The web server (web.py): threads per process for everything but the hot paths (pages, admin, the API
# beyond status, window and joins), which run on the event loop. Bodies are read before a thread is taken.
WR_WEB_THREADS = envint("WR_WEB_THREADS", 32)
# Rate limiting (queueing/ratelimit.py): the limiter per scope, by algorithm and its parameters; a scope
# left out (or None) is not limited. WR_RATE_LIMITS (JSON in the environment) changes the entries it names:
# {"join": null} lifts the join limit and keeps every other one (README "Rate limiting").
#   join, challenge: per client address · status, neighbours: per ticket · protected: per API key ·
#   staff: per user · auth (the staff token endpoint, a password login): per client address
# An honest visitor polls no faster than every 1.6 s (2 s less the 20 % jitter): 1 a second sustained
# with bursts of 10 never refuses it. The page asks for its neighbours at most every 3 s.
WR_RATE_LIMIT_ROUNDING = os.environ.get("WR_RATE_LIMIT_ROUNDING", "down")  # sliding window counter
WR_RATE_LIMITS: dict[str, Any] = envtable(
    "WR_RATE_LIMITS",
    {
        "join": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 120},
        "challenge": {"algorithm": "sliding_window_counter", "fixed_window_seconds": 60, "max_requests": 120},
        "status": {"algorithm": "token_bucket", "capacity": 10, "refill_per_second": 1},
        "neighbours": {"algorithm": "token_bucket", "capacity": 5, "refill_per_second": 0.5},
        "protected": {"algorithm": "token_bucket", "capacity": 2000, "refill_per_second": 1000},
        "staff": {"algorithm": "sliding_log", "window_seconds": 60, "max_requests": 600},
        "auth": {"algorithm": "sliding_log", "window_seconds": 300, "max_requests": 20},
    },
)
# Client addresses: X-Forwarded-For is believed only from these proxies (addresses or networks).
WR_TRUSTED_PROXIES = envlist("WR_TRUSTED_PROXIES", "")
# Staff dashboard: live figures over its socket every this many seconds; snapshots and wait samples
# are kept this long.
WR_DASHBOARD_LIVE_SECONDS = envint("WR_DASHBOARD_LIVE_SECONDS", 2)
WR_DASHBOARD_RETENTION_HOURS = envint("WR_DASHBOARD_RETENTION_HOURS", 24 * 14)

# Alerts (README "Alerts"): links in alerts start with this (e.g. https://queue.example.com); empty, they are
# paths. A failed delivery is tried again after this many seconds, doubled each time.
WR_PUBLIC_URL = os.environ.get("WR_PUBLIC_URL", "")
WR_ALERT_RETRY_SECONDS = float(os.environ.get("WR_ALERT_RETRY_SECONDS", "5"))
WR_ALERT_FROM_EMAIL = os.environ.get("WR_ALERT_FROM_EMAIL", "waiting-room@localhost")
# Turn notices (README "Notify me"): a visitor who left an e-mail address is told their turn is near once this
# few are ahead or the estimate is this short, and again when it comes; from this address.
# The waiting page offers it where e-mail is set up: EMAIL_HOST given (or WR_NOTIFY_BY_EMAIL=1).
WR_NOTIFY_BY_EMAIL = envbool("WR_NOTIFY_BY_EMAIL", bool(os.environ.get("EMAIL_HOST")))
# The turn notices a queue keeps at most (a new address past it is refused, 409 notices_full): each is read
# by every run of the "Turn notices" task (issue 50).
WR_NOTIFY_MAX_PER_QUEUE = envint("WR_NOTIFY_MAX_PER_QUEUE", 10000)
WR_NOTIFY_NEAR_PLACES = envint("WR_NOTIFY_NEAR_PLACES", 10)
WR_NOTIFY_NEAR_SECONDS = envint("WR_NOTIFY_NEAR_SECONDS", 180)
WR_NOTIFY_FROM_EMAIL = os.environ.get("WR_NOTIFY_FROM_EMAIL", WR_ALERT_FROM_EMAIL)
# E-mail for alerts and turn notices: an SMTP server of yours (none set: e-mail alerts fail, logged as failed).
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = envint("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = 10

# --- Celery ---
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "waitingroom")


WR_TICK_QUEUE, CELERY_TASK_QUEUES, CELERY_TASK_ROUTES = celery_queues(CELERY_TASK_DEFAULT_QUEUE)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# django-celery-beat's DatabaseScheduler, sending only while it holds the beat's lease (one beat sends, others wait).
CELERY_BEAT_SCHEDULER = "queueing.beat:LeasedScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_TIME_LIMIT = 30
if os.environ.get("CELERY_KEY_PREFIX"):
    # Every broker key under one prefix (used by tests to share a Redis and clean up after themselves).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": os.environ["CELERY_KEY_PREFIX"]}
DJANGO_CELERY_BEAT_TZ_AWARE = True

# --- REST framework ---
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_PARSER_CLASSES": ["queueing.api.parsers.SafeJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "queueing.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SIMPLE_JWT = {
    # Staff API tokens (POST /api/v1/auth/token). Visitor tickets use their own key and class.
    "ACCESS_TOKEN_LIFETIME": timedelta(minutes=envint("STAFF_TOKEN_MINUTES", 30)),
    "REFRESH_TOKEN_LIFETIME": timedelta(hours=12),
    "ALGORITHM": "HS256",
    # A key of its own, derived from SECRET_KEY for this purpose only (not Django's, not the tickets').
    "SIGNING_KEY": salted_hmac("waitingroom.staff-jwt", "signing-key", SECRET_KEY, algorithm="sha256").hexdigest(),
    "AUTH_HEADER_TYPES": ("Bearer",),
    # Bodies with fields these endpoints do not know are refused (400 unknown_fields), as everywhere.
    "TOKEN_OBTAIN_SERIALIZER": "queueing.api.serializers.StaffTokenObtainSerializer",
    "TOKEN_REFRESH_SERIALIZER": "queueing.api.serializers.StaffTokenRefreshSerializer",
}

# --- Staff password logins (django-axes): /admin/login/ and POST /api/v1/auth/token. ---
# A username tried from one address is locked out after this many failures in a row, for the cool-off
# (every failure meanwhile starts it again); a success clears the count. So is an address, after this many
# failures over any usernames (issue 50: 15 usernames with one password each, from one address, all got
# the login form again). Records live in the database.
AXES_FAILURE_LIMIT = envint("WR_LOGIN_FAILURE_LIMIT", 10)
AXES_COOLOFF_TIME = timedelta(minutes=envint("WR_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429


def axes_client_address(request: Any) -> str:
    """The client's address as the rate limits see it (X-Forwarded-For from WR_TRUSTED_PROXIES only)."""
    from queueing.visitors import client_address

    return client_address(request.META)


AXES_CLIENT_IP_CALLABLE = axes_client_address

# The API's OpenAPI schema and docs (drf-spectacular): waitingroom_site/apischema.py.
SPECTACULAR_SETTINGS = apischema.SPECTACULAR_SETTINGS

# One JSON object per line (production), or readable text (LOG_FORMAT=text: bin/run); README "Logs".
LOG_FORMAT = os.environ.get("LOG_FORMAT", "json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "queueing.logcontext.ContextFilter"}},
    "formatters": {"json": {"()": "waitingroom_site.logs.JsonLines"}, "text": {"()": "waitingroom_site.logs.Text"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "text" if LOG_FORMAT == "text" else "json",
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # A line per task received, run and sent, several a second (the admission tick alone is one a second
        # per queue): they pushed bin/run's login out of sight. WR_TASK_LOG_LEVEL=INFO shows them again.
        **{
            name: {"level": os.environ.get("WR_TASK_LOG_LEVEL", "WARNING")}
            for name in ("celery.app.trace", "celery.worker.strategy", "celery.beat")
        },
    },
}
