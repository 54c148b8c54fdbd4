"""The Celery app: admission ticks and cleanup run here, scheduled by django-celery-beat."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")

app = Celery("waitingroom")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
