"""The console's page of the signed-in person: who they are, what they may do, and their audit trail.

Only one's own: there is no page of another person here (staff read everyone's trail in the admin
and in /reviews/audit.csv).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from audit import trail
from instances import capabilities
from web.console.views import _nav


@login_required
@require_http_methods(["GET"])
def account(request: HttpRequest) -> HttpResponse:
    """The person's own page: their capabilities and what they did and what was done to what is theirs."""
    context = {
        "may_run_programs": capabilities.may_run_programs(request.user),
        "entries": trail.for_page(trail.audit_for_person(request.user), request.user),
        "audit_title": "Your audit trail",
        "audit_csv": "/reviews/audit.csv",
        **_nav(request),
    }
    return render(request, "loops/account.html", context)
