"""A signed delivery to a trigger's hook starts one run; anything else is a 4xx JSON and starts none."""

import json
import logging
import uuid

import pytest

from audit.models import AuditEntry
from loops.models import Event, Run
from tests.triggers.conftest import ISSUE_OPENED
from triggers.models import Delivery
from triggers.signatures import sign

pytestmark = pytest.mark.django_db


def test_a_signed_github_issue_starts_one_run_with_the_templated_objective(made, deliver):
    trigger, secret = made
    answer = deliver(trigger, secret=secret, delivery="72d3162e-cc78-11e3-81ab-4c9367dc0958")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    run = Run.objects.get()
    assert body["outcome"] == "started" and body["run"]["id"] == run.pk
    assert run.objective == (
        "Triage issue #1347 in octocat/Hello-World: Found a bug\n\nI'm having a problem with this."
    )
    assert run.origin == "trigger"
    assert run.origin_ref == {"trigger": trigger.pk, "delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
    assert run.instance_id == trigger.instance_id and run.owner_id == trigger.owner_id
    delivery = Delivery.objects.get()
    assert (delivery.outcome, delivery.status, delivery.run_id) == ("started", 201, run.pk)
    assert delivery.headers["X-Github-Event"] == "issues"
    assert "Found a bug" in delivery.body_excerpt


def test_the_same_delivery_id_again_starts_nothing_and_names_the_first_run(made, deliver):
    trigger, secret = made
    first = deliver(trigger, secret=secret, delivery="d-1").json()
    again = deliver(trigger, secret=secret, delivery="d-1")
    assert again.status_code == 200
    assert again.json()["outcome"] == "repeated" and again.json()["run"]["id"] == first["run"]["id"]
    assert again.json()["first_delivery"] == first["delivery"]
    assert Run.objects.count() == 1
    assert list(Delivery.objects.order_by("id").values_list("outcome", flat=True)) == ["started", "repeated"]
    deliver(trigger, secret=secret, delivery="d-2")
    assert Run.objects.count() == 2  # another delivery id is another run


def _refused(answer, status, says):
    assert answer.status_code == status, answer.content
    assert answer["Content-Type"].startswith("application/json")
    assert says in answer.json()["error"]
    assert Run.objects.count() == 0


def test_a_bad_signature_is_401_and_starts_nothing(made, deliver):
    trigger, secret = made
    _refused(deliver(trigger, secret="not-the-secret"), 401, "does not match")
    _refused(deliver(trigger, signature="sha256=" + "0" * 64), 401, "does not match")
    _refused(deliver(trigger, signature="sha1=abc"), 401, "sha256=<64 hexadecimal digits>")
    body = json.dumps(ISSUE_OPENED).encode()
    # A signature of another body (a payload changed on the way) does not pass either.
    _refused(deliver(trigger, raw=body + b" ", signature=sign(secret, body)), 401, "does not match")


def test_no_signature_is_401_and_starts_nothing(made, deliver):
    trigger, _ = made
    _refused(deliver(trigger), 401, "not signed")
    assert Delivery.objects.get().outcome == "refused"


def test_the_generic_signature_and_delivery_headers_work_too(made, client):
    trigger, secret = made
    body = json.dumps(ISSUE_OPENED).encode()
    headers = {
        "X-Tether-Signature-256": sign(secret, body),
        "X-Tether-Delivery": "job-7",
        "X-Tether-Event": "issues",
    }
    answer = client.generic(
        "POST", f"/v1/hooks/{trigger.pk}", body, content_type="application/json", headers=headers
    )
    assert answer.status_code == 201, answer.content
    assert Run.objects.get().origin_ref["delivery"] == "job-7"


def test_a_2_mb_body_is_413_and_starts_nothing(made, deliver):
    trigger, secret = made
    big = json.dumps({**ISSUE_OPENED, "padding": "x" * 2_000_000}).encode()
    _refused(deliver(trigger, raw=big, secret=secret), 413, "at most 1,000,000")


def test_a_body_that_is_not_json_is_refused_and_starts_nothing(made, deliver):
    trigger, secret = made
    _refused(
        deliver(
            trigger, raw=b"payload=%7B%7D", secret=secret, content_type="application/x-www-form-urlencoded"
        ),
        415,
        "must be JSON",
    )
    _refused(deliver(trigger, raw=b"{not json", secret=secret), 400, "not valid JSON")
    _refused(deliver(trigger, raw=b'{"a": NaN}', secret=secret), 400, "not valid JSON")
    _refused(deliver(trigger, raw=b"[" * 100 + b"]" * 100, secret=secret), 400, "nested deeper")


def test_a_template_path_not_in_the_payload_is_400_and_starts_nothing(made, deliver):
    trigger, secret = made
    pull = {
        "action": "opened",
        "pull_request": {"number": 3, "title": "t"},
        "repository": {"full_name": "o/r"},
    }
    _refused(deliver(trigger, pull, secret=secret), 400, "the payload has no key 'issue'")


def test_an_objective_over_the_instance_cap_is_refused(made, deliver):
    trigger, secret = made
    long = {**ISSUE_OPENED, "issue": {**ISSUE_OPENED["issue"], "body": "y" * 5000}}
    _refused(deliver(trigger, long, secret=secret), 400, "longer than 2,000 characters")


def test_a_nul_in_the_payload_cannot_reach_the_objective(made, deliver):
    trigger, secret = made
    nul = {**ISSUE_OPENED, "issue": {**ISSUE_OPENED["issue"], "title": "a\u0000b"}}
    _refused(deliver(trigger, nul, secret=secret), 400, "NUL")


def test_a_delivery_without_an_id_is_refused(made, deliver):
    trigger, secret = made
    _refused(deliver(trigger, secret=secret, delivery=""), 400, "no id")
    _refused(deliver(trigger, secret=secret, delivery="a b"), 400, "delivery id must be")


def test_an_unknown_trigger_is_404_json_and_another_method_405(client):
    answer = client.post("/v1/hooks/999", data=b"{}", content_type="application/json")
    assert answer.status_code == 404 and answer.json()["error"] == "no trigger 999"
    assert (
        client.post("/v1/hooks/" + "9" * 30, data=b"{}", content_type="application/json").status_code == 404
    )
    got = client.get("/v1/hooks/1")
    assert got.status_code == 405 and got["Allow"] == "POST"


def test_the_payload_sets_the_objective_and_nothing_else(made, deliver, instance):
    trigger, secret = made
    sneaky = {
        **ISSUE_OPENED,
        "instance": 999,
        "max_cost_usd": "1000000",
        "max_iterations": 10000,
        "tools": ["run_command"],
        "workspace": "/",
        "command": ["sh", "-c", "cat /etc/shadow"],
    }
    assert deliver(trigger, sneaky, secret=secret).status_code == 201
    run = Run.objects.get()
    assert run.instance_id == instance.pk
    assert run.max_iterations == instance.max_iterations and run.max_cost_micros is None
    instance.refresh_from_db()
    assert instance.command == ["true"] and "run_command" not in (instance.tools or [])


def test_events_and_actions_choose_which_deliveries_start_a_run(user, instance, deliver):
    from triggers import services

    trigger, secret = services.trigger_create(
        user=user,
        instance=instance,
        name="opened",
        objective_template="#{issue.number}",
        events=["issues"],
        actions=["opened"],
    )
    assert deliver(trigger, secret=secret, event="push").status_code == 202
    assert deliver(trigger, {**ISSUE_OPENED, "action": "edited"}, secret=secret).status_code == 202
    assert deliver(trigger, secret=secret, event="ping").json()["pong"] is True
    assert Run.objects.count() == 0
    assert deliver(trigger, secret=secret).status_code == 201


def test_a_paused_trigger_refuses_and_the_rate_limit_holds(user, instance, deliver):
    from triggers import services

    trigger, secret = services.trigger_create(
        user=user, instance=instance, name="rated", objective_template="#{issue.number}", max_per_minute=2
    )
    assert deliver(trigger, secret=secret).status_code == 201
    assert deliver(trigger, secret=secret).status_code == 201
    _limited = deliver(trigger, secret=secret)
    assert _limited.status_code == 429 and "limit" in _limited.json()["error"]
    assert Run.objects.count() == 2
    services.trigger_change(user=user, trigger=trigger, changes={"active": False})
    paused = deliver(trigger, secret=secret)
    assert paused.status_code == 409 and "paused" in paused.json()["error"]


def test_a_rotated_secret_replaces_the_old_one_at_once(user, made, deliver):
    from triggers import services

    trigger, old = made
    new = services.trigger_rotate(user=user, trigger=trigger)
    assert new != old
    assert deliver(trigger, secret=old).status_code == 401
    assert deliver(trigger, secret=new).status_code == 201


def test_the_secret_never_appears_in_runs_events_deliveries_audit_pages_or_logs(
    client, user, made, deliver, caplog
):
    trigger, secret = made
    caplog.set_level(logging.DEBUG)
    body = {**ISSUE_OPENED, "issue": {**ISSUE_OPENED["issue"], "body": f"leaked {secret} here"}}
    assert deliver(trigger, body, secret=secret, delivery="ok-1").status_code == 201
    deliver(trigger, secret="wrong", delivery="bad-1")
    deliver(trigger, signature=secret, delivery="bad-2")  # the secret itself sent as the signature
    run = Run.objects.get()
    assert secret not in run.objective and "[redacted]" in run.objective
    kept = json.dumps(list(Delivery.objects.values()), default=str)
    assert secret not in kept
    assert "[secret]" in kept
    assert secret not in json.dumps(list(Event.objects.values_list("data", flat=True)))
    assert secret not in json.dumps(list(AuditEntry.objects.values("detail")), default=str)
    client.force_login(user)
    for path in (f"/runs/{run.pk}/", f"/instances/{trigger.instance_id}/triggers/", "/history/"):
        assert secret not in client.get(path).content.decode(), path
    assert secret not in caplog.text
    assert secret not in trigger.secret_encrypted


def test_two_deliveries_of_the_same_id_racing_start_one_run(made, deliver):
    trigger, secret = made
    # The unique key on (trigger, delivery id) of a started delivery holds whatever the checks above it saw.
    from django.db import IntegrityError, transaction

    deliver(trigger, secret=secret, delivery="race")
    with pytest.raises(IntegrityError), transaction.atomic():
        Delivery.objects.create(
            trigger=trigger,
            delivery_id="race",
            outcome="started",
            status=201,
            received_at=Delivery.objects.get().received_at,
        )
    assert Run.objects.count() == 1


def test_an_unsigned_flood_is_kept_to_the_latest_deliveries(made, deliver, settings, monkeypatch):
    from triggers import services

    trigger, _ = made
    monkeypatch.setattr(services, "DELIVERIES_KEPT", 3)
    for _ in range(5):
        deliver(trigger, delivery=str(uuid.uuid4()))
    assert Delivery.objects.filter(trigger=trigger).count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_same_delivery_sent_twice_at_once_starts_one_run(made):
    """Two requests with one delivery id, side by side: the checks and the unique key leave one run."""
    import threading

    from django.db import connection

    from triggers import services

    trigger, secret = made
    body = json.dumps(ISSUE_OPENED).encode()
    headers = {
        "X-Hub-Signature-256": sign(secret, body),
        "X-GitHub-Delivery": "twice",
        "X-GitHub-Event": "issues",
    }
    gate = threading.Barrier(2)
    answers = []

    def send():
        try:
            gate.wait(timeout=30)
            answers.append(
                services.receive(
                    trigger_id=trigger.pk,
                    headers=headers,
                    body=body,
                    body_bytes=len(body),
                    content_type="application/json",
                )
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(a.status for a in answers) == [200, 201]
    assert Run.objects.count() == 1
    assert {a.body["run"]["id"] for a in answers} == {Run.objects.get().pk}
