"""Digests: a person's daily or weekly summary in their time zone, and the "since you last looked" page."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail

from loops.models import Run
from reviews import digest
from reviews.models import Delivery, DigestPreference, NotificationTarget, ReviewItem

pytestmark = pytest.mark.django_db

# 08:00 in Paris on March 10th: yesterday there ran from 2026-03-08 23:00 to 2026-03-09 23:00 UTC.
NOW = datetime(2026, 3, 10, 7, 0, tzinfo=UTC)
YESTERDAY = datetime(2026, 3, 9, 9, 0, tzinfo=UTC)


def finished(instance, owner, at, outcome="done", verified=True, spent=1_000_000):
    return Run.objects.create(
        instance=instance,
        owner=owner,
        objective="work",
        max_iterations=3,
        status=Run.Status.FINISHED,
        outcome=outcome,
        verified=verified if outcome == "done" else None,
        finished_at=at,
        spent_micros=spent,
    )


@pytest.fixture
def day(user, other_user, make_instance):
    """ada's yesterday: 12 finished runs (7 verified, 3 unverified, 1 escalated, 1 out of budget); bob's too."""
    user.email = "ada@example.com"
    user.save()
    DigestPreference.objects.create(user=user, frequency="daily", time_zone="Europe/Paris")
    fixer, writer = make_instance(user, name="fixer"), make_instance(user, name="writer")
    runs = []
    for n in range(7):
        runs.append(finished(fixer, user, YESTERDAY + timedelta(minutes=n)))
    for n in range(3):
        runs.append(
            finished(writer, user, YESTERDAY + timedelta(hours=1, minutes=n), verified=False, spent=5_000_000)
        )
    runs.append(finished(writer, user, YESTERDAY + timedelta(hours=2), outcome="escalated"))
    runs.append(finished(fixer, user, YESTERDAY + timedelta(hours=3), outcome="budget_exhausted"))
    # The day before: 2 unverified dones. Just after midnight in Paris: today's, not in it.
    for n in range(2):
        finished(writer, user, YESTERDAY - timedelta(days=1, minutes=n), verified=False)
    finished(fixer, user, datetime(2026, 3, 9, 23, 30, tzinfo=UTC))
    # What needs ada now: a run waiting for an answer, one waiting for an approval, a sampled review.
    waiting = dict(instance=fixer, owner=user, max_iterations=3, status=Run.Status.WAITING)
    Run.objects.create(objective="ask", outcome_detail="Which branch should I use?", **waiting)
    Run.objects.create(
        objective="rm",
        outcome_detail="wants to run rm",
        history={"pending_approval": [{"name": "rm"}]},
        **waiting,
    )
    ReviewItem.objects.create(run=runs[0], reason=ReviewItem.Reason.SAMPLED)
    # bob's runs, the same day: never in ada's digest.
    secret = make_instance(other_user, name="bobs-secret-instance")
    for n in range(4):
        finished(secret, other_user, YESTERDAY + timedelta(minutes=n), verified=False, spent=99_000_000)
    return runs


def test_a_daily_digest_lists_what_the_spec_says(day, user):
    hook = NotificationTarget.objects.create(owner=user, kind="webhook", address="https://example.com/hook")
    assert digest.send_due(now=NOW) == 1
    [message] = mail.outbox
    assert message.to == ["ada@example.com"]
    assert message.subject == "[Tether] your daily digest: 12 finished, 3 unverified"
    body = message.body
    assert "2026-03-09 00:00 CET to 2026-03-10 00:00 CET" in body
    assert "Finished: 12 (10 done, 1 budget_exhausted, 1 escalated)" in body
    assert "Dones: 7 verified, 3 unverified" in body
    assert "- escalation: run" in body and "Which branch should I use?" in body
    assert "- approval: run" in body and "wants to run rm" in body
    assert "- review items waiting: 1 (1 sampled)" in body
    assert "- stopped by a bound: run" in body and "budget_exhausted" in body
    assert "Top spenders:\n- writer: $16.00\n- fixer: $8.00" in body
    assert "unverified dones 2 → 3" in body and "finished runs 2 → 12" in body
    assert sum(1 for line in body.splitlines() if line.startswith("- run ")) == 12
    assert f"- run {day[7].pk} · writer: done, NOT verified · $5.00 · files changed unknown" in body
    assert "bobs-secret" not in body and "$99" not in body  # another person's runs never appear

    [delivery] = Delivery.objects.filter(event="digest.sent")
    assert delivery.target == hook and delivery.payload["digest"]["finished"] == 12
    assert delivery.payload["digest"]["by_outcome"] == {"done": 10, "budget_exhausted": 1, "escalated": 1}
    assert delivery.payload["digest"]["unverified_dones"] == 3

    # Once per period: the next tick the same day sends nothing more.
    assert digest.send_due(now=NOW + timedelta(hours=5)) == 0
    assert len(mail.outbox) == 1


def test_an_empty_day_sends_nothing(user):
    user.email = "ada@example.com"
    user.save()
    DigestPreference.objects.create(user=user, frequency="daily", time_zone="Europe/Paris")
    NotificationTarget.objects.create(owner=user, kind="webhook", address="https://example.com/hook")
    assert digest.send_due(now=NOW) == 0
    assert mail.outbox == [] and not Delivery.objects.exists()
    assert DigestPreference.objects.get(user=user).last_period_end == datetime(2026, 3, 9, 23, 0, tzinfo=UTC)


def test_digests_are_off_by_default_and_weekly_covers_monday_to_monday(day, user):
    DigestPreference.objects.filter(user=user).update(frequency="off")
    assert digest.send_due(now=NOW) == 0 and mail.outbox == []
    preference = DigestPreference.objects.get(user=user)
    preference.frequency = "weekly"
    assert digest.period(preference, NOW) == (
        datetime(2026, 3, 2, 0, 0, tzinfo=digest.zone("Europe/Paris")),
        datetime(2026, 3, 9, 0, 0, tzinfo=digest.zone("Europe/Paris")),
    )


def test_the_account_page_sets_the_digest_and_refuses_bad_values(user, client):
    client.force_login(user)
    html = client.get("/account/").content.decode()
    assert 'name="frequency"' in html and 'value="off" selected' in html
    assert (
        client.post("/reviews/digest/settings", {"frequency": "hourly", "time_zone": "UTC"}).status_code
        == 400
    )
    response = client.post("/reviews/digest/settings", {"frequency": "daily", "time_zone": "Mars/Olympus"})
    assert response.status_code == 400 and "not a time zone" in response.content.decode()
    assert not DigestPreference.objects.filter(user=user).exists()
    assert (
        client.post(
            "/reviews/digest/settings", {"frequency": "weekly", "time_zone": "Asia/Tokyo"}
        ).status_code
        == 302
    )
    preference = DigestPreference.objects.get(user=user)
    assert (preference.frequency, preference.time_zone) == ("weekly", "Asia/Tokyo")
    client.logout()
    assert (
        client.post("/reviews/digest/settings", {"frequency": "off", "time_zone": "UTC"}).status_code == 302
    )
    assert (
        DigestPreference.objects.get(user=user).frequency == "weekly"
    )  # signed out: the login page, nothing set


def test_since_you_last_looked_shows_only_ones_own_runs_since_then(day, user, other_user, client):
    DigestPreference.objects.filter(user=user).update(last_looked_at=YESTERDAY - timedelta(minutes=1))
    client.force_login(user)
    html = client.get("/reviews/digest/").content.decode()
    assert "Since you last looked" in html and "bobs-secret" not in html
    assert html.count("<li>run ") >= 13  # the 12 and the one just after midnight
    assert "data-unverified>3<" in html
    again = client.get("/reviews/digest/").content.decode()  # a GET only reads: the same again
    assert again.count("<li>run ") >= 13
    assert client.post("/reviews/digest/seen").status_code == 302  # "Mark as seen"
    again = client.get("/reviews/digest/").content.decode()  # nothing older than that since
    assert "No run finished since you last looked." in again
    client.force_login(other_user)
    html = client.get("/reviews/digest/").content.decode()
    assert "fixer" not in html and "writer" not in html


def test_a_get_of_the_digest_page_leaves_the_last_looked_at_time_unchanged(user, client):
    """A cross-site <img> or a prefetch (a GET) cannot mark a period seen."""
    DigestPreference.objects.create(user=user, last_looked_at=YESTERDAY)
    client.force_login(user)
    assert client.get("/reviews/digest/").status_code == 200
    assert DigestPreference.objects.get(user=user).last_looked_at == YESTERDAY


def test_mark_as_seen_moves_the_time_forward_to_when_the_page_was_shown(day, user, client):
    DigestPreference.objects.filter(user=user).update(last_looked_at=YESTERDAY - timedelta(minutes=1))
    client.force_login(user)
    page = client.get("/reviews/digest/").content.decode()
    assert 'action="/reviews/digest/seen"' in page and "Mark as seen" in page
    shown = YESTERDAY + timedelta(hours=2, minutes=30)  # the page was shown then: later runs stay new
    assert client.post("/reviews/digest/seen", {"until": shown.isoformat()}).status_code == 302
    assert DigestPreference.objects.get(user=user).last_looked_at == shown
    html = client.get("/reviews/digest/").content.decode()
    assert "budget_exhausted" in html and html.count("<li>run ") == 2  # 03:00 and after midnight
    # Never backwards, never into the future.
    client.post("/reviews/digest/seen", {"until": YESTERDAY.isoformat()})
    assert DigestPreference.objects.get(user=user).last_looked_at == shown
    client.post("/reviews/digest/seen", {"until": "2999-01-01T00:00:00+00:00"})
    assert DigestPreference.objects.get(user=user).last_looked_at < datetime(2999, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("until", ["yesterday", "2026-13-01T00:00:00+00:00", "2026-03-09T09:00:00"])
def test_mark_as_seen_refuses_a_bad_time_with_a_400(user, client, until):
    DigestPreference.objects.create(user=user, last_looked_at=YESTERDAY)
    client.force_login(user)
    response = client.post("/reviews/digest/seen", {"until": until})
    assert response.status_code == 400 and b"until must be" in response.content
    assert DigestPreference.objects.get(user=user).last_looked_at == YESTERDAY


def test_mark_as_seen_without_a_csrf_token_is_refused(user):
    from django.test import Client

    DigestPreference.objects.create(user=user, last_looked_at=YESTERDAY)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.post("/reviews/digest/seen").status_code == 403
    assert DigestPreference.objects.get(user=user).last_looked_at == YESTERDAY
    assert client.get("/reviews/digest/seen").status_code == 405  # and never by a GET


def test_mark_as_seen_only_ever_moves_ones_own_time(user, other_user, client):
    DigestPreference.objects.create(user=user, last_looked_at=YESTERDAY)
    client.force_login(other_user)
    # bob cannot name ada's record: the form has no user field, a stray one is ignored.
    assert client.post("/reviews/digest/seen", {"user": user.pk, "user_id": user.pk}).status_code == 302
    assert DigestPreference.objects.get(user=user).last_looked_at == YESTERDAY
    assert DigestPreference.objects.get(user=other_user).last_looked_at is not None
    client.logout()
    assert client.post("/reviews/digest/seen").status_code == 302  # signed out: the login page
    assert DigestPreference.objects.get(user=user).last_looked_at == YESTERDAY
