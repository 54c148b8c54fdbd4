from __future__ import annotations

import csv
from datetime import UTC, datetime, tzinfo
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.widgets import AdminSplitDateTime
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from rest_framework_api_key.admin import APIKeyModelAdmin

from . import phases, selectors, services, signing_keys
from .models import (
    ManagementKey,
    PriorityCode,
    PriorityLevel,
    Queue,
    QueueAPIKey,
    QueueChange,
    QueueShuffle,
    QueueText,
    SigningKey,
)
from .services.config import PREQUEUE_GUARDS
from .targets import target_problem

# The per-address index is written only while a cap is set (README: Join caps), so say so where it is set.
CAP_COUNTS_FROM_NOW = (
    "The cap counts tickets joined while it is on (earlier ones are not counted): set it before the sale opens."
)


def queue_zone(request: HttpRequest | None, queue: Queue | None) -> tzinfo:
    """The zone a queue's form reads and shows its times in: the one submitted with them (so a new queue's
    times are read in the zone chosen beside them), else the queue's, else the server's default."""
    submitted = request.POST.get("time_zone") if request is not None else None
    try:
        if submitted:
            return ZoneInfo(submitted)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file's
        pass  # not a zone (the form says so): the queue's
    return queue.zone if queue else timezone.get_default_timezone()


def zone_named(zone: tzinfo, moment: datetime) -> str:
    """The zone, with its abbreviation and offset at that moment: Europe/Berlin (CET, UTC+01:00)."""
    local = moment.astimezone(zone)
    offset = local.strftime("%z")
    abbreviation = "" if local.tzname() == str(zone) else f"{local.tzname()}, "  # not "UTC (UTC, ...)"
    return f"{zone} ({abbreviation}UTC{offset[:3]}:{offset[3:]})"


def labelled(field: Any, label: str, *, in_table: bool) -> Any:
    """Name a form field's inputs for screen readers where admin shows no <label> for them (axe-core's
    `label` and `select-name`): a table's cells (the column's heading is not a label) and the date and time
    halves of a date-time."""
    if field is None:
        return field
    widget = getattr(field.widget, "widget", field.widget)  # inside the related-object links' wrapper
    if isinstance(widget, AdminSplitDateTime):
        widget.widgets[0].attrs["aria-label"] = f"{label}: date"
        widget.widgets[1].attrs["aria-label"] = f"{label}: time"
    elif in_table:
        widget.attrs["aria-label"] = label
    return field


class LabelledInlineFormSet(BaseInlineFormSet):
    """A table's "Delete?" boxes named for screen readers too (the column heading is not a label)."""

    def add_fields(self, form: Any, index: Any) -> None:
        super().add_fields(form, index)
        if "DELETE" in form.fields:
            form.fields["DELETE"].widget.attrs["aria-label"] = "Delete"


