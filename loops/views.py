"""Console views that the loop owns: the one-time sign-in link."""

from django.contrib.auth import get_user_model, login
from django.contrib.auth.tokens import default_token_generator
from django.shortcuts import redirect, render
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode


def login_once(request, uidb64: str, token: str):
    """Sign in with a one-time link; a used or stale link is refused."""
    User = get_user_model()
    try:
        user = User.objects.get(pk=force_str(urlsafe_base64_decode(uidb64)), is_active=True)
    except (User.DoesNotExist, ValueError, TypeError, OverflowError):
        user = None
    if user is None or not default_token_generator.check_token(user, token):
        # The console's own page, not a bare 400: what happened and how to get in instead.
        return render(request, "registration/link_used.html", status=400)
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect("/")
