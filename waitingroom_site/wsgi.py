"""The WSGI application gunicorn serves: Django, with status polls answered in front of it
(fastpath.HotPathWSGI)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "waitingroom_site.settings")

django_application = get_wsgi_application()

from waitingroom_site.fastpath import HotPathWSGI  # noqa: E402  (needs Django set up)

application = HotPathWSGI(django_application)
