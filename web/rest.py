"""The frame of the REST API (/v1/): one NinjaAPI that parses, authenticates, refuses and documents.

Routes live with their app (`instances.api`, `web.api`, `reviews.api`) as ninja Routers
whose schemas both validate requests and make /v1/openapi.json. This module owns what is
common to every route: the JSON body parser and its limits (413 over the upload limit, 415
not JSON, 400 nested deeper than MAX_DEPTH or NaN/Infinity), authentication (a Bearer token,
or the console's session with its CSRF check, `web.auth`), and the one error shape,
`{"error": "...", "field": "..."}`, for every refusal, whatever raised it: a route lets a service's
`tether.refusals.Refused` through and it is answered with its message, status and field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Path
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from instances.models import Credential, Instance
from loops.models import Run
from loops.schemas import Error
from tether.refusals import Refused
from tether.schema import MAX_ID, describe
from web.auth import authenticate_token, error

MAX_DEPTH = 32
Id = Annotated[int, Path(ge=0, le=MAX_ID)]  # the `id` converter already refuses anything else (404)
ERRORS = frozenset({400, 401, 402, 403, 404, 405, 409, 413, 415})


class ApiError(Refused):
    """A refusal the API answers as `{"error": message, "field": field}` with `status`.

    Any other `Refused` a route lets through (a service's) is answered the same way (`_api_error`).
    """


class JsonBody(Parser):
    """Read a request body as a JSON object, within the API's limits."""

    def parse_body(self, request: HttpRequest) -> Any:
        data = read_json(request.content_type or "", request.body)
        if not isinstance(data, dict):
            raise ApiError("the request body must be a JSON object")
        return data


def read_json(content_type: str, body: bytes, *, required: bool = False) -> Any:
    """Return `body` parsed as JSON within the API's limits; ApiError 415 (not JSON) or 400 (unreadable).

    `required`: a missing Content-Type is refused too (a webhook must say what it sends).
    """
    kind = content_type or ""
    if (kind or required) and kind != "application/json" and not kind.endswith("+json"):
        raise ApiError(f"the request body must be JSON (Content-Type: application/json), not {kind or 'unnamed'}", 415)
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(f"the request body is nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}") from None
    _check_depth(data)
    return data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _check_depth(data: Any) -> None:
    pending: list[tuple[Any, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise ApiError(f"the request body is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)


class TokenOrSession(HttpBearer):
    """`Authorization: Bearer TOKEN` (web.auth), else the console's session with its CSRF check."""

    def __call__(self, request: HttpRequest) -> Any:
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise ApiError("the Authorization header must be 'Bearer <token>'", 401)
            user, refusal = authenticate_token(token.strip())
            if user is None:
                raise ApiError(refusal, 401)
            request.user = user
            return user
        if request.user.is_authenticated:
            if request.method not in ("GET", "HEAD", "OPTIONS"):
                rejected = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
                if rejected is not None:
                    raise ApiError("CSRF check failed; reload the page and try again", 403)
            return request.user
        raise ApiError("authentication required: send 'Authorization: Bearer <token>' or sign in", 401)

    def authenticate(self, request: HttpRequest, token: str) -> Any:  # pragma: no cover - __call__ decides
        return None


DESCRIPTION = (
    "Durable, governed autonomous agent loops. Authenticate with `Authorization: Bearer TOKEN` (or the "
    'console\'s session, with its CSRF token). Every error is JSON: `{"error": "...", "field": "..."}` '
    "(400 bad input, 401 no or bad token, 402 no budget, 403 not allowed, 404 unknown or malformed id or "
    "route, 405 wrong method (with `Allow`), 409 wrong state, 413 body too large, 415 body not JSON). "
    f"Request bodies are JSON objects nested at most {MAX_DEPTH} levels; strings may not hold NUL "
    "characters or lone surrogates; a CRLF counts as one character."
)

api = NinjaAPI(
    title="Tether",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api",
    docs_url=None,
    auth=TokenOrSession(),
    parser=JsonBody(),
)


def _answer(request: HttpRequest, message: str, status: int, field: str | None = None) -> HttpResponse:
    return error(message, status, **({"field": field} if field else {}))


@api.exception_handler(Refused)
def _api_error(request: HttpRequest, exc: Refused) -> HttpResponse:
    """Answer a refusal, the API's own or a service's (`loops`, `instances`, `triggers`), with its status."""
    return _answer(request, exc.message, exc.status, exc.field)


def _unreadable(request: HttpRequest, message: str, status: int) -> HttpResponse:
    """A body refused before the view ran: an unknown id still answers 404 first, as the view would."""
    missing = _absent(request)
    if missing:
        return _answer(request, missing, 404)
    return _answer(request, message, status)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    cause = exc.__cause__
    if isinstance(cause, ApiError):  # ninja wraps what the body parser raises
        return _unreadable(request, cause.message, cause.status)
    if isinstance(cause, RequestDataTooBig):
        return _too_big(request, cause)
    if isinstance(exc, AuthenticationError):
        return _answer(
            request, "authentication required: send 'Authorization: Bearer <token>' or sign in", 401
        )
    return _answer(request, exc.message, exc.status_code)


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: Exception) -> HttpResponse:
    message = f"the request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes"
    return _unreadable(request, message, 413)


@api.exception_handler(MultiPartParserError)
def _unparsable(request: HttpRequest, exc: MultiPartParserError) -> HttpResponse:
    """A multipart body Django cannot read (no boundary, say), met while the session's CSRF token is looked for."""
    message = f"the request body must be JSON (Content-Type: application/json); this one cannot be read: {exc}"
    return _answer(request, message, 400)


@api.exception_handler(NinjaValidationError)
def _invalid(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    errors = []
    for found in exc.errors:
        loc = list(found.get("loc", ()))
        source = loc.pop(0) if loc else ""
        if source == "body" and loc:
            loc.pop(0)  # the view's argument name
        errors.append({**found, "loc": tuple(loc), "source": source})
    missing = _absent(request)
    if missing:  # as if no body were read: another user's or an unknown id is a 404, whatever the body
        return _answer(request, missing, 404)
    message, field = describe(errors)
    return _answer(request, message, 400, field)


def _absent(request: HttpRequest) -> str:
    """Return why the ids in the request's path name nothing of the user's ("" when they all exist)."""

    ids = request.resolver_match.kwargs if request.resolver_match else {}
    user = request.user
    if "credential_id" in ids and not Credential.objects.filter(owner=user, pk=ids["credential_id"]).exists():
        return f"credential {ids['credential_id']} not found"
    if "instance_id" in ids:
        if "run_id" in ids:
            if not Run.objects.filter(owner=user, instance_id=ids["instance_id"], pk=ids["run_id"]).exists():
                return f"run {ids['run_id']} of instance {ids['instance_id']} not found"
        elif not Instance.objects.filter(owner=user, pk=ids["instance_id"]).exists():
            return f"instance {ids['instance_id']} not found"
    return ""


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _answer(request, str(exc) or "not found", 404)


@csrf_exempt
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Answer any /v1/ path no route matches (an unknown route, a malformed id) with a JSON 404."""
    return error(f"no API route {request.path!r}; see /v1/openapi.json", 404)


def route(
    method: Callable[..., Any],
    path: str,
    name: str,
    answer: Any,
    summary: str,
    *,
    status: int = 200,
    refusals: tuple[int, ...] = (),
) -> Any:
    """Declare a route: `method` (`router.get`, ...) of `path`, named `name`, answering `answer` with `status`
    or any documented refusal (`errors`, with `refusals` besides), `summary` in /v1/openapi.json."""
    return method(path, url_name=name, response={status: answer, **errors(*refusals)}, summary=summary)


def errors(*statuses: int) -> dict[frozenset[int], Any]:
    """The documented refusals of a route (all of them share the Error schema)."""

    return {frozenset(ERRORS | set(statuses)): Error}
