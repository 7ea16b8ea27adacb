"""`/mcp`: Tether's MCP server over streamable HTTP, mounted beside Django in the ASGI app.

`McpMount(django_app)` sends `/mcp` to the MCP SDK's streamable-HTTP app and every other
request to Django. Each `/mcp` request must carry `Authorization: Bearer <API token>`; the
token is looked up again on every request (web.auth), so a revoked or expired token is
refused at once with a 401, and an MCP session answers only the user who opened it.

A request whose Bearer token is an act's (the per-act token a running `command` agent gets as
`TETHER_TOKEN`) is not a user's: it is relayed whole to the worker socket the token names,
where that act's own MCP endpoint answers it (`web.mcp_act`: `delegate` and `get_run` for
that act only) — for an agent with network egress that reaches this server instead of its
loopback relay. A token Tether did not sign is refused here; one whose act ended, there.

daphne sends no ASGI lifespan events, so the SDK's session manager (which owns the task
group that sessions live in) is started by the first `/mcp` request, as a task on the
server's own event loop, and lives as long as the process.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx2
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings

from instances import gateway
from web import auth
from web.mcp_server import build_server, http_caller

log = logging.getLogger(__name__)

PATH = "/mcp"
NO_TOKEN = "authentication required: send 'Authorization: Bearer <token>' (an API token of yours)"
BAD_HEADER = "the Authorization header must be 'Bearer <token>'"


class McpMount:
    """ASGI app: `/mcp` to Tether's MCP server (token-authenticated), everything else to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.server = build_server(http_caller)
        # The Host header is checked against ALLOWED_HOSTS below, as Django checks it; the SDK's own
        # DNS-rebinding guard knows only localhost, and a rebinding page has no token to send anyway.
        self.mcp = self.server.streamable_http_app(
            streamable_http_path=PATH,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._started = asyncio.Event()
        self._starting: asyncio.Task | None = None
        self._failure: BaseException | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != PATH:
            return await self.app(scope, receive, send)
        if not _host_allowed(scope):
            return await _refuse(send, 400, "this host name is not in TETHER_ALLOWED_HOSTS")
        header = _header(scope, b"authorization")
        if not header:
            return await _refuse(send, 401, NO_TOKEN)
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return await _refuse(send, 401, BAD_HEADER)
        if token.strip().startswith(gateway.TOKEN_PREFIX):
            return await _relay_to_act(scope, receive, send, token.strip())
        user_id, refusal = await sync_to_async(_authenticate, thread_sensitive=False)(token.strip())
        if user_id is None:
            return await _refuse(send, 401, refusal)
        # The SDK binds each session to the principal that opened it; the principal is the user.
        principal = AccessToken(token="", client_id=f"tether-user-{user_id}", scopes=[], subject=str(user_id))
        scope = {**scope, "user": AuthenticatedUser(principal), "tether.user_id": user_id}
        await self._ensure_running()
        await self.mcp(scope, receive, send)

    async def _ensure_running(self) -> None:
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._hold_session_manager())
        await self._started.wait()
        if self._failure is not None:
            raise RuntimeError("the MCP session manager could not start") from self._failure

    async def _hold_session_manager(self) -> None:
        try:
            async with self.server.session_manager.run():
                self._started.set()
                await asyncio.Event().wait()  # until the process ends
        except BaseException as exc:
            self._failure = exc
            log.exception("the MCP session manager stopped")
            raise
        finally:
            self._started.set()


ACT_BODY_BYTES = 1 << 20
RELAYED_HEADERS = (b"authorization", b"content-type", b"accept", b"mcp-protocol-version", b"mcp-session-id",
                   b"last-event-id", b"user-agent")
ACT_ENDED = "this token is not a live act's: an act's token dies when its act ends"


async def _relay_to_act(scope: dict, receive: Any, send: Any, token: str) -> None:
    """Send one request carrying an act token to the act's MCP endpoint on its worker's socket."""
    try:
        claims = gateway.read_token(token)
    except gateway.GatewayError:
        return await _refuse(send, 401, ACT_ENDED)
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if len(body) > ACT_BODY_BYTES:
            return await _refuse(send, 413, f"the request body is over {ACT_BODY_BYTES} bytes")
        if not message.get("more_body"):
            break
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() in RELAYED_HEADERS}
    transport = httpx2.AsyncHTTPTransport(uds=str(claims["s"]))
    try:
        async with httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(60.0, connect=5.0)) as client:
            answer = await client.request(scope["method"], f"http://tether-act{PATH}", headers=headers, content=body)
    except httpx2.HTTPError:
        return await _refuse(send, 401, ACT_ENDED)  # no worker answers for it: the act is gone
    returned = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()
                if k.lower() in ("content-type", "mcp-session-id", "www-authenticate")]
    returned.append((b"content-length", str(len(answer.content)).encode()))
    await send({"type": "http.response.start", "status": answer.status_code, "headers": returned})
    await send({"type": "http.response.body", "body": answer.content})


def _authenticate(token: str) -> tuple[int | None, str]:
    close_old_connections()
    try:
        user, refusal = auth.authenticate_token(token)
        return (user.pk if user is not None else None), refusal
    finally:
        close_old_connections()


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return ""


def _host_allowed(scope: dict) -> bool:
    host = _header(scope, b"host")
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, settings.ALLOWED_HOSTS)


async def _refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="tether"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