class PriorityLevelInline(admin.TabularInline):
    model = PriorityLevel
    formset = LabelledInlineFormSet
    extra = 0
    max_num = 4
    template = "admin/edit_inline/tabular_labelled.html"  # Django's, with a heading for its first column

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        return labelled(field, str(db_field.verbose_name).capitalize(), in_table=True)

    def get_extra(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> int:
        return 0 if obj is not None and obj.pk else len(PriorityLevel.DEFAULT_FRACTIONS)  # the add form: all four


class QueueTextInline(admin.TabularInline):
    """The queue's words in the other languages the waiting page speaks (empty: the queue's own)."""

    model = QueueText
    formset = LabelledInlineFormSet
    extra = 0
    template = "admin/edit_inline/tabular_labelled.html"

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None and db_field.name in ("intro", "closed_message"):
            field.widget.attrs.update(rows=2, cols=30)
        return labelled(field, str(db_field.verbose_name).capitalize(), in_table=True)


class QueueForm(forms.ModelForm):
    """A hoarding guard may be left empty: its default (services.config.PREQUEUE_GUARDS), on with a
    scheduled start and off without one; 0 is the operator's choice of off. A guard that is off only by
    default shows empty, so that saving the form unchanged does not choose 0."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in PREQUEUE_GUARDS:
            if name in self.fields:
                self.fields[name].required = False
                if not self.instance.starts_at and not getattr(self.instance, name):
                    self.initial[name] = None


DEFAULT_LEVELS = [
    {"level": level, "name": PriorityLevel.Level(level).label, "placement_fraction": fraction}
    for level, fraction in PriorityLevel.DEFAULT_FRACTIONS.items()
]


class InQueueZone(admin.ModelAdmin):
    """A change form whose times are typed and shown in a queue's own zone, not the server's (issue 47):
    Django's forms convert in the active zone, and refuse a time that zone skips or repeats. The page is
    rendered inside it too, for the times it shows and admin's "Now" shortcuts."""

    def form_zone(self, request: HttpRequest, object_id: str | None) -> tzinfo:
        raise NotImplementedError

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        with timezone.override(self.form_zone(request, object_id)):
            response = super().changeform_view(request, object_id, form_url, extra_context)
            if isinstance(response, SimpleTemplateResponse):
                response.render()
        return response


@admin.register(Queue)
class QueueAdmin(InQueueZone):
    list_display = (
        "slug",
        "name",
        "phase",
        "capacity",
        "outflow_per_minute",
        "live_waiting",
        "live_admitted",
        "live_active",
        "links",
    )
    list_display_links = ("slug",)
    list_filter = ("state",)
    search_fields = ("slug", "name")
    form = QueueForm
    actions = ("pause_queues", "resume_queues", "generate_codes")
    inlines = (PriorityLevelInline, QueueTextInline)
    fieldsets = (
        (None, {"fields": ("slug", "name", "intro", "target_url", "state", "time_zone")}),
        (
            "When the line is closed",
            {
                "fields": Queue.CLOSED_FIELDS,
                "description": "What the waiting page says once the queue is closed, by hand or at its end.",
            },
        ),
        (
            "Admission policy",
            {"fields": [f for f in Queue.POLICY_FIELDS if f not in (*Queue.ADAPTIVE_FIELDS, *Queue.STATELESS_FIELDS)]},
        ),
        (
            "Mode",
            {
                "fields": Queue.STATELESS_FIELDS,
                "description": "Tracked (the default) keeps each visitor's place, presence and session in Redis. "
                "Stateless keeps nothing per visitor (for the largest drops): a ticket is a number, and a window of "
                "active numbers moves by its size every interval; capacity, presence, priorities, burst and "
                "revocation do not apply. Changing the mode of a queue with people in it sends them to join again.",
            },
        ),
        (
            "Adaptive outflow",
            {
                "fields": Queue.ADAPTIVE_FIELDS,
                "description": "Optional: the admission tick follows the protected site's health (reported by "
                "require_queue_access or POST /api/v1/queues/&lt;slug&gt;/health), starting from the outflow above. "
                "Every change of the rate is in the audit log.",
            },
        ),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The mode's and the adaptive outflow's settings stay folded away until they are in use; how to
        protect the site is shown once the queue exists."""
        folded = {
            "Mode": not (obj and obj.mode == Queue.Mode.STATELESS),
            "Adaptive outflow": not (obj and obj.adaptive_outflow),
            "When the line is closed": not (obj and (obj.closed_message or obj.closed_link_url)),
        }
        fieldsets: list[tuple[Any, dict[str, Any]]] = []
        for name, options in super().get_fieldsets(request, obj):
            fold = folded.get(str(name), False)
            fieldsets.append((name, {**options, "classes": ("collapse",)} if fold else dict(options)))
        if obj is not None:
            fieldsets.insert(1, ("Protecting your site", {"fields": ("protecting",)}))
        return fieldsets

    @admin.display(description="")
    def protecting(self, obj: Queue) -> SafeString:
        context = {
            "slug": obj.slug,
            "target": obj.target_url,
            "problem": target_problem(obj.slug, obj.target_url),
            "dashboard_url": reverse("dashboard:queue", args=[obj.slug]),
            "waiting_url": reverse("waiting-page", args=[obj.slug]),
            "api_key_url": reverse("admin:queueing_queueapikey_add"),
            "api_base": f"https://<this server>/api/v1/queues/{obj.slug}",
        }
        return SafeString(render_to_string("admin/queueing/queue/protecting.html", context))

    @admin.display(description="links")
    def links(self, obj: Queue) -> str:
        return format_html(
            '<a href="{}">dashboard</a> · <a href="{}">waiting page</a>',
            reverse("dashboard:queue", args=[obj.slug]),
            reverse("waiting-page", args=[obj.slug]),
        )

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "max_tickets_per_address" and field is not None:
            field.help_text = f"{field.help_text} {CAP_COUNTS_FROM_NOW}"
        if db_field.name in PREQUEUE_GUARDS and field is not None:
            default = PREQUEUE_GUARDS[db_field.name]
            field.help_text = f"{field.help_text} Empty: the default, {default} once a start is scheduled, else off."
        return labelled(field, str(db_field.verbose_name).capitalize(), in_table=False)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ("slug", "protecting") if obj else ()

    def form_zone(self, request: HttpRequest, object_id: str | None) -> tzinfo:
        queue = self.get_object(request, unquote(object_id)) if object_id else None
        return queue_zone(request, queue)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        """Each time is labelled with the zone it is read in, at that time's offset."""
        form = super().get_form(request, obj, change, **kwargs)
        zone = queue_zone(request, obj)
        for name, field in form.base_fields.items():
            if isinstance(field, forms.SplitDateTimeField):
                moment = getattr(obj, name, None) or timezone.now()
                field.help_text = f"{field.help_text} In {zone_named(zone, moment)}: the time zone above."
        return form

    def get_formset_kwargs(self, request: HttpRequest, obj: Any, inline: Any, prefix: str) -> dict[str, Any]:
        """On the add form, the four levels the queue will have, to edit before it exists (issue 19)."""
        kwargs: dict[str, Any] = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, PriorityLevelInline) and not obj.pk:
            kwargs["initial"] = DEFAULT_LEVELS
        return kwargs

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        self._snapshots: dict[str, selectors.QueueSnapshot] = {}
        return super().get_changelist_instance(request)

    def _snapshot(self, obj: Queue) -> selectors.QueueSnapshot:
        snaps: dict[str, selectors.QueueSnapshot] = getattr(self, "_snapshots", {})
        if obj.slug not in snaps:
            snaps[obj.slug] = selectors.queue_snapshot_get(obj.slug)
        return snaps[obj.slug]

    @admin.display(description="phase", ordering="state")
    def phase(self, obj: Queue) -> str:
        """Where the sale is (queueing/phases.py), not only the state set: a scheduled queue is "not yet open"
        or in its "pre-queue" while its state says open."""
        now = timezone.now().timestamp()
        schedule = phases.schedule_at(now=now, prequeue_opens_at=obj.prequeue_opens_at, starts_at=obj.starts_at)
        return phases.PHASE_WORDS[phases.phase_of(state=obj.state, schedule=schedule)]

    @admin.display(description="waiting")
    def live_waiting(self, obj: Queue) -> int:
        return self._snapshot(obj).waiting

    @admin.display(description="admitted")
    def live_admitted(self, obj: Queue) -> int:
        return self._snapshot(obj).admitted

    @admin.display(description="active")
    def live_active(self, obj: Queue) -> int:
        return self._snapshot(obj).active

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        fields = form.changed_data if change else list(form.cleaned_data)
        # Times as the API gives them, in UTC (the form's are in the queue's zone), so the audit log reads alike.
        changes = {f: _utc(form.cleaned_data[f]) for f in fields if f in services.EDITABLE_FIELDS}
        queue, _ = services.queue_configure(slug=obj.slug, changes=changes, actor=request.user)
        obj.pk = queue.pk
        obj.refresh_from_db()
        problem = target_problem(queue.slug, queue.target_url)
        if problem:
            self.message_user(request, f"Check the target URL: {problem}", messages.WARNING)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # Audited, and placement fractions mirrored into Redis, by the service.
        save_formsets = partial(super().save_related, request, form, formsets, change)

        def save() -> None:
            if not change:  # the levels edited on the add form replace the defaults the queue was made with
                edited = [
                    f.cleaned_data["level"]
                    for fs in formsets
                    for f in fs.forms
                    if fs.prefix == "priority_levels" and f.has_changed() and not f.cleaned_data.get("DELETE")
                ]
                PriorityLevel.objects.filter(queue=form.instance, level__in=edited).delete()
            save_formsets()

        services.queue_priority_levels_edit(form.instance, save=save, actor=request.user)

    def delete_model(self, request: HttpRequest, obj: Queue) -> None:
        services.queue_delete(obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            services.queue_delete(queue, actor=request.user)

    @admin.action(description="Pause selected queues (keep joining, admit nobody)", permissions=["change"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            services.queue_pause(queue, actor=request.user)
        self.message_user(request, f"Paused {queryset.count()} queue(s).", messages.SUCCESS)

    def has_add_codes_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("queueing.add_prioritycode")

    @admin.action(description="Generate priority codes (CSV) for the selected queue", permissions=["add_codes"])
    def generate_codes(self, request: HttpRequest, queryset: QuerySet[Queue]) -> HttpResponse | None:
        if queryset.count() != 1:
            self.message_user(request, "Select one queue to generate codes for.", messages.ERROR)
            return None
        queue = queryset.get()
        zone = queue_zone(request, queue)  # an expiry is typed in the queue's zone, as its sale times are
        with timezone.override(zone):
            form = GenerateCodesForm(request.POST if "apply" in request.POST else None)
            form.fields["expires_at"].help_text = GenerateCodesForm.EXPIRES_HELP.format(
                zone=zone_named(zone, timezone.now())
            )
            if not form.is_valid():
                context = {
                    **self.admin_site.each_context(request),
                    "title": "Generate priority codes",
                    "queue": queue,
                    "form": form,
                    "back_url": reverse("admin:queueing_queue_changelist"),
                }
                return TemplateResponse(request, "admin/queueing/queue/generate_codes.html", context).render()
        codes = services.priority_codes_generate(queue, **form.cleaned_data, actor=request.user)
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{queue.slug}-priority-codes.csv"'
        writer = csv.writer(response)
        writer.writerow(["queue", "code", "level", "max_uses", "expires_at"])
        for code in codes:
            expires = code.expires_at.isoformat() if code.expires_at else ""
            writer.writerow([queue.slug, code.code, code.level, code.max_uses or "", expires])
        return response

    @admin.action(description="Resume selected queues", permissions=["change"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            services.queue_resume(queue, actor=request.user)
        self.message_user(request, f"Resumed {queryset.count()} queue(s).", messages.SUCCESS)


def _utc(value: Any) -> Any:
    return value.astimezone(UTC) if isinstance(value, datetime) else value


class GenerateCodesForm(forms.Form):
    count = forms.IntegerField(min_value=1, max_value=services.PRIORITY_CODES_MAX, initial=100)
    level = forms.TypedChoiceField(
        coerce=int, choices=[c for c in PriorityLevel.Level.choices if c[0] > 0], initial=PriorityLevel.Level.VIP
    )
    max_uses = forms.IntegerField(
        min_value=1, required=False, initial=1, help_text="Joins each code may be used for. Empty: unlimited."
    )
    EXPIRES_HELP = "After this the codes are refused (YYYY-MM-DD HH:MM, in {zone}: the queue's). Empty: never."
    expires_at = forms.DateTimeField(required=False, help_text=EXPIRES_HELP.format(zone="the queue's time zone"))


@admin.register(PriorityCode)
class PriorityCodeAdmin(InQueueZone):
    list_display = ("code", "queue", "level", "uses", "max_uses", "expires_in_queue_zone")
    list_select_related = ("queue",)
    list_filter = ("queue", "level")
    search_fields = ("code",)
    readonly_fields = ("uses",)

    @admin.display(description="expires at", ordering="expires_at")
    def expires_in_queue_zone(self, code: PriorityCode) -> str:
        """In the queue's own zone, named, as its sale times are shown (issue 47, item 7)."""
        if code.expires_at is None:
            return "never"
        zone = code.queue.zone
        return f"{code.expires_at.astimezone(zone):%Y-%m-%d %H:%M} {zone_named(zone, code.expires_at)}"

    def form_zone(self, request: HttpRequest, object_id: str | None) -> tzinfo:
        """The code's queue's zone; for a new code, that of the queue posted with it, else the server's."""
        code = self.get_object(request, unquote(object_id)) if object_id else None
        posted = request.POST.get("queue", "")
        queue = code.queue if code else Queue.objects.filter(pk=int(posted)).first() if posted.isdigit() else None
        return queue_zone(None, queue)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        zone = obj.queue.zone if obj else timezone.get_current_timezone()
        if "expires_at" in form.base_fields:
            form.base_fields["expires_at"].help_text = f"In {zone_named(zone, timezone.now())}: the queue's."
        return form


@admin.register(QueueAPIKey)
class QueueAPIKeyAdmin(APIKeyModelAdmin):
    list_display = (*APIKeyModelAdmin.list_display, "queue")  # type: ignore[assignment]
    list_filter = (*APIKeyModelAdmin.list_filter, "queue")  # type: ignore[assignment]


@admin.register(ManagementKey)
class ManagementKeyAdmin(APIKeyModelAdmin):
    """Superusers only (no group holds its permissions): a key does what its role's group may."""

    list_display = (*APIKeyModelAdmin.list_display, "role")  # type: ignore[assignment]
    list_filter = (*APIKeyModelAdmin.list_filter, "role")  # type: ignore[assignment]


@admin.register(SigningKey)
class SigningKeyAdmin(admin.ModelAdmin):
    list_display = ("kid", "created_at", "signs_from", "retires_at")
    readonly_fields = ("kid", "public_jwk", "created_at", "signs_from", "retires_at")
    exclude = ("private_key_pem",)
    actions = ("rotate",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Rotate: publish a new signing key (the old ones retire after overlap)")
    def rotate(self, request: HttpRequest, queryset: QuerySet[SigningKey]) -> None:
        key = signing_keys.signing_key_rotate()
        self.message_user(request, f"New key {key.kid} signs from {key.signs_from:%Y-%m-%d %H:%M:%S %Z}.")


@admin.register(QueueChange)
class QueueChangeAdmin(admin.ModelAdmin):
    list_display = ("created_at", "queue_slug", "action", "actor_label", "change")
    list_filter = ("queue_slug", "action")
    readonly_fields = (
        "queue",
        "queue_slug",
        "actor",
        "actor_label",
        "action",
        "change",
        "before",
        "after",
        "created_at",
    )

    @admin.display(description="change")
    def change(self, obj: QueueChange) -> str:
        return obj.summary()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # an audit log nobody can edit or delete (it outlives its queue: models.QueueChange)


@admin.register(QueueShuffle)
class QueueShuffleAdmin(admin.ModelAdmin):
    """Read only: the commitment is public from the start; the seed shows once revealed."""

    list_display = ("queue", "starts_at", "commitment", "revealed_at")
    list_filter = ("queue",)
    exclude = ("seed",)
    readonly_fields = ("queue", "starts_at", "commitment", "committed_at", "revealed_seed", "revealed_at", "order")

    @admin.display(description="seed")
    def revealed_seed(self, obj: QueueShuffle) -> str:
        return obj.seed if obj.revealed_at else "(revealed at the start)"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
