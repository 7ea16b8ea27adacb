"""API authentication: `Authorization: Bearer TOKEN` for clients, the session for the console.

Tokens are stored as SHA-256 digests; the plain token is shown once, when made.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from loops.models import ApiToken


def make_token(user) -> str:
    """Create an API token for `user`; return the plain token (never stored)."""
    token = "tth_" + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, digest=_digest(token), prefix=token[:8])
    return token


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def user_for_token(token: str):
    found = ApiToken.objects.select_related("user").filter(digest=_digest(token)).first()
    if found is None or not found.user.is_active:
        return None
    ApiToken.objects.filter(pk=found.pk).update(last_used_at=timezone.now())
    return found.user


def error(message: str, status: int = 400, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def api_view(methods: tuple[str, ...]) -> Callable:
    """Authenticate by bearer token or session (with CSRF), and check the method."""

    def wrap(view: Callable) -> Callable:
        @csrf_exempt
        @functools.wraps(view)
        def inner(request: HttpRequest, *args: Any, **kwargs: Any):
            if request.method not in methods:
                return error(f"method {request.method} is not allowed here; use {' or '.join(methods)}", 405)
            header = request.headers.get("Authorization", "")
            if header:
                scheme, _, token = header.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    return error("the Authorization header must be 'Bearer <token>'", 401)
                user = user_for_token(token.strip())
                if user is None:
                    return error("the API token is not valid; make one with `python manage.py createtoken`", 401)
                request.user = user
            elif request.user.is_authenticated:
                if request.method not in ("GET", "HEAD", "OPTIONS"):
                    rejected = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
                    if rejected is not None:
                        return error("CSRF check failed; reload the page and try again", 403)
            else:
                return error("authentication required: send 'Authorization: Bearer <token>' or sign in", 401)
            return view(request, *args, **kwargs)

        return inner

    return wrap


def json_body(request: HttpRequest, allowed: dict[str, tuple[type, ...]], required: tuple[str, ...] = ()) -> dict:
    """Parse a JSON object body, refusing unknown fields and wrong types with a clear message."""
    if not request.body:
        data: Any = {}
    else:
        try:
            data = json.loads(request.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    missing = [name for name in required if data.get(name) in (None, "")]
    if missing:
        raise BadRequest(f"missing required field(s): {', '.join(missing)}")
    for name, value in data.items():
        types = allowed[name]
        if value is None:
            continue
        if isinstance(value, bool) and bool not in types:
            raise BadRequest(f"{name} must be {_type_words(types)}, not true/false")
        if not isinstance(value, types):
            raise BadRequest(f"{name} must be {_type_words(types)}, not {type(value).__name__}")
    return data


def _type_words(types: tuple[type, ...]) -> str:
    words = {str: "a string", int: "a whole number", float: "a number", bool: "true or false", list: "a list", dict: "an object"}
    return " or ".join(words.get(t, t.__name__) for t in types)


class BadRequest(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
