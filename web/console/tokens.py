"""The console's API tokens page: list, create (the secret is shown once, in that response), revoke.

Another user's token is a 404, like every other object in the console.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from web import auth
from web.console.forms import TokenForm
from web.console.views import _nav

# The session key that carries a new token from the POST that made it to the one page that shows it.
NEW_TOKEN = "tether_new_token"


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    """List the tokens; a valid POST makes one and redirects (303) to the page that shows it once.

    The secret rides in the session (server-side) for that one GET and is taken out as it is shown,
    so a reload shows nothing and mints nothing.
    """
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        request.session[NEW_TOKEN] = auth.make_token(
            request.user, name=form.cleaned_data["name"], days=form.cleaned_data["days"], via="console",
            request=request,
        )
        return _see_other("loops:tokens")
    created = request.session.pop(NEW_TOKEN, None) if request.method == "GET" else None
    context = {
        "form": form,
        "tokens": list(auth.tokens_of(request.user)),
        "created": created,
        "now": timezone.now(),
        **_nav(request),
    }
    response = render(request, "loops/apitoken_list.html", context, status=400 if form.is_bound else 200)
    response["Cache-Control"] = "no-store"  # the one response that holds a secret must not be kept
    return response


def _see_other(name: str) -> HttpResponse:
    response = redirect(name)
    response.status_code = 303
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    revoked = auth.revoke_token(token_id=token_id, user=request.user, via="console", request=request)
    if revoked is None:
        raise Http404("no such token")
    messages.success(request, f"Revoked the token “{revoked.name or revoked.prefix}”: it is refused from now on.")
    return redirect("loops:tokens")
