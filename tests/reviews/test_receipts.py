"""Receipts: signed summaries of finished runs; any altered field fails verification, by name."""

import copy
import json

import pytest
from django.test import override_settings

from reviews import receipts
from reviews.models import Receipt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished(user, make_instance, script, start, drive):
    """A run that needed two iterations (a failing check fed back, then fixed) and ended done, verified."""
    agent = script(
        """
        instruction = sys.stdin.read()
        pathlib.Path('answer.txt').write_text('42' if 'failed' in instruction else '41')
        print('wrote the answer')
        """
    )
    check = script("sys.exit(0 if pathlib.Path('answer.txt').read_text() == '42' else 1)\n")
    inst = make_instance(user, command=agent, checks=[{"name": "answer", "command": check, "required": True}])
    run = drive(start(inst, objective="write 42 to answer.txt"))
    assert (run.outcome, run.verified, run.iterations_done) == ("done", True, 2)
    return run


def tamper(envelope, path, value="tampered"):
    """Return a copy of `envelope` with the field at `path` (as the digest map names it) set to `value`."""
    altered = copy.deepcopy(envelope)
    target = altered["receipt"]
    parts = path.replace("[", ".[").split(".")
    for part in parts[:-1]:
        target = target[int(part[1:-1])] if part.startswith("[") else target[part]
    last = parts[-1]
    if last.startswith("["):
        target[int(last[1:-1])] = value
    else:
        target[last] = value if target[last] != value else "other"
    return altered


def test_a_receipt_holds_the_run_and_verifies(finished):
    envelope = receipts.issue(finished).envelope
    document = envelope["receipt"]
    assert document["run"] == finished.pk
    assert document["objective"] == "write 42 to answer.txt"
    assert document["instance"]["name"] == finished.instance.name
    assert (document["outcome"], document["verified"]) == ("done", True)
    assert [it["number"] for it in document["iterations"]] == [1, 2]
    first = finished.iterations.get(number=1)
    import hashlib

    assert document["iterations"][0]["instruction_sha256"] == hashlib.sha256(first.instruction.encode()).hexdigest()
    assert document["iterations"][0]["checks"][0]["passed"] is False
    assert document["iterations"][1]["decision"]["verdict"] == "done"
    assert document["cost"]["spent_micros"] == finished.spent_micros
    assert document["started_at"] and document["finished_at"]
    result = receipts.verify(envelope)
    assert result.ok, result.message
    assert "authentic" in result.message


def test_every_field_changed_fails_verification_naming_it(finished):
    envelope = receipts.issue(finished).envelope
    paths = sorted(envelope["signature"]["fields"])
    assert {"objective", "outcome", "verified", "iterations[1].decision", "instance.name", "cost.spent_micros"} <= set(paths)
    for path in paths:
        result = receipts.verify(tamper(envelope, path))
        assert not result.ok, path
        assert result.altered == (path,), (path, result.altered)
        assert path in result.message


def test_an_added_or_removed_field_is_named(finished):
    envelope = receipts.issue(finished).envelope
    added = copy.deepcopy(envelope)
    added["receipt"]["approved_by"] = "nobody"
    result = receipts.verify(added)
    assert not result.ok and "added: approved_by" in result.message

    removed = copy.deepcopy(envelope)
    del removed["receipt"]["verified"]
    result = receipts.verify(removed)
    assert not result.ok and "removed: verified" in result.message

    dropped = copy.deepcopy(envelope)
    dropped["receipt"]["iterations"].pop(0)
    result = receipts.verify(dropped)
    assert not result.ok and "iterations[1]" in result.message


def test_rewriting_a_field_and_its_digest_breaks_the_signature(finished):
    envelope = receipts.issue(finished).envelope
    forged = tamper(envelope, "outcome", "failed")
    forged["signature"]["fields"]["outcome"] = receipts.field_digests(forged["receipt"])["outcome"]
    result = receipts.verify(forged)
    assert not result.ok
    assert result.altered == ("signature",)
    assert "signature block" in result.message


