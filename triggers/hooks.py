"""`POST /v1/hooks/<id>`: the one unauthenticated route; the signature of the body is its credential.

A plain view (not the token-authenticated API): it reads at most HOOK_BODY_MAX_BYTES of the body
itself, hands it to `triggers.services.receive`, and answers its JSON. No CSRF (no session is
used); no 5xx for anything a sender can send.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from tether.limits import HOOK_BODY_MAX_BYTES
from triggers import services


def _body(request: HttpRequest) -> tuple[bytes | None, int]:
    """Return (the body, its size), or (None, the size) when it is larger than a trigger takes."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > HOOK_BODY_MAX_BYTES:
        return None, declared
    body = request.read(HOOK_BODY_MAX_BYTES + 1)
    if len(body) > HOOK_BODY_MAX_BYTES:
        return None, max(declared, len(body))
    return body, len(body)


@csrf_exempt
def hook(request: HttpRequest, trigger_id: str) -> JsonResponse:
    if request.method != "POST":
        response = JsonResponse(
            {"error": f"method {request.method} is not allowed here; use POST"}, status=405
        )
        response["Allow"] = "POST"
        return response
    body, size = _body(request)
    answer = services.receive(
        trigger_id=int(trigger_id),
        headers=request.headers,
        body=body,
        body_bytes=size,
        content_type=request.content_type or "",
    )
    return JsonResponse(answer.body, status=answer.status)
