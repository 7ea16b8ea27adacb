"""The websocket Origin check: a console socket opens only from this site's own origin.

The Origin's scheme, host and port must equal the site the socket was opened on (the
Host header, with http for ws and https for wss or a trusted proxy's
X-Forwarded-Proto, as Django's CSRF check does for forms), or one of
CSRF_TRUSTED_ORIGINS; the Host itself must be one of ALLOWED_HOSTS. A missing,
"null" or malformed Origin, or a missing Host, is refused at the handshake (daphne
answers 403). channels' AllowedHostsOriginValidator compares hosts only: a page on
`http://127.0.0.1:1` could stream a server on 127.0.0.1:8000.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]


def parse_origin(value: str) -> Origin | None:
    """Return (scheme, host, port) of an http(s) origin, the port made explicit; None when malformed."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        return None
    return parts.scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[parts.scheme]


def origin_allowed(origin: str | None, host: str | None, secure: bool) -> bool:
    """Return True when a socket opened on `host` (over TLS when `secure`) may be used from `origin`."""
    if not origin or not host:
        return False
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    claimed = parse_origin(origin)
    if claimed is None:
        return False
    own = parse_origin(f"{'https' if secure else 'http'}://{host}")
    trusted = {parse_origin(o) for o in settings.CSRF_TRUSTED_ORIGINS}
    return claimed == own or claimed in trusted


def _secure(scope: dict[str, Any], headers: dict[bytes, bytes]) -> bool:
    if scope.get("scheme") == "wss":
        return True
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, value = proxy
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin-1")
        return headers.get(header, b"").decode("latin-1").split(",")[0].strip() == value
    return False


class SameOriginValidator:
    """ASGI middleware: refuse a websocket handshake whose Origin is not this site's (see module doc)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards websocket connections only")
        headers = dict(scope.get("headers", []))
        origin = headers.get(b"origin", b"").decode("latin-1")
        host = headers.get(b"host", b"").decode("latin-1")
        if origin_allowed(origin, host, _secure(scope, headers)):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
