from django.apps import AppConfig


class AdminDashboardConfig(AppConfig):
    name = "admin_dashboard"
    verbose_name = "Staff dashboard"
