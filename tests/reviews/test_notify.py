"""Notifications: signed webhooks retried with backoff (every attempt recorded), and e-mail."""

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail
from django.utils import timezone

from reviews import notify, tasks
from reviews.models import Delivery, DeliveryAttempt, NotificationTarget

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec-test-0123456789"


class Receiver:
    """A local webhook receiver answering with scripted status codes, keeping every request."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.requests = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self):
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/hooks/tether"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def signed_by(secret, headers, body):
    """The receiver's side of the check, written from the documented scheme, not from Tether's code."""
    expected = hmac.new(secret.encode(), headers["x-tether-timestamp"].encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest("sha256=" + expected.hexdigest(), headers["x-tether-signature"])


def webhook(owner, url, events=()):
    target = NotificationTarget(owner=owner, kind="webhook", address=url, events=list(events))
    target.set_secret(SECRET)
    target.save()
    return target


@pytest.fixture
def failed_run(user, make_instance, script, start, drive):
    inst = make_instance(user, command=script("sys.exit(0)\n"), checks=[{"name": "tests", "command": script("sys.exit(1)\n")}])
    run = drive(start(inst, objective="make the tests pass", max_iterations=1))
    assert run.outcome in notify.FAILED_OUTCOMES, run.outcome
    return run


def test_a_webhook_that_fails_twice_is_retried_until_it_succeeds(user, failed_run):
    with Receiver([500, 503, 200]) as receiver:
        webhook(user, receiver.url)
        [delivery] = notify.notify_run(failed_run)
        slept = []

        def sleep(seconds):
            slept.append(seconds)
            time.sleep(seconds)

        delivery = notify.deliver_now(delivery.pk, sleep=sleep)

    assert delivery.status == Delivery.Status.DELIVERED and delivery.attempts == 3
    attempts = list(DeliveryAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(a.number, a.ok, a.status_code) for a in attempts] == [(1, False, 500), (2, False, 503), (3, True, 200)]
    assert "HTTP 500" in attempts[0].error
    # Exponential backoff between attempts: 0.01 s, then 0.02 s under the test settings.
    assert len(slept) == 2 and (notify.backoff(1), notify.backoff(2), notify.backoff(30)) == (0.01, 0.02, 0.05)
    gaps = [(later.at - earlier.at).total_seconds() for earlier, later in zip(attempts, attempts[1:], strict=False)]
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02, gaps
    assert len(receiver.requests) == 3
    bodies = {body for _, body in receiver.requests}
    assert len(bodies) == 1, "every retry sends the same payload"
    for headers, body in receiver.requests:
        assert signed_by(SECRET, headers, body)
        assert not signed_by("another secret", headers, body)
        assert headers["x-tether-event"] == "run.failed"
        assert headers["x-tether-delivery"] == str(delivery.pk)
        assert headers["content-type"] == "application/json"
    payload = json.loads(receiver.requests[0][1])
    assert payload["event"] == "run.failed"
    assert payload["run"]["id"] == failed_run.pk and payload["run"]["outcome"] == failed_run.outcome
    assert payload["run"]["url"].endswith(f"/runs/{failed_run.pk}/")


def test_a_webhook_that_keeps_failing_is_given_up_after_the_last_attempt(user, failed_run, settings):
    settings.TETHER_NOTIFY_ATTEMPTS = 3
    with Receiver([500] * 10) as receiver:
        webhook(user, receiver.url)
        [delivery] = notify.notify_run(failed_run)
        delivery = notify.deliver_now(delivery.pk, sleep=lambda s: None)
    assert delivery.status == Delivery.Status.FAILED and delivery.attempts == 3
    assert len(receiver.requests) == 3
    assert DeliveryAttempt.objects.filter(delivery=delivery).count() == 3
    assert "HTTP 500" in delivery.last_error


def test_an_unreachable_receiver_is_an_attempt_recorded_with_its_error(user, failed_run):
    with Receiver([]) as receiver:
        url = receiver.url
    webhook(user, url)  # the port is closed now
    [delivery] = notify.notify_run(failed_run)
    delivery = notify.attempt(delivery.pk)
    assert delivery.status == Delivery.Status.PENDING and delivery.attempts == 1
    assert delivery.next_attempt_at > timezone.now() - timezone.timedelta(seconds=1)
    assert "could not reach" in DeliveryAttempt.objects.get(delivery=delivery).error


def test_the_queue_task_makes_one_attempt_and_schedules_the_next(user, failed_run):
    from django_q.models import Schedule

    with Receiver([500, 200]) as receiver:
        webhook(user, receiver.url)
        [delivery] = notify.notify_run(failed_run)
        tasks.deliver(delivery.pk)
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == ("pending", 1)
        scheduled = Schedule.objects.get(func="reviews.tasks.deliver")
        assert scheduled.next_run == delivery.next_attempt_at and scheduled.repeats == 1
        tasks.deliver(delivery.pk)  # what the scheduler runs at that time
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("delivered", 2)


def test_a_failed_run_is_e_mailed_and_notified_once(user, failed_run):
    NotificationTarget.objects.create(owner=user, kind="email", address="ada@example.com")
    made = notify.notify_run(failed_run)
    assert notify.notify_run(failed_run) == []  # the hook ran twice: nothing new
    [delivery] = made
    delivery = notify.deliver_now(delivery.pk)
    assert delivery.status == "delivered"
    [message] = mail.outbox
    assert message.to == ["ada@example.com"]
    assert f"run {failed_run.pk}" in message.subject and "failed" in message.subject
    assert failed_run.objective in message.body


def test_targets_choose_their_events_and_other_users_hear_nothing(user, other_user, failed_run):
    NotificationTarget.objects.create(owner=user, kind="email", address="a@example.com", events=["run.escalated"])
    NotificationTarget.objects.create(owner=other_user, kind="email", address="b@example.com")
    NotificationTarget.objects.create(owner=user, kind="email", address="c@example.com", active=False)
    assert notify.notify_run(failed_run) == []


def test_which_runs_are_notified(user, make_instance, start):
    run = start(make_instance(user))
    assert notify.run_event(run) is None  # queued
    run.status = "waiting"
    assert notify.run_event(run) == "run.escalated"
    run.status, run.outcome = "finished", "budget_exhausted"
    assert notify.run_event(run) == "run.budget_exhausted"
    for outcome, event in [("failed", "run.failed"), ("crashed", "run.failed"), ("done", None), ("cancelled", None)]:
        run.outcome = outcome
        assert notify.run_event(run) == event


def test_a_pool_crossing_its_threshold_notifies_its_owner(user):
    from budgets.booking import ThresholdCrossing
    from budgets.models import Pool
    from budgets.services import user_pool
    from budgets.signals import threshold_crossed

    NotificationTarget.objects.create(owner=user, kind="email", address="ada@example.com")
    pool = user_pool(user)

    crossing = ThresholdCrossing(pool.pk, pool.name, 90, 100, 80, None)
    threshold_crossed.send(sender=Pool, crossing=crossing)
    threshold_crossed.send(sender=Pool, crossing=crossing)  # once per period
    [delivery] = Delivery.objects.filter(event="pool.threshold")
    notify.deliver_now(delivery.pk)
    [message] = mail.outbox
    assert "crossed 80%" in message.subject


def test_a_webhook_to_the_servers_own_network_is_refused_by_default(user, failed_run, settings):
    settings.TETHER_WEBHOOK_ALLOW_PRIVATE = False
    with Receiver([200]) as receiver:
        webhook(user, receiver.url)
        [delivery] = notify.notify_run(failed_run)
        delivery = notify.attempt(delivery.pk)
    assert receiver.requests == []
    assert "private address (127.0.0.1)" in DeliveryAttempt.objects.get(delivery=delivery).error
