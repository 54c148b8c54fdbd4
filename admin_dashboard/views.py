"""The staff dashboard: pages, their JSON (the polling fallback of the live socket), controls, exports.

Who may do what: anonymous visitors are sent to the login page; signed-in users who are not staff get
403; staff see everything; changing a queue (pause, resume, capacity, outflow, revoke) also needs the
`queueing.change_queue` permission. Controls are POST forms with Django's CSRF protection.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import dateformat, timezone
from django.views.decorators.http import require_GET, require_POST

from queueing import realtime
from queueing import selectors as queueing_selectors
from queueing import services as queueing_services
from queueing.models import Queue

from . import selectors, services
from .forms import ControlForm

CHANGE_PERMISSION = "queueing.change_queue"
SOCKET_PATH = "/ws/dashboard/"
View = Callable[..., HttpResponseBase]

# One way of showing a time on the dashboard (issue 19): the schedule, the sessions and the audit log alike,
# named; a queue's pages in the queue's own time zone, as admin types them (issue 47), the list of queues in
# the server's (TIME_ZONE). Templates use the same format string.
SHOWN_TIME_FORMAT = "Y-m-d H:i:s T"


def shown_time(moment: datetime) -> str:
    return dateformat.format(timezone.localtime(moment), SHOWN_TIME_FORMAT)


def staff_required(view: View) -> View:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not request.user.is_staff:
            raise PermissionDenied("The dashboard is for staff.")
        return view(request, *args, **kwargs)

    return wrapper


def _hours(request: HttpRequest) -> float:
    """The period asked for, clamped to 3 minutes .. 31 days; anything else (nan, inf, junk) is the default."""
    try:
        hours = float(request.GET.get("hours", selectors.SERIES_HOURS_DEFAULT))
    except ValueError:
        hours = selectors.SERIES_HOURS_DEFAULT
    if not math.isfinite(hours):  # nan survives min/max, and timedelta(hours=nan) raises
        hours = selectors.SERIES_HOURS_DEFAULT
    return min(max(hours, 0.05), 24 * 31)


@require_GET
@staff_required
def dashboard_index(request: HttpRequest) -> HttpResponse:
    context = {"cards": selectors.dashboard_cards(), "socket_url": realtime.socket_url(request, SOCKET_PATH)}
    return render(request, "admin_dashboard/index.html", context)


@require_GET
@staff_required
def dashboard_live(request: HttpRequest) -> JsonResponse:
    """Every queue's live card (the index page's polling fallback)."""
    return JsonResponse({"queues": selectors.dashboard_cards()})


def _queue_data(queue: Queue, hours: float, *, sessions: bool = False) -> dict[str, Any]:
    """What the queue's page draws and redraws; with `sessions` (staff who may revoke them), the admitted
    and active tickets too, so the table follows the cards (issue 19: it kept the rows of page load)."""
    start = selectors.since(hours)
    data = {
        "live": selectors.queue_live(queue),
        "series": selectors.queue_series(queue, start=start),
        "truth": selectors.estimate_truth(queue, start=start),
        "hours": hours,
    }
    if sessions:
        data["sessions"] = [
            {**s, "until": s["until"].isoformat(), "until_shown": shown_time(s["until"])}
            for s in selectors.queue_sessions(queue)
        ]
    return data


@require_GET
@staff_required
def dashboard_queue(request: HttpRequest, slug: str) -> HttpResponse:
    queue = get_object_or_404(Queue, slug=slug)
    with timezone.override(queue.zone):
        return _dashboard_queue(request, queue)


def _dashboard_queue(request: HttpRequest, queue: Queue) -> HttpResponse:
    hours = _hours(request)
    can_change = request.user.has_perm(CHANGE_PERMISSION)
    data = _queue_data(queue, hours, sessions=can_change)
    context = {
        "queue": queue,
        "data": data,
        "hours": hours,
        "can_change": can_change,
        "form": ControlForm(initial={"capacity": queue.capacity, "outflow_per_minute": queue.outflow_per_minute}),
        "sessions": data.get("sessions", []),
        "changes": selectors.queue_changes(queue),
        "socket_url": realtime.socket_url(request, SOCKET_PATH),
        "shuffle": queueing_selectors.queue_shuffle_get(slug=queue.slug),
        "error_threshold_percent": queue.health_error_rate * 100,
        "phase": selectors.schedule_phase(queue),
        "time_zone": timezone.get_current_timezone_name(),
    }
    return render(request, "admin_dashboard/queue.html", context)


@require_GET
@staff_required
def dashboard_queue_data(request: HttpRequest, slug: str) -> JsonResponse:
    """Live figures, chart series and wait-estimate truth of one queue (polling fallback, chart load)."""
    queue = get_object_or_404(Queue, slug=slug)
    with timezone.override(queue.zone):
        return JsonResponse(_queue_data(queue, _hours(request), sessions=request.user.has_perm(CHANGE_PERMISSION)))


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@require_POST
@staff_required
def dashboard_control(request: HttpRequest, slug: str) -> HttpResponse:
    """Pause, resume, change capacity or outflow, or revoke a session; audited."""
    if not request.user.has_perm(CHANGE_PERMISSION):
        raise PermissionDenied("Changing a queue needs the 'Can change queue' permission.")
    queue = get_object_or_404(Queue, slug=slug)
    form = ControlForm(request.POST)
    errors: dict[str, Any] = {}
    done = ""
    if not form.is_valid():
        errors = form.errors.get_json_data()
    else:
        action = form.cleaned_data["action"]
        if action == "revoke" and request.POST.get("confirm") != "yes":
            return _revoke_unconfirmed(request, queue, form.cleaned_data["ticket_id"])
        try:
            if action == "revoke":
                result = services.session_revoke(queue, ticket_id=form.cleaned_data["ticket_id"], actor=request.user)
                outcome = "revoked" if result == "revoked" else "had already ended"
                done = f"Ticket {form.cleaned_data['ticket_id']} {outcome}."
            else:
                changes = {f: form.cleaned_data[f] for f in ("capacity", "outflow_per_minute")}
                services.queue_control(queue, action=action, actor=request.user, changes=changes)
                done = {"pause": "Paused.", "resume": "Resumed.", "update": "Saved."}[action]
        except queueing_services.TicketNotFound:
            errors = {"ticket_id": [{"message": "No such ticket in this queue.", "code": "not_found"}]}
        except queueing_services.NotInStatelessMode as error:
            errors = {"ticket_id": [{"message": str(error), "code": "stateless"}]}
        except ValidationError as error:
            errors = {
                field: [{"message": m, "code": "invalid"} for m in messages_]
                for field, messages_ in error.message_dict.items()
            }
    if _wants_json(request):
        if errors:
            words = form.errors_in_words(errors)
            return JsonResponse({"error": {"code": "invalid", "message": words, "fields": errors}}, status=400)
        queue.refresh_from_db()
        return JsonResponse({"done": done, "live": selectors.queue_live(queue)})
    if errors:
        messages.error(request, form.errors_in_words(errors))
    else:
        messages.success(request, done)
    return redirect("dashboard:queue", slug=queue.slug)


def _revoke_unconfirmed(request: HttpRequest, queue: Queue, ticket_id: str) -> HttpResponse:
    """Revoking ends a visitor's session at once, so it is asked first (issue 47, item 13): the page's script
    asks with window.confirm and sends `confirm=yes`; without JavaScript the button leads here, to a page
    that asks (as admin's delete actions do), and nothing changes until its own button is pressed."""
    if _wants_json(request):
        message = "Revoking a session needs confirmation (confirm=yes)."
        error = {
            "code": "unconfirmed",
            "message": message,
            "fields": {"confirm": [{"message": message, "code": "required"}]},
        }
        return JsonResponse({"error": error}, status=400)
    session = next((s for s in selectors.queue_sessions(queue) if s["ticket_id"] == ticket_id), None)
    context = {
        "queue": queue,
        "ticket_id": ticket_id,
        "session": session,
    }
    with timezone.override(queue.zone):
        context["until_shown"] = shown_time(session["until"]) if session else ""
        return render(request, "admin_dashboard/revoke_confirm.html", context)


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv(filename: str, header: list[str], rows: Iterator[list[Any]]) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    lines = (writer.writerow(row) for row in (header, *rows))
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


SNAPSHOT_COLUMNS = [
    "taken_at",
    "state",
    "waiting",
    "admitted",
    "active",
    "capacity",
    "capacity_in_use",
    "capacity_use",
    "viewers",
    "admissions",
    "period_seconds",
    "outflow_configured",
    "outflow_observed",
    "outflow_effective",
    "health_requests",
    "health_error_rate",
    "health_p95_ms",
    "average_wait_seconds",
    "average_service_seconds",
    "total_joined",
    "total_admitted",
    "total_completed",
    "total_expired",
    "total_abandoned",
]


@require_GET
@staff_required
def export_snapshots(request: HttpRequest, slug: str) -> StreamingHttpResponse:
    queue = get_object_or_404(Queue, slug=slug)

    def rows() -> Iterator[list[Any]]:
        for snapshot in selectors.queue_snapshots(queue).iterator(chunk_size=2000):
            point = selectors.snapshot_point(snapshot)
            yield [snapshot.taken_at.isoformat(), *(point[c] for c in SNAPSHOT_COLUMNS[1:])]

    return _csv(f"{queue.slug}-snapshots.csv", SNAPSHOT_COLUMNS, rows())


@require_GET
@staff_required
def export_changes(request: HttpRequest, slug: str) -> StreamingHttpResponse:
    queue = get_object_or_404(Queue, slug=slug)

    def rows() -> Iterator[list[Any]]:
        for change in selectors.queue_changes(queue, limit=None).iterator(chunk_size=2000):
            yield [
                change.created_at.isoformat(),
                change.actor_label,
                change.action,
                change.summary(),
                json.dumps(change.before, sort_keys=True, default=str),
                json.dumps(change.after, sort_keys=True, default=str),
            ]

    return _csv(f"{queue.slug}-audit.csv", ["when", "who", "action", "change", "before", "after"], rows())
