"""The metering gateway over the web, for agents with network egress.

Checks the token's signature (anything Tether did not sign is a 401 here) and relays the
request to the worker socket the token names, where `instances.gateway.handle` checks that
its act is still running and meters the call — one handler, one meter per act.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from instances import gateway


@csrf_exempt
def gateway_view(request: HttpRequest, route: str) -> HttpResponse:
    """Relay one Messages API request to the worker serving its token's act."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    path = f"{gateway.PREFIX}/v1/{route}"
    if request.method != "POST":
        return _answer(gateway.error(405, "invalid_request_error", f"{request.method} is not allowed here; use POST"))
    try:
        claims = gateway.read_token(gateway.token_from(headers))
    except gateway.GatewayError as refused:
        return _answer(refused.answer())
    try:
        raw = request.body
    except RequestDataTooBig:
        return _answer(gateway.error(413, "request_too_large", "the request body is larger than this server accepts"))
    client = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(claims["s"])), timeout=httpx2.Timeout(None, connect=5.0))
    forwarded = {k: v for k, v in headers.items() if k not in ("host", "content-length", "connection", "cookie")}
    try:
        upstream = client.send(
            client.build_request("POST", f"http://gateway{path}", headers=forwarded, content=raw), stream=True
        )
    except httpx2.HTTPError:
        client.close()
        return _answer(gateway.error(401, "authentication_error", "this gateway token's act has ended; it is no longer valid"))
    returned = {k: v for k, v in upstream.headers.items() if k.lower() in gateway.RETURNED_HEADERS}
    return _answer(gateway.Answer(upstream.status_code, returned, _chunks(client, upstream)))


def _chunks(client: httpx2.Client, upstream: httpx2.Response) -> Iterator[bytes]:
    try:
        yield from upstream.iter_raw()
    except httpx2.HTTPError:
        pass
    finally:
        upstream.close()
        client.close()


async def _async(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Stream a blocking iterator under ASGI one chunk at a time (never buffered whole)."""
    step = sync_to_async(next, thread_sensitive=False)
    try:
        while (chunk := await step(chunks, None)) is not None:
            yield chunk
    finally:
        await sync_to_async(chunks.close, thread_sensitive=False)()  # type: ignore[attr-defined]


def _answer(answer: gateway.Answer) -> HttpResponse:
    body: Any = answer.body
    if isinstance(body, bytes):
        response: HttpResponse = HttpResponse(body, status=answer.status)
    else:
        response = StreamingHttpResponse(_async(body), status=answer.status)  # type: ignore[assignment]
    for name, value in answer.headers.items():
        response[name] = value
    return response
