from django.urls import path

from queueing import converters  # noqa: F401  (registers the "queue" path converter)

from . import views

app_name = "dashboard"

urlpatterns = [
    path("", views.dashboard_index, name="index"),
    path("live.json", views.dashboard_live, name="live"),
    path("<queue:slug>/", views.dashboard_queue, name="queue"),
    path("<queue:slug>/data.json", views.dashboard_queue_data, name="queue-data"),
    path("<queue:slug>/control", views.dashboard_control, name="control"),
    path("<queue:slug>/snapshots.csv", views.export_snapshots, name="export-snapshots"),
    path("<queue:slug>/audit.csv", views.export_changes, name="export-changes"),
]
