"""Django's WSGI application, for a WSGI server (`runstack --web-server gunicorn`). The product's own web
server runs web.py (ASGI), which answers the hot paths on its event loop and hands the rest to this."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")

application = get_wsgi_application()
