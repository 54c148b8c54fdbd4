"""Targets for tests that need real parallel processes (spawned: no Django imports at module level)."""

from __future__ import annotations

import os
import time
from typing import Any


def setup_django(prefix: str, database: str) -> None:
    """Django in a spawned process: the parent's Redis prefix, and a database of its own (the parent's
    test database lives in the parent's memory) for what admission needs from it: signing keys."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{database}"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    settings.WR_REDIS_PREFIX = prefix  # the parent's per-run prefix
    call_command("migrate", verbosity=0)


def race_ticks(
    slug: str,
    instance: str,
    seconds: float,
    prefix: str,
    database: str,
    out: Any,
    go: Any,
    revoke_oldest: bool = False,
) -> None:
    """Once set up, say so on `out` and wait for `go`; then for `seconds`: tick as `instance`, and also run
    the leaderless immediate admission, as fast as sensible; with `revoke_oldest`, each round also ends the
    oldest session (its slot goes to the next visitor at once, as a completion does). Report the most slots
    seen in use, by the admission script itself and by a separate read, and when the last round ended."""
    setup_django(prefix, database)
    from queueing import services, store

    out.put(("ready", instance))
    go.wait(120)
    deadline = time.time() + seconds
    peak = 0
    while time.time() < deadline:
        for reply in (services.queue_tick(slug=slug, instance=instance), services.queue_admit(slug=slug)):
            if reply is not None and reply.figures is not None:
                peak = max(peak, reply.figures.used)
        snap = store.snapshot(slug)
        peak = max(peak, snap.admitted + snap.active)
        if revoke_oldest:
            for ticket_id, _, _ in store.sessions_list(slug, limit=1):
                services.session_revoke(slug=slug, ticket_id=ticket_id)  # "already" if the other runner won
        time.sleep(0.05)
    out.put((peak, time.time()))
