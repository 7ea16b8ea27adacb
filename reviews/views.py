"""The review queue pages and the audit CSV export (the receipt API is `reviews.api`).

Reads come from reviews.selectors; a verdict goes through reviews.services. Pages need a signed-in
user and show only their own runs' items (staff see all); forms post with CSRF and work without
JavaScript (post, then redirect); with htmx the verdict form swaps just its own block.
"""

from __future__ import annotations

from datetime import date, datetime, time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_POST

from audit import trail
from loops.services import Refused
from reviews import digest, selectors, services, watch
from reviews.models import NotificationTarget, ReviewItem

QUEUE_LIMIT = 200
AUDIT_CSV_LIMIT = 100_000


@login_required
@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    decided = request.GET.get("show") == "decided"
    items = list(selectors.queue(request.user, pending=not decided)[:QUEUE_LIMIT])
    mine = selectors.items_for(request.user)
    context = {
        "items": items,
        "decided": decided,
        "stats": selectors.fleet_stats(request.user),
        "backlog": watch.backlog(mine),
        "my_signals": watch.signals(request.user),
        # The operator's view: every reviewer's signals (staff see every item).
        "reviewers": watch.reviewers_signals(mine) if request.user.is_staff else [],
    }
    return render(request, "reviews/queue.html", context)


def _item_or_404(request: HttpRequest, item_id: int) -> ReviewItem:
    """Return the review item the signed-in user may see; 404 for any other."""
    item = selectors.item_for(request.user, item_id)
    if item is None:
        raise Http404("no such review item")
    return item


@login_required
@require_GET
def item_detail(request: HttpRequest, item_id: int) -> HttpResponse:
    item = _item_or_404(request, item_id)
    view = selectors.item_view(item)
    watch.record_opened(item, request.user)  # the page shows the diff and the change card first
    return render(request, "reviews/item.html", {"view": view})


@login_required
@require_POST
def item_reopen(request: HttpRequest, item_id: int) -> HttpResponse:
    """Reopen an accepted item found wrong after all: it counts as missed in review."""
    item = _item_or_404(request, item_id)
    try:
        services.review_reopen(item=item, user=request.user, note=request.POST.get("note", ""), request=request)
    except Refused as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Run {item.run_id}: reopened; the accepted review counts as missed.")
    return redirect("reviews:item", item_id=item.pk)


@login_required
@require_POST
def item_decide(request: HttpRequest, item_id: int) -> HttpResponse:
    item = _item_or_404(request, item_id)
    verdict = request.POST.get("verdict", "")
    note = request.POST.get("note", "")
    try:
        item = services.review_decide(item=item, user=request.user, verdict=verdict, note=note, request=request)
    except Refused as exc:
        if request.htmx:
            view = selectors.item_view(item)
            return render(
                request, "reviews/item.html#verdict", {"view": view, "error": exc.message, "note": note}, status=exc.status
            )
        messages.error(request, exc.message)
        return redirect("reviews:item", item_id=item.pk)
    if request.htmx:
        return render(request, "reviews/item.html#verdict", {"view": selectors.item_view(item)})
    messages.success(request, f"Run {item.run_id}: {item.get_status_display()}.")
    following = selectors.queue(request.user).exclude(pk=item.pk).first()
    if following is not None:
        return redirect("reviews:item", item_id=following.pk)
    return redirect("reviews:queue")


def _day(value: str, end: bool = False) -> datetime | None:
    try:
        day = date.fromisoformat(value)
    except ValueError:
        return None
    return datetime.combine(day, time.max if end else time.min, tzinfo=timezone.get_current_timezone())


@login_required
def notifications(request: HttpRequest) -> HttpResponse:
    """List the user's notification targets; add one (POST)."""
    secret, error, status = "", "", 200
    if request.method == "POST":
        try:
            target, secret = services.notification_target_add(
                user=request.user,
                kind=request.POST.get("kind", ""),
                address=request.POST.get("address", ""),
                events=request.POST.getlist("events"),
                request=request,
            )
        except Refused as exc:  # the form again, as typed, the refusal at its top and the field outlined
            error, status = exc.message, 400
        else:
            if not secret:
                messages.success(request, f"Notifications will be sent to {target.address}.")
                return redirect("reviews:notifications")
    context = {
        "targets": NotificationTarget.objects.filter(owner=request.user).order_by("id"),
        "events": NotificationTarget.Event.choices,
        "secret": secret,
        "error": error,
        "posted": {
            "kind": request.POST.get("kind", ""), "address": request.POST.get("address", "")[:500],
            "events": request.POST.getlist("events"),
        } if error else None,
    }
    return render(request, "reviews/notifications.html", context, status=status)


@login_required
@require_POST
def notification_remove(request: HttpRequest, target_id: int) -> HttpResponse:
    target = NotificationTarget.objects.filter(owner=request.user, pk=target_id).first()
    if target is None:
        raise Http404("no such notification target")
    services.notification_target_remove(user=request.user, target=target, request=request)
    messages.success(request, f"No more notifications to {target.address}.")
    return redirect("reviews:notifications")


@login_required
@require_GET
def audit_csv(request: HttpRequest) -> HttpResponse:
    """Export the audit trail the user may read as CSV; filter by ?run=ID, ?pool=ID, ?since= and ?until=."""
    entries = trail.visible_to(request.user)
    for name, field in (("run", "run_ref"), ("pool", "pool_ref")):
        if value := request.GET.get(name):
            if not value.isdigit():
                return HttpResponse(f"{name} must be a number", status=400, content_type="text/plain")
            entries = entries.filter(**{field: int(value)})
    if since := _day(request.GET.get("since", "")):
        entries = entries.filter(created_at__gte=since)
    if until := _day(request.GET.get("until", ""), end=True):
        entries = entries.filter(created_at__lte=until)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="tether-audit-{stamp}.csv"'
    trail.write_csv(entries[:AUDIT_CSV_LIMIT].iterator(), response)
    return response


@login_required
@require_GET
def since_last_looked(request: HttpRequest) -> HttpResponse:
    """The digest of what happened to the person's own runs since they last marked it seen (a GET only reads)."""
    return render(request, "reviews/digest.html", {"digest": digest.since_last_looked(request.user)})


@login_required
@require_POST
def digest_mark_seen(request: HttpRequest) -> HttpResponse:
    """Mark the digest seen up to the time the page was shown (`until`), for the signed-in person only."""
    try:
        until = parse_datetime(request.POST["until"]) if request.POST.get("until") else timezone.now()
    except ValueError:  # well formed but no such time (a 13th month)
        until = None
    if until is None or timezone.is_naive(until):
        return HttpResponse(
            "until must be an ISO 8601 time with its offset", status=400, content_type="text/plain"
        )
    digest.mark_seen(request.user, until)
    messages.success(request, "Marked as seen.")
    return redirect("reviews:digest")


@login_required
@require_POST
def digest_settings(request: HttpRequest) -> HttpResponse:
    """Set the person's digest (off, daily or weekly) and time zone, from their account page."""
    try:
        preference = services.digest_preference_set(
            user=request.user,
            frequency=request.POST.get("frequency", ""),
            time_zone=request.POST.get("time_zone", ""),
        )
    except Refused as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain; charset=utf-8")
    if preference.frequency == "off":
        messages.success(request, "No digest will be sent.")
    else:
        messages.success(request, f"Your {preference.frequency} digest is on ({preference.time_zone}).")
    return redirect("loops:account")
