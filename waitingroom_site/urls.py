from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import include, path
from django.views import defaults
from django.views.decorators.cache import cache_control
from django.views.i18n import JavaScriptCatalog
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView
from rest_framework_simplejwt.views import TokenObtainPairView, TokenRefreshView

from queueing import selectors
from queueing.api import errors
from queueing.api.throttling import StaffLoginThrottle
from queueing.api.views import jwks_view

from . import metrics
from .version import VERSION


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


def readyz(request: HttpRequest) -> HttpResponse:
    """Ready to serve: Redis and the database answer (200), else 503 with Retry-After. To whoever may read
    the metrics (metrics_access: their networks, not through a proxy, or the token) each check is said, and
    the version this process runs (so a rolling upgrade can be watched); to anyone else only the status
    (issue 50: it returned exception text to the public)."""
    checks = selectors.readiness()
    ready = all(checks[name].ok for name in selectors.READINESS_REQUIRED)
    body: dict[str, Any] = {"status": "ready" if ready else "unavailable"}
    if metrics.allowed(request):
        body["version"] = VERSION
        body["checks"] = {name: {"ok": check.ok, "detail": check.detail} for name, check in checks.items()}
    response = JsonResponse(body, status=200 if ready else 503)
    response["Cache-Control"] = "no-store"
    if not ready:
        response["Retry-After"] = "5"
    return response


def bad_request(request: HttpRequest, exception: Exception) -> Any:
    """JSON in the API's error shape under /api/ (a body too large is 413), Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return errors.json_bad_request(request, exception)
    return defaults.bad_request(request, exception)


def not_found(request: HttpRequest, exception: Exception) -> Any:
    """JSON in the API's error shape under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return errors.json_not_found(request, exception)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> Any:
    if request.path.startswith("/api/"):
        return errors.json_server_error(request)
    return defaults.server_error(request)


handler400 = "waitingroom_site.urls.bad_request"
handler404 = "waitingroom_site.urls.not_found"
handler500 = "waitingroom_site.urls.server_error"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("dashboard/", include("admin_dashboard.urls")),
    path("api/v1/", include("queueing.api.urls")),
    # Password logins and refreshes per client address (scope "auth"): guessing staff passwords is slow.
    path("api/v1/auth/token", TokenObtainPairView.as_view(throttle_classes=[StaffLoginThrottle]), name="staff-token"),
    path(
        "api/v1/auth/token/refresh",
        TokenRefreshView.as_view(throttle_classes=[StaffLoginThrottle]),
        name="staff-token-refresh",
    ),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file of its own: no inline script (CSP).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path(".well-known/jwks.json", jwks_view, name="jwks"),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    *([path(settings.WR_METRICS_PATH, metrics.metrics_view, name="metrics")] if settings.WR_METRICS_PATH else []),
    # The language switcher (POST: a cookie) and the waiting page's JavaScript catalogue.
    path("i18n/", include("django.conf.urls.i18n")),
    # Kept by browsers for an hour; pages ask for it with their language in the address (?l=de), so a
    # switch of language is a new address.
    path(
        "jsi18n/",
        cache_control(public=True, max_age=3600)(JavaScriptCatalog.as_view(packages=["queueing"])),
        name="javascript-catalog",
    ),
    path("", include("queueing.urls")),
]
