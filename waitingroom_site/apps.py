from django.apps import AppConfig


class WaitingRoomSiteConfig(AppConfig):
    name = "waitingroom_site"
    verbose_name = "Waiting Room site"