def test_a_receipt_from_another_key_is_told_apart(finished):
    envelope = receipts.issue(finished).envelope
    with override_settings(SECRET_KEY="another server's secret key, not this one", SECRET_KEY_FALLBACKS=[]):
        result = receipts.verify(envelope)
    assert not result.ok and "not signed by this server's key" in result.message


def test_a_rotated_key_still_verifies_through_the_fallbacks(finished, settings):
    envelope = receipts.issue(finished).envelope
    old = settings.SECRET_KEY
    with override_settings(SECRET_KEY="the new secret key after rotation", SECRET_KEY_FALLBACKS=[old]):
        assert receipts.verify(envelope).ok


def test_the_key_is_derived_for_receipts_only(settings):
    from instances import credentials

    key = receipts.signing_key()
    assert key != settings.SECRET_KEY.encode() and len(key) == 32
    assert key not in credentials.encrypt("x").encode()


def test_verify_file(finished, tmp_path):
    envelope = receipts.issue(finished).envelope
    good = tmp_path / "receipt.json"
    good.write_text(json.dumps(envelope))
    ok, message = receipts.verify_file(good)
    assert ok, message

    bad = tmp_path / "altered.json"
    bad.write_text(json.dumps(tamper(envelope, "iterations[0].cost_usd", "0.000000")))
    ok, message = receipts.verify_file(bad)
    assert not ok and "iterations[0].cost_usd" in message

    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    assert receipts.verify_file(junk)[0] is False
    assert "not JSON" in receipts.verify_file(junk)[1]
    assert "cannot read" in receipts.verify_file(tmp_path / "missing.json")[1]
    not_receipt = tmp_path / "other.json"
    not_receipt.write_text("[1, 2]")
    assert "not a Tether receipt" in receipts.verify_file(not_receipt)[1]


def test_the_api_returns_the_receipt_to_its_owner_only(finished, client, other_user, user):
    url = f"/v1/instances/{finished.instance_id}/loop/{finished.pk}/receipt"
    client.force_login(other_user)
    assert client.get(url).status_code == 404
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200
    envelope = response.json()
    assert envelope["receipt"]["run"] == finished.pk
    assert receipts.verify(envelope).ok
    assert Receipt.objects.filter(run=finished).exists()


def test_the_api_refuses_a_live_run(user, make_instance, start, client):
    run = start(make_instance(user))
    client.force_login(user)
    response = client.get(f"/v1/instances/{run.instance_id}/loop/{run.pk}/receipt")
    assert response.status_code == 409
    assert "has not finished" in response.json()["error"]


def test_the_receipt_carries_the_review_verdict_once_given(finished, user):
    from reviews import services
    from reviews.models import ReviewItem

    # The loop may already have sampled this verified done for review.
    item, _ = ReviewItem.objects.get_or_create(run=finished, defaults={"reason": ReviewItem.Reason.SAMPLED})
    services.review_decide(item=item, user=user, verdict="accept", note="looked at the diff")
    envelope = Receipt.objects.get(run=finished).envelope
    assert envelope["receipt"]["review"]["verdict"] == "accepted"
    assert envelope["receipt"]["review"]["note"] == "looked at the diff"
    assert envelope["receipt"]["review"]["by"] == user.get_username()
    assert receipts.verify(envelope).ok
    assert receipts.verify(tamper(envelope, "review.verdict", "rejected")).altered == ("review.verdict",)


def test_the_cli_verifies_a_receipt_file_and_names_what_was_altered(finished, tmp_path):
    import subprocess
    import sys

    from django.conf import settings

    envelope = receipts.issue(finished).envelope
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(envelope))
    bad.write_text(json.dumps(tamper(envelope, "outcome_detail", "all good, trust me")))
    env = {"PATH": "/usr/bin:/bin", "TETHER_HOME": str(settings.TETHER_HOME), "TETHER_SECRET_KEY": settings.SECRET_KEY}

    def cli(path):
        return subprocess.run(
            [sys.executable, "manage.py", "loop", "verify-receipt", str(path)],
            cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=60,
        )

    ok = cli(good)
    assert ok.returncode == 0, ok.stderr
    assert "authentic" in ok.stdout
    altered = cli(bad)
    assert altered.returncode == 1
    assert "changed: outcome_detail" in altered.stderr
