"""Signing in: one-time sign-in links (no fixed password anywhere) and the throttle's policy.

Password sign-in is throttled by django-axes (settings: AXES_*). Its failure limit,
cool-off and lockout page come from here, read from TETHER_LOGIN_FAILURE_LIMIT and
TETHER_LOGIN_COOLOFF_SECONDS at each attempt, so an operator changes one setting. Each lockout
is recorded in the audit trail (`signin.locked_out`, on the account it names, via console or
admin by the sign-in page used, with the address and device it came from).
"""

import hashlib
import math
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core import signing
from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes, force_str
from django.utils.http import urlsafe_base64_decode, urlsafe_base64_encode

from audit import trail
from audit.models import AuditEntry

LINK_SALT = "tether.login-link"


def _fingerprint(user) -> str:
    """A digest of the user's password hash: setting a password voids the links made before."""
    return hashlib.sha256(f"{LINK_SALT}:{user.password}".encode()).hexdigest()[:16]


def login_link(user, base_url: str) -> str:
    """Return a link that signs `user` in once, for PASSWORD_RESET_TIMEOUT seconds.

    Each link is signed and has a nonce of its own, spent when it is used: links are independent,
    so using one leaves every other outstanding link of the same person working.
    """
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = signing.dumps({"u": user.pk, "n": secrets.token_urlsafe(16), "p": _fingerprint(user)}, salt=LINK_SALT)
    return base_url.rstrip("/") + reverse("login-once", args=[uid, token])


def use_login_link(uidb64: str, token: str):
    """Return the active user a sign-in link names and spend its nonce; None if it is not valid (any more).

    A spent nonce is a row of the session table under a key derived from it, expiring with the link
    (`clearsessions` removes it then): inserting it is atomic, so a link is used once even by two
    requests at the same moment.
    """

    User = get_user_model()
    try:
        pk = force_str(urlsafe_base64_decode(uidb64))
        payload = signing.loads(token, salt=LINK_SALT, max_age=settings.PASSWORD_RESET_TIMEOUT)
        user = User.objects.get(pk=pk, is_active=True)
    except (signing.BadSignature, User.DoesNotExist, ValueError, TypeError, OverflowError):
        return None
    if not isinstance(payload, dict) or str(payload.get("u")) != str(user.pk) or payload.get("p") != _fingerprint(user):
        return None
    spent = "link" + hashlib.sha256(str(payload.get("n")).encode()).hexdigest()[:36]
    expires = timezone.now() + timedelta(seconds=settings.PASSWORD_RESET_TIMEOUT)
    try:
        with transaction.atomic():
            Session.objects.create(session_key=spent, session_data="", expire_date=expires)
    except IntegrityError:
        return None  # used already
    return user


def login_failure_limit(request, credentials) -> int:
    """Return how many wrong passwords one username may send from one address before a lockout."""
    return max(1, int(settings.TETHER_LOGIN_FAILURE_LIMIT))


def login_cool_off(request) -> timedelta:
    """Return how long a locked-out username and address wait after their last failed try."""
    return timedelta(seconds=max(1.0, float(settings.TETHER_LOGIN_COOLOFF_SECONDS)))


def lockout_response(request, original_response=None, credentials=None) -> HttpResponse:
    """Render the console's "sign-in paused" page (429) for a locked-out username and address."""
    seconds = login_cool_off(request).total_seconds()
    wait = f"{math.ceil(seconds)} seconds" if seconds < 120 else f"{math.ceil(seconds / 60)} minutes"
    context = {"failure_limit": login_failure_limit(request, credentials), "wait": wait}
    return render(request, "registration/locked_out.html", context, status=429)


def on_locked_out(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    """Record a sign-in lockout (axes' `user_locked_out`) in the audit trail; never the password tried.

    Once per lockout: axes says so again at every refused try, and those are not new lockouts
    (a username and address already recorded within the cool-off are not recorded again).
    """
    name = str(username or "")[:150]
    since = timezone.now() - login_cool_off(request)
    recent = AuditEntry.objects.filter(action="signin.locked_out", created_at__gte=since, ip_address=ip_address)
    if recent.filter(detail__username=name).exists():
        return
    account = get_user_model().objects.filter(username=name).first() if name else None
    path = getattr(request, "path", "") or ""
    trail.record(
        user=None, action="signin.locked_out", owner=account, request=request,
        via="admin" if path.startswith("/admin/") else "console",
        detail={"username": name, "address": ip_address, "failure_limit": login_failure_limit(request, None)},
    )
