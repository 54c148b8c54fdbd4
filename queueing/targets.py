"""Whether a queue's target can take the queue's tokens, as far as this server can tell (issue 19: a queue
aimed at /demo/protected/, the demo queue's page, sent its admitted visitors into the demo queue's line,
where they lost their turn). Pages of this server say whose tokens they take: @require_queue_access marks
its views (`queue_access_slug`), and the middleware's WR_PROTECTED_PATHS names a queue per prefix. Another
site cannot be checked from here: the queue's admin page shows how to protect it."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.urls import Resolver404, resolve

MIDDLEWARE = "queueing.middleware.QueueAccessMiddleware"


def target_problem(slug: str, target_url: str) -> str:
    """Why visitors admitted through queue `slug` would not get in at `target_url` ('' when nothing is
    wrong, or when it is another site's page and cannot be checked from here)."""
    if not target_url.startswith("/"):
        return ""
    path = urlsplit(target_url).path
    if MIDDLEWARE in settings.MIDDLEWARE:
        prefixes = sorted(getattr(settings, "WR_PROTECTED_PATHS", {}).items(), key=lambda kv: -len(kv[0]))
        for prefix, owner in prefixes:
            if path.startswith(prefix):
                return "" if owner == slug else _someone_elses(path, owner, slug)
    try:
        match = resolve(path)
    except Resolver404:
        return f"No page of this server answers at {path}: admitted visitors would find nothing there."
    owner = getattr(match.func, "queue_access_slug", None)
    if callable(owner):
        owner = owner(match.kwargs)
    if owner is None:
        return (
            f"{path} is a page of this server that does not check access tokens, so anyone could open it "
            f"without waiting. Protect it with @require_queue_access(\"{slug}\") (or WR_PROTECTED_PATHS), or "
            "aim the queue at a page that is protected."
        )
    return "" if owner == slug else _someone_elses(path, owner, slug)


def _someone_elses(path: str, owner: str, slug: str) -> str:
    demo = f" This server's demo page for this queue is /demo/{slug}/protected/." if path.startswith("/demo/") else ""
    return (
        f"{path} takes the tokens of the queue \"{owner}\", not of this one: its admitted visitors would be sent "
        f"to that queue's line and lose their turn.{demo}"
    )
