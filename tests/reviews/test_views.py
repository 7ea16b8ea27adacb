"""The review queue page: diff first, verdicts with CSRF, per-template trust figures; works on a phone."""

import re
from decimal import Decimal

import pytest
from django.test import Client

from audit.models import AuditEntry
from reviews import selectors, services, snapshots
from reviews.models import GradeRecord, Grading, ReviewItem

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = "Mozilla/5.0 (iPhone; CPU iPhone OS 18_0 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148"


@pytest.fixture
def reviewed(user, make_instance, script, start, drive):
    """A done, verified run sampled into the queue (100 % sample), with a judge's reasons on record."""
    agent = script("pathlib.Path('answer.txt').write_text('42')\nprint('wrote 42')\n")
    check = script("print('1 passed'); sys.exit(0 if pathlib.Path('answer.txt').read_text() == '42' else 1)\n")
    inst = make_instance(user, command=agent, checks=[{"name": "answer", "command": check, "required": True}])
    Grading.objects.create(instance=inst, sample_percent=Decimal(100))
    run = start(inst, objective="write 42 to answer.txt")
    snapshots.take(run)
    run = drive(run)
    GradeRecord.objects.update_or_create(  # as the judge would have graded it
        run=run, iteration=1, defaults={"verified": True, "outcome": "done", "judge": {"verdict": "pass", "reasons": ["answer.txt holds 42"]}}
    )
    services.on_run_finished(run)
    return ReviewItem.objects.get(run=run)


def test_the_queue_lists_pending_items_and_trust_figures(reviewed, client, user):
    client.force_login(user)
    page = client.get("/reviews/", HTTP_USER_AGENT=PHONE)
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="review-{reviewed.pk}"' in html and 'data-reason="sampled"' in html
    assert 'name="viewport"' in html  # the console's base layout, phone-ready
    assert "Trust per template" in html and "(no template)" in html


def test_the_item_opens_diff_first_with_checks_reasons_and_cost(reviewed, client, user):
    client.force_login(user)
    html = client.get(f"/reviews/{reviewed.pk}/").content.decode()
    diff, checks, reasons = html.index("data-diff"), html.index("Checks after the final act"), html.index("Why it ended")
    assert diff < html.index("Your verdict") < checks < reasons
    assert '<span class="add">+42</span>' in html
    assert "answer.txt" in html and "1 passed" in html
    assert "all required checks passed" in html  # the decider's reason
    assert "answer.txt holds 42" in html  # the judge's
    assert 'data-cost>$' in html
    assert 'name="csrfmiddlewaretoken"' in html


