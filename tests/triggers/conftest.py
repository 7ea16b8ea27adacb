"""Builders for trigger tests: a trigger on a command instance, and signed GitHub-shaped deliveries."""

import json
import uuid

import pytest

from triggers.signatures import sign

ISSUE_OPENED = {
    "action": "opened",
    "issue": {
        "number": 1347,
        "title": "Found a bug",
        "body": "I'm having a problem with this.",
        "user": {"login": "octocat"},
        "labels": [{"name": "bug"}],
    },
    "repository": {"full_name": "octocat/Hello-World"},
    "sender": {"login": "octocat"},
}
TEMPLATE = "Triage issue #{issue.number} in {repository.full_name}: {issue.title}\n\n{issue.body}"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def instance(user, make_instance):
    return make_instance(user, name="triage", objective_max_chars=2000)


@pytest.fixture
def made(user, instance):
    """A trigger on `instance` and its secret."""
    from triggers import services

    return services.trigger_create(user=user, instance=instance, name="issues", objective_template=TEMPLATE)


@pytest.fixture
def deliver(client):
    """POST a delivery to a trigger's hook, signed with `secret` unless told otherwise."""

    def post(
        trigger,
        body=ISSUE_OPENED,
        *,
        secret=None,
        signature=None,
        delivery=None,
        event="issues",
        content_type="application/json",
        header="X-Hub-Signature-256",
        raw=None,
    ):
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4())}
        if delivery == "":
            del headers["X-GitHub-Delivery"]
        if signature is None and secret is not None:
            signature = sign(secret, data)
        if signature is not None:
            headers[header] = signature
        return client.generic(
            "POST", f"/v1/hooks/{trigger.pk}", data, content_type=content_type, headers=headers
        )

    return post
