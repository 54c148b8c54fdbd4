"""The ASGI application (uvicorn): websockets for live push. HTTP is served by granian running web.py (or,
for comparison, gunicorn running wsgi.py); this ASGI app answers HTTP too, for completeness, but is not
deployed for it (bench/RESULTS.md says why)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")

django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from admin_dashboard.routing import websocket_urlpatterns as dashboard_sockets  # noqa: E402
from queueing.routing import websocket_urlpatterns as queue_sockets  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi,
        # Visitors' sockets authenticate by ticket, without the session machinery (which would wrap every
        # message sent); the routes that need a logged-in user wrap themselves in AuthMiddlewareStack.
        "websocket": AllowedHostsOriginValidator(URLRouter(queue_sockets + dashboard_sockets)),
    }
)
