"""Who may read the metrics (README "Metrics"), for the web processes' `/metrics` (metrics.py) and the
supervisor's own port (runstack.metrics_serve, served by `serve` here) alike, without Django: Prometheus
scraping from an address in WR_METRICS_NETWORKS, or anyone with `Authorization: Bearer <WR_METRICS_TOKEN>`.

The address is the connection's peer, never a forwarded one. A request that came through a proxy (it carries
X-Forwarded-For, Forwarded or X-Real-IP) is not judged by its peer at all (issue 50): behind a proxy on the
same host, or in compose, the peer is the proxy's, so the whole internet would read it as a neighbour.
Through a proxy only the token opens it.
"""

from __future__ import annotations

import hmac
import ipaddress
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The headers a proxy adds (WSGI environ names, as Django's request.META has them).
PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def networks(specs: Iterable[str]) -> list[Network]:
    return [ipaddress.ip_network(spec.strip(), strict=False) for spec in specs if spec.strip()]


def permitted(environ: Mapping[str, object], *, allowed: Iterable[Network], token: str) -> bool:
    """Whether a request (its WSGI environ, or Django's request.META) may read the metrics."""
    given = str(environ.get("HTTP_AUTHORIZATION", ""))
    if token and hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return True
    if any(environ.get(name) for name in PROXY_HEADERS):
        return False
    try:
        peer = ipaddress.ip_address(str(environ.get("REMOTE_ADDR", "")))
    except ValueError:
        return False
    return any(peer in network for network in allowed)


def serve(registry: CollectorRegistry, address: str, port: int, *, allowed: Iterable[Network], token: str) -> None:
    """The supervisor's metrics port (runstack, WR_METRICS_PORT): `registry` on address:port from a thread,
    to whom `permitted` lets in; 403 to anyone else. OSError when the port cannot be had."""
    app, networks_ = make_wsgi_app(registry), list(allowed)

    def guarded(environ: dict[str, Any], start_response: Any) -> Any:
        if permitted(environ, allowed=networks_, token=token):
            return app(environ, start_response)
        start_response("403 Forbidden", [("Content-Type", "text/plain")])
        return [b"Metrics are for Prometheus: from WR_METRICS_NETWORKS, or with the bearer WR_METRICS_TOKEN.\n"]

    server = make_server(address, port, guarded, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A scrape every few seconds is not news."""
