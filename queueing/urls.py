from django.conf import settings
from django.urls import path

from . import converters, views  # noqa: F401  (converters registers the "queue" path converter)

urlpatterns = [
    path("", views.home, name="home"),
    path("q/<queue:slug>/", views.waiting_page, name="waiting-page"),
]

# The demo protected site (what a site behind a queue looks like) answers only where it is switched on
# (WR_DEMO: bin/run and the tests). In production it would be a page any admitted visitor could load as
# often as they liked, each load counted as the protected site's health for that queue.
if settings.WR_DEMO:
    urlpatterns += [
        path("demo/protected/", views.demo_protected, name="demo-protected"),
        path("demo/protected/finish", views.demo_finish, name="demo-finish"),
        path("demo/<queue:slug>/protected/", views.demo_protected, name="demo-protected-queue"),
        path("demo/<queue:slug>/protected/finish", views.demo_finish, name="demo-finish-queue"),
    ]
