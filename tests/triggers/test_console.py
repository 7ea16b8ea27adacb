"""The console's triggers page: make one (secret shown once), pause, rotate, delete; others get 404."""

import pytest

from audit.models import AuditEntry
from triggers.models import Trigger

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client, user):
    client.force_login(user)
    return client


FORM = {
    "name": "issues",
    "objective_template": "Triage #{issue.number}",
    "events": "issues",
    "actions": "opened, reopened",
    "max_per_minute": "10",
}


def test_make_a_trigger_and_see_its_secret_once(signed_in, instance, deliver):
    made = signed_in.post(f"/instances/{instance.pk}/triggers/", FORM, follow=True)
    assert made.redirect_chain == [(f"/instances/{instance.pk}/triggers/", 303)]
    trigger = Trigger.objects.get()
    assert (trigger.events, trigger.actions, trigger.max_per_minute) == (
        ["issues"],
        ["opened", "reopened"],
        10,
    )
    page = made.content.decode()
    secret = trigger.reveal()
    assert secret in page and "data-new-secret" in page and f"/v1/hooks/{trigger.pk}" in page
    assert made["Cache-Control"] == "no-store"
    again = signed_in.get(f"/instances/{instance.pk}/triggers/").content.decode()
    assert secret not in again and "data-new-secret" not in again
    assert deliver(trigger, secret=secret).status_code == 201
    shown = signed_in.get(f"/instances/{instance.pk}/triggers/").content.decode()
    assert 'data-outcome="started"' in shown and secret not in shown
    assert AuditEntry.objects.get(action="trigger.create").via == "console"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("objective_template", "{__class__}", "are not looked up"),
        ("objective_template", "{x:>9}", "format specifications"),
        ("max_per_minute", "100000", "at most 600"),
        ("name", "", "required"),
    ],
)
def test_a_bad_trigger_is_refused_with_a_clear_message(signed_in, instance, field, value, says):
    answer = signed_in.post(f"/instances/{instance.pk}/triggers/", {**FORM, field: value})
    assert answer.status_code == 400
    assert says in answer.content.decode()
    assert not Trigger.objects.exists()


def test_pause_rotate_and_delete_from_the_page(signed_in, user, made, deliver):
    trigger, old = made
    signed_in.post(f"/triggers/{trigger.pk}/pause", {"active": "0"})
    trigger.refresh_from_db()
    assert not trigger.active
    signed_in.post(f"/triggers/{trigger.pk}/pause", {"active": "1"})
    rotated = signed_in.post(f"/triggers/{trigger.pk}/rotate", follow=True)
    trigger.refresh_from_db()
    new = trigger.reveal()
    assert new != old and new in rotated.content.decode()
    assert deliver(trigger, secret=old).status_code == 401
    signed_in.post(f"/triggers/{trigger.pk}/delete")
    assert not Trigger.objects.exists()
    actions = list(
        AuditEntry.objects.filter(action__startswith="trigger.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == [
        "trigger.create",
        "trigger.pause",
        "trigger.resume",
        "trigger.rotate",
        "trigger.delete",
    ]


def test_another_user_gets_404_everywhere(client, other_user, instance, made):
    trigger, secret = made
    client.force_login(other_user)
    assert client.get(f"/instances/{instance.pk}/triggers/").status_code == 404
    assert client.post(f"/instances/{instance.pk}/triggers/", FORM).status_code == 404
    for action in ("rotate", "pause", "delete"):
        answer = client.post(f"/triggers/{trigger.pk}/{action}")
        assert answer.status_code == 404 and secret not in answer.content.decode()
    trigger.refresh_from_db()
    assert trigger.active and trigger.reveal() == secret and Trigger.objects.count() == 1


def test_the_instance_page_links_to_its_triggers(signed_in, instance):
    assert (
        f"/instances/{instance.pk}/triggers/" in signed_in.get(f"/instances/{instance.pk}/").content.decode()
    )


def test_the_admin_never_shows_the_secret(client, django_user_model, made):
    trigger, secret = made
    root = django_user_model.objects.create_superuser("root", email="")
    client.force_login(root)
    for path in (
        "/admin/triggers/trigger/",
        f"/admin/triggers/trigger/{trigger.pk}/change/",
        "/admin/triggers/delivery/",
    ):
        page = client.get(path)
        assert page.status_code == 200, path
        assert secret not in page.content.decode() and trigger.secret_encrypted not in page.content.decode()


def test_pausing_a_trigger_in_the_admin_is_audited_without_its_secret(client, django_user_model, made):
    from audit.models import AuditEntry

    trigger, secret = made
    root = django_user_model.objects.create_superuser("root", email="")
    client.force_login(root)
    inline = {"deliveries-TOTAL_FORMS": "0", "deliveries-INITIAL_FORMS": "0", "deliveries-MAX_NUM_FORMS": "0"}
    page = client.post(f"/admin/triggers/trigger/{trigger.pk}/change/", inline)  # `active` unticked
    assert page.status_code == 302, page.content.decode()[-2000:]
    entry = AuditEntry.objects.get(action="trigger.change", via="admin")
    assert entry.user == root and entry.detail["before"] == {"active": True}
    assert entry.detail["after"] == {"active": False}
    assert secret not in str(entry.detail) and trigger.secret_encrypted not in str(entry.detail)
