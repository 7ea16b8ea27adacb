"""The console's receipt page: a finished run's signed receipt as a person reads it, and its download.

Reads only. The envelope comes from reviews.receipts (issued on first read once the run has
finished); the page checks its signature with the same verification the CLI uses.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from loops import event_kinds, selectors
from reviews import receipts
from reviews import selectors as review_selectors
from web.console.display import RunView, usd_text


def _finished_run(request: HttpRequest, run_id: int) -> tuple[Any, dict[str, Any]]:
    run = selectors.run_for(request.user, run_id)
    if run is None:
        raise Http404("no such run")
    envelope = receipts.for_run(run)
    if envelope is None:
        raise Http404("this run has not finished; its receipt is written when it does")
    return run, envelope


@login_required
@require_GET
def receipt_page(request: HttpRequest, run_id: int) -> HttpResponse:
    """The receipt as a page: what the run did and cost, and whether the signature holds."""
    run, envelope = _finished_run(request, run_id)
    document = envelope.get("receipt") or {}
    iterations = [
        {
            **it,
            "cost": usd_text(it.get("cost_usd")),
            "checks_passed": sum(1 for c in it.get("checks") or [] if c.get("passed")),
            "checks_total": len(it.get("checks") or []),
        }
        for it in document.get("iterations") or []
    ]
    context = {
        "run": RunView(run),
        "document": document,
        "signature": envelope.get("signature") or {},
        "check": receipts.verify(envelope),
        "iterations": iterations,
        "lost_attempts": [
            event_kinds.describe("attempt.lost", lost).text
            for lost in document.get("lost_attempts") or []
            if isinstance(lost, dict)
        ],
        "spent": usd_text((document.get("cost") or {}).get("spent_usd")),
        "by_model": [
            {**row, "cost": usd_text(row.get("cost_usd"))}
            for row in (document.get("cost") or {}).get("by_model") or []
            if isinstance(row, dict)
        ],
        "pending_reviews": review_selectors.pending_count(request.user),
    }
    return render(request, "loops/run_receipt.html", context)


@login_required
@require_GET
def receipt_download(request: HttpRequest, run_id: int) -> HttpResponse:
    """The signed envelope as a JSON file (`manage.py loop verify FILE` checks it)."""
    run, envelope = _finished_run(request, run_id)
    body = json.dumps(envelope, ensure_ascii=False, indent=2, sort_keys=True)
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="tether-run-{run.pk}-receipt.json"'
    return response
