from django.urls import path

from . import converters, views  # noqa: F401  (converters registers the "queue" path converter)

urlpatterns = [
    path("", views.home, name="home"),
    path("q/<queue:slug>/", views.waiting_page, name="waiting-page"),
    path("demo/protected/", views.demo_protected, name="demo-protected"),
    path("demo/protected/finish", views.demo_finish, name="demo-finish"),
    path("demo/<queue:slug>/protected/", views.demo_protected, name="demo-protected-queue"),
    path("demo/<queue:slug>/protected/finish", views.demo_finish, name="demo-finish-queue"),
]
