"""A database outage answers 503 with Retry-After, never 500; so does a Tether that is busy.

Works beneath any view layer (plain Django views, the API's, the console's): a view that
meets a transient database error (`tether.dbfaults.is_transient`: a cut connection, a
server restarting, a lock timeout) raises it, and this middleware turns it into a 503
that says so — JSON `{"error": ...}` for API clients, a small page that reloads itself
for people — with `Retry-After`. The broken connection is closed, so the next request
reconnects. Any other error still goes to Django's handling.

Two messages, each true: a request that waited its bound for one of Tether's own connections
(`tether.dbpool`: every one at work; `dbfaults.is_busy`) is told Tether is busy, and to retry
after `BUSY_RETRY_AFTER_SECONDS`; only a database that does not answer is an outage.

A middleware inside this one (sessions, authentication, sign-in throttling) that meets the
outage never reaches `process_exception`: Django turns its error into a 500 on the spot, and
only says so through the `got_request_exception` signal. The signal notes the error on the
request, and a 500 that comes back with a transient database error noted becomes the 503.
"""

from __future__ import annotations

import logging
import sys

from django.core.signals import got_request_exception
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from tether import dbfaults

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 3
MESSAGE = "Tether cannot reach its database right now; it is reconnecting. Try again in a few seconds."
_PAGE = (
    "<!doctype html><html lang=en><head><meta charset=utf-8>"
    f'<meta http-equiv="refresh" content="{RETRY_AFTER_SECONDS}">'
    "<title>Reconnecting — Tether</title></head><body>"
    f"<h1 data-error-message>{MESSAGE}</h1><p>This page reloads by itself.</p></body></html>"
)
BUSY_RETRY_AFTER_SECONDS = 2
BUSY_MESSAGE = (
    "Tether is busy: every one of its database connections is at work and this request waited its turn"
    " too long. Try again in a few seconds."
)
_BUSY_PAGE = (
    "<!doctype html><html lang=en><head><meta charset=utf-8>"
    f'<meta http-equiv="refresh" content="{BUSY_RETRY_AFTER_SECONDS}">'
    "<title>Busy — Tether</title></head><body>"
    f"<h1 data-error-message>{BUSY_MESSAGE}</h1><p>This page reloads by itself.</p></body></html>"
)
_JSON_PREFIXES = ("/v1/", "/gateway/", "/mcp", "/readyz", "/healthz", "/metrics")


def wants_json(request: HttpRequest) -> bool:
    return request.path.startswith(_JSON_PREFIXES) or "application/json" in request.headers.get("Accept", "")


def unavailable(request: HttpRequest, *, busy: bool = False) -> HttpResponse:
    """Return the 503 that stands for "the database is down; retry shortly" (or, `busy`, "Tether is busy")."""
    message, page, after = (
        (BUSY_MESSAGE, _BUSY_PAGE, BUSY_RETRY_AFTER_SECONDS)
        if busy
        else (MESSAGE, _PAGE, RETRY_AFTER_SECONDS)
    )
    response: HttpResponse
    if wants_json(request):
        response = JsonResponse({"error": message}, status=503)
    else:
        response = HttpResponse(page, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(after)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseUnavailableMiddleware:
    """Turn a transient database error raised by a view into a 503 with Retry-After."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        failed = getattr(request, _NOTED, None)
        if response.status_code == 500 and failed is not None:
            return self.process_exception(request, failed) or response
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not dbfaults.is_transient(exception):
            return None
        busy = dbfaults.is_busy(exception)
        said = "no database connection free in time" if busy else "database unavailable"
        log.warning("%s %s: %s (%s); answered 503", request.method, request.path, said, exception)
        if not connection.in_atomic_block:
            dbfaults.reset()
        return unavailable(request, busy=busy)


_NOTED = "_tether_transient_error"


def _note_transient(sender: object, request: HttpRequest | None = None, **kwargs: object) -> None:
    """Note on the request a transient database error that Django is about to answer with a 500."""
    error = sys.exc_info()[1]
    if request is not None and error is not None and dbfaults.is_transient(error):
        setattr(request, _NOTED, error)


got_request_exception.connect(_note_transient, dispatch_uid="tether.middleware.note_transient")
