"""The edge in front of the product sets the forwarded headers itself (issue 13, item 10)."""

from __future__ import annotations

import re

from .stack import ROOT


def test_nginx_sets_the_forwarded_scheme_and_host_itself_and_never_passes_the_clients_on():
    """Seen: nginx passed the client's X-Forwarded-Proto through, so a TLS-terminating deploy looped on the
    SSL redirect and a plain-HTTP client could claim HTTPS."""
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    locations = re.findall(r"location [^{]+\{([^}]*)\}", conf)
    assert len(locations) == 2
    for body in locations:
        assert "proxy_set_header X-Forwarded-Proto $scheme;" in body
        assert "proxy_set_header X-Forwarded-Host $host;" in body
    assert "$http_x_forwarded_proto" not in conf and "$http_x_forwarded_host" not in conf
