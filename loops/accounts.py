"""Signing in: one-time sign-in links (no fixed password anywhere) and the throttle's policy.

Password sign-in is throttled by django-axes (settings: AXES_*). Its failure limit,
cool-off and lockout page come from here, read from TETHER_LOGIN_FAILURE_LIMIT and
TETHER_LOGIN_COOLOFF_SECONDS at each attempt, so an operator changes one setting.
"""

import math
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.tokens import default_token_generator
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode


def login_link(user, base_url: str) -> str:
    """Return a link that signs `user` in once; signing in invalidates it (last_login changes)."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    return base_url.rstrip("/") + reverse("login-once", args=[uid, token])


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
