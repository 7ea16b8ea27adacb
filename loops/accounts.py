"""One-time sign-in links (no fixed password anywhere)."""

from django.contrib.auth.tokens import default_token_generator
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode


def login_link(user, base_url: str) -> str:
    """Return a link that signs `user` in once; signing in invalidates it (last_login changes)."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    return base_url.rstrip("/") + reverse("login-once", args=[uid, token])
