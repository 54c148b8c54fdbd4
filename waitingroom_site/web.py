"""The application the web server runs (granian, ASGI): status polls and stateless windows answered on the
event loop, everything else by Django's WSGI handler in a pool of threads (fastpath.HotPathASGI)."""

import os

from django.conf import settings
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")

django_application = get_wsgi_application()

from waitingroom_site.fastpath import HotPathASGI  # noqa: E402  (needs Django set up)

application = HotPathASGI(django_application, threads=settings.WR_WEB_THREADS)
