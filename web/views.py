"""Console views that the loop owns: the one-time sign-in link."""

from django.contrib.auth import login
from django.shortcuts import redirect, render

from web.accounts import use_login_link


def login_once(request, uidb64: str, token: str):
    """Sign in with a one-time link; a used, stale or forged link is refused (other links stay good)."""
    user = use_login_link(uidb64, token)
    if user is None:
        # The console's own page, not a bare 400: what happened and how to get in instead.
        return render(request, "registration/link_used.html", status=400)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect("/")