def test_a_verdict_needs_the_csrf_token(reviewed, user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(f"/reviews/{reviewed.pk}/decide", {"verdict": "accept"})
    assert response.status_code == 403
    reviewed.refresh_from_db()
    assert reviewed.status == "pending"

    page = client.get(f"/reviews/{reviewed.pk}/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(
        f"/reviews/{reviewed.pk}/decide",
        {"verdict": "accept", "note": "checked the diff", "csrfmiddlewaretoken": token},
        HTTP_USER_AGENT=PHONE,
    )
    assert response.status_code == 302 and response["Location"] == "/reviews/"
    reviewed.refresh_from_db()
    assert (reviewed.status, reviewed.note) == ("accepted", "checked the diff")
    entry = AuditEntry.objects.get(action="review.accept")
    assert entry.via == "console" and "iPhone" in entry.user_agent


def test_htmx_swaps_the_verdict_block_and_shows_refusals_in_place(reviewed, client, user):
    client.force_login(user)
    refused = client.post(f"/reviews/{reviewed.pk}/decide", {"verdict": "reject", "note": ""}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 400
    html = refused.content.decode()
    assert html.lstrip().startswith(f'<section id="review-{reviewed.pk}-verdict"') and "say why" in html
    done = client.post(f"/reviews/{reviewed.pk}/decide", {"verdict": "reject", "note": "hard-coded"}, HTTP_HX_REQUEST="true")
    assert done.status_code == 200 and 'data-verdict="rejected"' in done.content.decode()


def test_another_users_item_is_not_found(reviewed, client, other_user):
    client.force_login(other_user)
    assert client.get(f"/reviews/{reviewed.pk}/").status_code == 404
    assert client.post(f"/reviews/{reviewed.pk}/decide", {"verdict": "accept"}).status_code == 404
    assert f'id="review-{reviewed.pk}"' not in client.get("/reviews/").content.decode()


def test_signed_out_people_are_sent_to_sign_in(reviewed, client):
    assert client.get("/reviews/").status_code == 302


def test_trust_figures_per_template(user, make_instance, start):
    from django.utils import timezone

    from instances.models import AgentTemplate
    from loops.models import Run

    coder = AgentTemplate.objects.get(name="coder")
    inst = make_instance(user, template=coder)
    finished = []
    for outcome, verified, spent in [("done", True, 1_000_000), ("done", True, 2_000_000), ("done", False, 500_000), ("failed", None, 500_000)]:
        run = start(inst)
        Run.objects.filter(pk=run.pk).update(
            status="finished", outcome=outcome, verified=verified, spent_micros=spent, finished_at=timezone.now()
        )
        finished.append(run)
    ReviewItem.objects.create(run=finished[1], reason="sampled", status="rejected")
    ReviewItem.objects.create(run=finished[2], reason="unverified", status="accepted")
    ReviewItem.objects.create(run=finished[3], reason="failed")
    [row] = selectors.fleet_stats(user)
    assert (row.template, row.finished, row.done, row.verified) == ("coder", 4, 3, 2)
    assert (row.accepted, row.rejected, row.pending) == (1, 1, 1)
    assert row.verified_rate == 0.5 and row.acceptance_rate == 0.5
    # accepted results: run 0 (verified, never rejected) and run 2 (accepted in review)
    assert row.accepted_results == 2 and row.cost_per_accepted_micros == 2_000_000
    assert row.cost_per_accepted_text == "$2.00" and row.verified_text == "50% (2 of 4)"


def test_the_pending_count_for_a_badge(reviewed, user, other_user):
    assert selectors.pending_count(user) == 1
    assert selectors.pending_count(other_user) == 0


def test_a_user_configures_where_notifications_go(client, user, other_user):
    from reviews.models import NotificationTarget

    client.force_login(user)
    assert "nobody is told anything" in client.get("/reviews/notifications/").content.decode()
    response = client.post("/reviews/notifications/", {"kind": "email", "address": "ada@example.com", "events": ["run.failed"]})
    assert response.status_code == 302
    page = client.post("/reviews/notifications/", {"kind": "webhook", "address": "https://hooks.example.com/tether"})
    html = page.content.decode()
    webhook = NotificationTarget.objects.get(kind="webhook")
    assert "data-secret" in html and webhook.reveal_secret() in html  # shown once, at creation
    assert webhook.reveal_secret() not in client.get("/reviews/notifications/").content.decode()
    assert [(t.kind, t.events) for t in NotificationTarget.objects.order_by("id")] == [("email", ["run.failed"]), ("webhook", [])]
    assert list(AuditEntry.objects.order_by("id").values_list("action", flat=True)) == ["notification.add"] * 2

    client.post("/reviews/notifications/", {"kind": "webhook", "address": "ftp://nope"})
    client.post("/reviews/notifications/", {"kind": "email", "address": "x", "events": ["run.bogus"]})
    assert NotificationTarget.objects.count() == 2

    client.force_login(other_user)
    assert client.post(f"/reviews/notifications/{webhook.pk}/remove").status_code == 404
    client.force_login(user)
    assert client.post(f"/reviews/notifications/{webhook.pk}/remove").status_code == 302
    assert not NotificationTarget.objects.filter(pk=webhook.pk).exists()
    assert AuditEntry.objects.filter(action="notification.remove").count() == 1


def test_notification_events_are_named_for_a_person(client, user):
    """The form's boxes and the list of targets say "A run needs you", not "run.escalated"."""
    from reviews.models import NotificationTarget

    client.force_login(user)
    client.post("/reviews/notifications/", {"kind": "email", "address": "ada@example.com",
                                            "events": ["run.escalated", "pool.threshold"]})
    html = client.get("/reviews/notifications/").content.decode()
    for label in NotificationTarget.Event.labels:
        assert f"> {label}</label>" in html  # each box
    assert "A run needs you, A pool crossed its soft threshold" in html  # the target's events
    shown = re.sub(r'value="[^"]*"', "", html)  # the keys stay only as the form's values
    assert not any(key in shown for key in NotificationTarget.Event.values)


@pytest.mark.parametrize(
    ("outcome", "detail", "expected"),
    [
        ("no_progress", "no progress: workspace and check results unchanged for 3 iterations",
         "No progress: workspace and check results unchanged for 3 iterations"),
        ("max_iterations", "reached the iteration limit (3 of 3)", "Reached the iteration limit (3 of 3)"),
        ("failed", "the agent gave up", "Failed: the agent gave up"),
    ],
)
def test_the_queue_says_why_a_run_failed_as_a_person_would(client, user, make_instance, start, outcome, detail,
                                                           expected):
    """The outcome's label once, then the detail: not "no_progress: no progress: …"."""
    from django.utils import timezone

    from loops.models import Run

    run = start(make_instance(user))
    Run.objects.filter(pk=run.pk).update(status="finished", outcome=outcome, outcome_detail=detail,
                                         finished_at=timezone.now())
    services.on_run_finished(run)
    client.force_login(user)
    html = client.get("/reviews/").content.decode()
    assert f"<span class=\"why\">{expected}</span>" in html
    assert outcome + ":" not in html and "no progress: no progress" not in html.lower()
    assert expected in client.get(f"/reviews/{ReviewItem.objects.get(run=run).pk}/").content.decode()
