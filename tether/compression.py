"""GZip for the console's HTML and the API's JSON, never for a response that holds a secret.

Django's `GZipMiddleware`, narrowed. BREACH (Django's docs, "GZip middleware") recovers a secret from
the size of compressed responses that also echo what an attacker sends. Django's own defences cover
the CSRF token: it is masked afresh in every response, and `GZipMiddleware` pads each response with
random bytes ("Heal The Breach"). On top of those, what is left uncompressed:

- a response marked `Cache-Control: no-store`: the pages that show a secret once (a new API token),
  or hold credentials, and the 503 page, are marked so that nothing keeps them;
- anything but HTML and JSON (static files come precompressed from WhiteNoise; images and archives
  gain nothing);
- streamed responses (the model gateway's): gzip would hold back chunks an agent waits for.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponseBase
from django.middleware.gzip import GZipMiddleware

COMPRESSED_TYPES = ("text/html", "application/json")


class ConsoleGZipMiddleware(GZipMiddleware):
    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        kind = response.get("Content-Type", "").split(";")[0].strip().lower()
        if (
            response.streaming
            or kind not in COMPRESSED_TYPES
            or "no-store" in response.get("Cache-Control", "").lower()
        ):
            return response
        return super().process_response(request, response)
