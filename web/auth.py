"""API authentication: `Authorization: Bearer TOKEN` for clients, the session for the console.

The tokens live here; the REST API checks them (or the session and its CSRF token) in
`web.rest.TokenOrSession`, the MCP endpoint in `web.mcp_http`.

Tokens are stored as SHA-256 digests; the plain token is shown once, when made. A token
has a name and may expire; every request looks it up again, so revoking one (which
deletes it) refuses the very next request. The console's websockets use the session
only, never a token, so no socket outlives a revoked token.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.http import JsonResponse
from django.utils import timezone

from audit import trail
from instances.validation import invisible
from loops.models import ApiToken

log = logging.getLogger(__name__)


TOKEN_NAME_MAX = 100
TOKEN_DAYS_MAX = 3650
NOT_VALID = (
    "the API token is not valid (unknown or revoked); make one on the console's API tokens page "
    "or with `python manage.py createtoken USERNAME`"
)


def make_token(user, *, name: str = "", days: int | None = None, by=None, via: str = "cli", request=None) -> str:
    """Create an API token for `user`, valid for `days` (None: until revoked); return the plain token.

    Only its digest is stored: the plain token cannot be shown again. The audit trail records
    `token.issue` by `by` (default: `user`, or from the CLI the machine's user) through `via` (its name,
    prefix and expiry; never the token).
    """
    if len(name) > TOKEN_NAME_MAX:
        raise ValueError(f"a token's name can be at most {TOKEN_NAME_MAX} characters")

    if why := invisible(name):
        raise ValueError(f"a token's name {why}")
    if days is not None and not 1 <= days <= TOKEN_DAYS_MAX:
        raise ValueError(f"a token's lifetime must be 1 to {TOKEN_DAYS_MAX} days")
    token = "tth_" + secrets.token_urlsafe(32)
    expires_at = timezone.now() + timedelta(days=days) if days is not None else None
    with transaction.atomic():
        made = ApiToken.objects.create(
            user=user, name=name, digest=_digest(token), prefix=token[:8], expires_at=expires_at
        )
        _audit("token.issue", made, by if by is not None or via == "cli" else user, via, request, None)
    return token


def revoke_token(*, token_id: int, user=None, by=None, via: str = "cli", request=None) -> ApiToken | None:
    """Delete a token (only `user`'s when given); return it, or None when there is no such token.

    The audit trail records `token.revoke` by `by` (default: `user`, or from the CLI the machine's user)
    through `via`.
    """
    tokens = ApiToken.objects.all() if user is None else ApiToken.objects.filter(user=user)
    with transaction.atomic():
        found = tokens.select_related("user").filter(pk=token_id).first()
        if found is not None:
            shown = _shown(found)
            found.delete()
            _audit("token.revoke", found, by if by is not None or via == "cli" else user, via, request, shown)
    if found is not None:
        log.info("API token %s (%s…) of user %s revoked", token_id, found.prefix, found.user_id)
    return found


def _shown(token: ApiToken) -> dict[str, Any]:
    """Return what the audit trail says of a token: never its value or digest."""
    return {
        "name": token.name,
        "prefix": token.prefix,
        "expires_at": token.expires_at.isoformat() if token.expires_at else None,
    }


def _audit(action: str, token: ApiToken, by, via: str, request, before: dict[str, Any] | None) -> None:
    trail.record(
        user=by, action=action, owner=token.user, via=via, request=request,
        detail={"token": token.pk, **trail.changes(before, None if before else _shown(token))},
    )


def tokens_of(user):
    """Return `user`'s tokens, newest first (digests only: the secrets are not stored)."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-pk")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def authenticate_token(token: str) -> tuple[Any, str]:
    """Return (user, "") for a live token of an active user, else (None, why it is refused)."""
    found = ApiToken.objects.select_related("user").filter(digest=_digest(token)).first()
    if found is None or not found.user.is_active:
        return None, NOT_VALID
    now = timezone.now()
    if found.expires_at is not None and found.expires_at <= now:
        return None, (
            f"the API token {found.prefix}… expired at {found.expires_at:%Y-%m-%d %H:%M} UTC; make a new one "
            "on the console's API tokens page or with `python manage.py token create USERNAME`"
        )
    ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
    return found.user, ""


def user_for_token(token: str):
    """Return the active user a live (known, unexpired) token belongs to, or None."""
    return authenticate_token(token)[0]


def error(message: str, status: int = 400, **extra: Any) -> JsonResponse:
    """Return the API's one error shape: `{"error": "...", ...}` with `status`."""
    return JsonResponse({"error": message, **extra}, status=status)
