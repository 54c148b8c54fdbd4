from django.urls import path

from .. import converters  # noqa: F401  (registers the "queue" path converter)
from . import codes, management, notices, protected, views

urlpatterns = [
    path("queues/<queue:slug>/join", views.JoinView.as_view(), name="queue-join"),
    path("queues/<queue:slug>/status", views.StatusView.as_view(), name="queue-status"),
    path("queues/<queue:slug>/leave", views.LeaveView.as_view(), name="queue-leave"),
    path("queues/<queue:slug>/code", codes.CodeView.as_view(), name="queue-code"),
    path("queues/<queue:slug>/notify", notices.NotifyView.as_view(), name="queue-notify"),
    path("queues/<queue:slug>/challenge", views.ChallengeView.as_view(), name="queue-challenge"),
    path("queues/<queue:slug>/shuffle", views.ShuffleView.as_view(), name="queue-shuffle"),
    path("queues/<queue:slug>/window", views.WindowView.as_view(), name="queue-window"),
    path("queues/<queue:slug>/neighbours", views.NeighboursView.as_view(), name="queue-neighbours"),
    path("queues/<queue:slug>/sessions/verify", protected.VerifyView.as_view(), name="session-verify"),
    path("queues/<queue:slug>/sessions/complete", protected.CompleteView.as_view(), name="session-complete"),
    path("queues/<queue:slug>/sessions/revoke", protected.RevokeView.as_view(), name="session-revoke"),
    path("queues/<queue:slug>/capacity", protected.CapacityView.as_view(), name="queue-capacity"),
    path("queues/<queue:slug>/health", protected.HealthView.as_view(), name="queue-health"),
    path("queues/<queue:slug>/stats", views.StatsView.as_view(), name="queue-stats"),
    path("queues/<queue:slug>/pause", views.PauseView.as_view(), name="queue-pause"),
    path("queues/<queue:slug>/resume", views.ResumeView.as_view(), name="queue-resume"),
    path("queues/<queue:slug>", views.QueueView.as_view(), name="queue-detail"),
    path("queues", views.QueuesView.as_view(), name="queue-list"),
    path("queues/<queue:slug>/codes", views.CodesView.as_view(), name="queue-codes"),
    path("queues/<queue:slug>/levels", management.LevelsView.as_view(), name="queue-levels"),
    path("queues/<queue:slug>/keys", management.KeysView.as_view(), name="queue-keys"),
    path("queues/<queue:slug>/keys/<str:prefix>", management.KeyView.as_view(), name="queue-key"),
]
