"""The edge in front of the product sets the forwarded headers itself (issue 13, item 10)."""

from __future__ import annotations

import re

from .stack import ROOT


def test_nginx_sets_the_forwarded_scheme_and_host_itself_and_never_passes_the_clients_on():
    """Seen: nginx passed the client's X-Forwarded-Proto through, so a TLS-terminating deploy looped on the
    SSL redirect and a plain-HTTP client could claim HTTPS."""
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    locations = [body for body in re.findall(r"location [^{]+\{([^}]*)\}", conf) if "proxy_pass" in body]
    assert len(locations) == 2  # every location that passes requests on (the others answer themselves)
    for body in locations:
        assert "proxy_set_header X-Forwarded-Proto $scheme;" in body
        assert "proxy_set_header X-Forwarded-Host $host;" in body
    assert "$http_x_forwarded_proto" not in conf and "$http_x_forwarded_host" not in conf


def test_the_websocket_server_believes_forwarded_headers_only_from_the_proxy():
    """Seen: the ws service trusted X-Forwarded-* from anyone (`--forwarded-allow-ips *`)."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["ws"]["command"]
    allowed = command[command.index("--forwarded-allow-ips") + 1]
    assert "*" not in allowed
    web_trusted = compose["x-app"]["environment"]["WR_TRUSTED_PROXIES"]
    assert allowed == web_trusted  # the same proxies the web service believes
