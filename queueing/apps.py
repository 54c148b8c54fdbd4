from django.apps import AppConfig
from django.db.models.signals import post_migrate


class QueueingConfig(AppConfig):
    name = "queueing"
    verbose_name = "Queues"

    def ready(self) -> None:
        from .schedules import beat_schedules_ensure

        post_migrate.connect(beat_schedules_ensure, sender=self)
